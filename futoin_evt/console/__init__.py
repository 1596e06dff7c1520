"""The web console (``serve --console``): streams, consumers, a live tail, events and DCB
queries in a browser, rendered by the server (needs the ``console`` extra: Jinja2)."""
