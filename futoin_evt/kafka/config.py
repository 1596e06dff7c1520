"""Settings of the Kafka door (importable without kafka-python)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Final

from ..slots import GroupShare

DEFAULT_PORT: Final = 9092


@dataclass(frozen=True, slots=True)
class KafkaLimits:
    #: Connections with a user at once; more are refused (the SASL login fails).
    max_connections: int = 10_000
    #: Connections without a user yet; when all are taken the oldest is closed for a new
    #: one. None: a quarter of max_connections (at least 8).
    max_handshakes: int | None = None
    #: A request larger than this closes the connection (Kafka's socket.request.max.bytes).
    max_request_bytes: int = 100 * 1024 * 1024
    #: Seconds a connection has to log in, and a logged-in one may stay silent.
    login_timeout: float = 30.0
    idle_timeout: float = 600.0
    #: Requests of one connection in progress at once; its further input waits.
    max_in_flight: int = 32
    #: A client that leaves more than this unread gets nothing more until it reads.
    max_unread_bytes: int = 8 * 1024 * 1024
    #: What one Fetch answers at most, whatever the client asks.
    max_fetch_bytes: int = 50 * 1024 * 1024
    #: Records of one Produce request at most, and their size once decompressed.
    max_records: int = 1_000_000
    max_batch_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: The address clients are told to connect to (Metadata's broker), when not the one
    #: listened on: ``(host, port)``.
    advertise: tuple[str, int] | None = None
    #: SASL_SSL: TLS with this context.
    tls: ssl.SSLContext | None = None
    limits: KafkaLimits = field(default_factory=KafkaLimits)
    #: Share the port with the other workers of a group (SO_REUSEPORT).
    reuse_port: bool = False
    #: This worker's place in the group whose limits these are (``serve --workers``).
    group: GroupShare | None = None
    #: The server's SAS secret, which the keys of Event Hubs connection strings derive from
    #: (the user ``$ConnectionString``); None: such logins fail.
    sas_secret: bytes | None = None
