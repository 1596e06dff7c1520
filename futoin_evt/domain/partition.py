"""Streams and their partitions: names, limits and the handle passed everywhere.

A server holds named streams; a stream has partitions ``0..P-1``, each a log of its own (ids
from 1 in commit order, its own head, consumers, positions and retention). The log every
door serves today is :data:`DEFAULT_PARTITION`: the stream ``events``, partition 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ..quoting import quote_input
from .stream import STREAM_NAME_RULE

DEFAULT_STREAM: Final = "events"
MAX_PARTITIONS: Final = 1024
STREAM_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
#: Words the server's own paths use (HTTP feed, DCB, probes, metrics, the ops iface...): a
#: stream may not be named like them, so a path under a stream's name stays unambiguous.
RESERVED_STREAM_NAMES: Final = frozenset(
    {
        "feed",
        "feeds",
        "dcb",
        "metrics",
        "console",
        "schemas",
        "healthz",
        "readyz",
        "ops",
        "streams",
        "partitions",
        "consumers",
        "v1",
        "append",
        "read",
        "admin",
        "api",
        "ws",
        "amqp",
        "cbs",
    }
)


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a stream. ``key`` is the store's own id of it (never reused, also
    after a stream is dropped); ``events``/0 is key 0."""

    stream: str
    number: int
    key: int

    def __str__(self) -> str:
        return f"{self.stream}/{self.number}"


DEFAULT_PARTITION: Final = Partition(DEFAULT_STREAM, 0, 0)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    #: Partition ``n`` at index ``n``.
    partitions: tuple[Partition, ...]
    created_at: str
    #: The stream whose partitions this one aggregates (a later step); None for a plain one.
    aggregate_of: str | None = None


def check_stream_name(name: str) -> str:
    """``name`` when it may name a stream; ValueError (one sentence) otherwise."""
    if not isinstance(name, str) or STREAM_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid stream name {quote_input(name, 60)}: {STREAM_NAME_RULE}")
    if name in RESERVED_STREAM_NAMES:
        raise ValueError(f"the stream name {name} is reserved for the server's own paths")
    return name


def check_partition_count(count: int) -> int:
    """``count`` when a stream may have that many partitions; ValueError otherwise."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
        raise ValueError(f"a stream has 1 to {MAX_PARTITIONS} partitions, not {count}")
    return count
