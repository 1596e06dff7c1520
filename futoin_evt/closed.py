"""The error of a closed WebSocket connection, in a module of its own: :mod:`.wsio` is compiled
with mypyc (setup.py), which compiles no subclass of a built-in exception but ``Exception``'s."""

from __future__ import annotations


class ConnectionClosedError(ConnectionError):
    """The WebSocket connection is closed (or closing): nothing more can be sent."""
