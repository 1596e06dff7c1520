"""AMQP 1.0 door to the event log (OASIS AMQP event streams extensions).

``sasl`` (our SASL server frames) and ``codec`` (messages, offsets, filters) have no I/O;
``connection`` drives proton's sans-I/O engine from asyncio; ``node`` serves the links;
``listener`` accepts connections. Only ``config`` imports without proton installed.
"""

from .config import AmqpConfig, AmqpLimits, NodeLimits

__all__ = ["AmqpConfig", "AmqpLimits", "NodeLimits"]
