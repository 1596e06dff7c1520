"""FTN3 protocol core: messages, iface definitions, type checks, errors and the call contract
between an executor and its handlers. No I/O."""

from .errors import FTN3Error, ProtocolViolation
from .ifaces import FuncSpec, IfaceRegistry, IfaceSpec, IfaceSpecError
from .messages import EncodedJson, Request, Response

__all__ = [
    "EncodedJson",
    "FTN3Error",
    "FuncSpec",
    "IfaceRegistry",
    "IfaceSpec",
    "IfaceSpecError",
    "ProtocolViolation",
    "Request",
    "Response",
]
