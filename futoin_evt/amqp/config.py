"""Settings of the AMQP listener (importable without the listener's modules)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Final

from ..auth.sas import DEFAULT_MAX_LIFETIME
from ..slots import GroupShare

DEFAULT_PORT: Final = 5672


@dataclass(frozen=True, slots=True)
class NodeLimits:
    #: Messages above this are refused (the link is detached, as AMQP asks).
    max_message_bytes: int = 1024 * 1024
    #: Credit a producer link holds, counting messages not yet durable.
    credit_window: int = 1000


DEFAULT_NODE_LIMITS: Final = NodeLimits()


@dataclass(frozen=True, slots=True)
class AmqpLimits:
    #: Connections with a user at once; more are refused (SASL ``sys-temp``, or status 503
    #: to a token put to ``$cbs``).
    max_connections: int = 10_000
    #: Connections without a user yet (protocol header, SASL, or ANONYMOUS awaiting a token),
    #: on top of those; when they are all taken, the oldest is closed for a new one. None: a
    #: quarter of max_connections (at least 8).
    max_handshakes: int | None = None
    #: A peer silent this long is disconnected (advertised in ``open``; also the login limit).
    idle_timeout: float = 60.0
    max_frame_bytes: int = 64 * 1024
    #: A peer that leaves more than this unread stops getting events until it reads.
    max_unread_bytes: int = 4 * 1024 * 1024
    #: Links open at once per connection; more are refused (amqp:resource-limit-exceeded).
    max_links: int = 256
    node: NodeLimits = field(default_factory=NodeLimits)


@dataclass(frozen=True, slots=True)
class AmqpConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: ``amqps``: TLS with this context.
    tls: ssl.SSLContext | None = None
    limits: AmqpLimits = field(default_factory=AmqpLimits)
    #: The secret users' SAS keys derive from (:mod:`futoin_evt.auth.sas`), for the tokens Event
    #: Hubs clients put to ``$cbs``; None: every token is refused.
    sas_secret: bytes | None = field(default=None, repr=False)
    #: Seconds from now a token's expiry may be at most (``serve --sas-max-lifetime``).
    sas_max_lifetime: float = DEFAULT_MAX_LIFETIME
    #: Share the port with the other workers of a group (SO_REUSEPORT).
    reuse_port: bool = False
    #: This worker's place in the group whose limits these are (``serve --workers``).
    group: GroupShare | None = None
