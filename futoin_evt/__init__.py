"""futoin-evt: the FutoIn FTN18 event stream over FTN3 JSON messages on WebSocket."""

__version__ = "0.1.0"
