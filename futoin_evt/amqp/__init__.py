"""AMQP 1.0 door to the event log (OASIS AMQP event streams extensions).

``sasl`` (our SASL server frames) and ``codec`` (messages, offsets, filters) have no I/O;
``engine`` is the protocol itself (types, frames, connection, messages; no I/O, no server);
``connection`` drives it from asyncio; ``node`` serves the links; ``listener`` accepts
connections. ``config`` holds its settings, importable without the rest.
"""

from .config import AmqpConfig, AmqpLimits, NodeLimits

__all__ = ["AmqpConfig", "AmqpLimits", "NodeLimits"]
