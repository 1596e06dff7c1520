"""Counters the hot paths keep in plain Python objects, read only when metrics are scraped.

Every door, the store and the services may import this module; it knows none of them. A
counter here is an int or a dict entry (no lock, no label lookup, no library call per event);
the server's metrics collector turns them into Prometheus families at scrape time.

Labels stay bounded: a door is one of :data:`DOORS`, a refusal reason one of
:data:`REFUSAL_REASONS`, a function one its iface defines (others count under
:data:`UNKNOWN`), an outcome ``ok`` or an error name the iface declares (or an HTTP status).
"""

from __future__ import annotations

import contextvars
from bisect import bisect_left
from typing import Final

#: A partition as metric labels: (stream, partition number). Every stream's partitions are
#: labelled so; these are the default partition's, which every process serves.
STREAMS: Final = (("events", "0"),)
DEFAULT_STREAM: Final = STREAMS[0]

#: The doors, as the ``door`` label. A connection counts under one: a WebSocket connection
#: holding notification subscriptions under ``notify``, an HTTP connection under the door its
#: last request went to. Calls of event notification carry its iface, whatever the door.
DOORS: Final = ("websocket", "feed", "dcb", "amqp", "kafka", "notify", "console")
#: A function, iface or outcome that is not one the server defines.
UNKNOWN: Final = "unknown"

#: Why a connection, handshake or login was refused.
BAD_CREDENTIALS: Final = "bad_credentials"
TOO_MANY_CHECKS: Final = "too_many_credential_checks"
TOO_MANY_CONNECTIONS: Final = "too_many_connections"
HANDSHAKE_EVICTED: Final = "handshake_evicted"
INSECURE_CHANNEL: Final = "insecure_channel"
REFUSAL_REASONS: Final = (
    BAD_CREDENTIALS,
    TOO_MANY_CHECKS,
    TOO_MANY_CONNECTIONS,
    HANDSHAKE_EVICTED,
    INSECURE_CHANNEL,
)

# (a Final tuple's type is spelled out: compiled, an inferred one is read before it is set)
#: Upper bounds (seconds) of the latency buckets of calls and commits.
SECONDS_BUCKETS: Final[tuple[float, ...]] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: Upper bounds of the group-commit batch sizes (writes per transaction).
BATCH_BUCKETS: Final[tuple[float, ...]] = (
    1.0,
    2.0,
    4.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
)

#: (door, peer, user) of the connection being served, for log lines (None: none).
CONNECTION: contextvars.ContextVar[tuple[str, str, str | None] | None] = contextvars.ContextVar(
    "futoin_evt_connection", default=None
)


def current_door() -> str:
    """The door of the connection being served, or :data:`UNKNOWN`."""
    connection = CONNECTION.get()
    return connection[0] if connection is not None else UNKNOWN


class Histogram:
    """Fixed buckets: ``counts[i]`` observations at most ``bounds[i]`` (the last: above all)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = SECONDS_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: ``(le, observations <= le)``, ending with ``+Inf``."""
        total = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            total += count
            buckets.append((bound, float(total)))
        return buckets


class Calls:
    """Calls of one door: a latency histogram per (iface, function, outcome)."""

    __slots__ = ("by_key", "door")

    def __init__(self, door: str) -> None:
        self.door = door
        self.by_key: dict[tuple[str, str, str], Histogram] = {}

    def observe(self, iface: str, function: str, outcome: str, seconds: float) -> None:
        key = (iface, function, outcome)
        histogram = self.by_key.get(key)
        if histogram is None:
            histogram = self.by_key[key] = Histogram()
        histogram.observe(seconds)


class Refusals:
    """Refused connections, handshakes and logins by (door, reason)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def note(self, door: str, reason: str) -> None:
        key = (door, reason)
        self.counts[key] = self.counts.get(key, 0) + 1


class WriteStats:
    """The store's write path: what group commit did."""

    __slots__ = ("appended", "appended_bytes", "batch_sizes", "commit_seconds")

    def __init__(self) -> None:
        #: Events appended per (stream, partition) since the start, and their stored JSON size
        #: (a partition appears with its first append; the default one is always there).
        self.appended: dict[tuple[str, str], int] = dict.fromkeys(STREAMS, 0)
        self.appended_bytes: dict[tuple[str, str], int] = dict.fromkeys(STREAMS, 0)
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        self.commit_seconds = Histogram()

    def committed(self, writes: int, seconds: float) -> None:
        """One group commit of ``writes`` queued writes."""
        self.batch_sizes.observe(writes)
        self.commit_seconds.observe(seconds)

    def appended_to(self, partition: tuple[str, str], events: int, size: int) -> None:
        """``events`` of ``size`` bytes committed to ``partition`` (its labels)."""
        self.appended[partition] = self.appended.get(partition, 0) + events
        self.appended_bytes[partition] = self.appended_bytes.get(partition, 0) + size


class DamageStats:
    """Damaged events read (their stored content no longer matches their checksum): each
    counted once per process, however often it is read."""

    __slots__ = ("_seen", "counts")

    def __init__(self) -> None:
        self._seen: set[tuple[int, int]] = set()
        #: Distinct damaged events found per (stream, partition).
        self.counts: dict[tuple[str, str], int] = {}

    def note(self, key: int, event_id: int, partition: tuple[str, str]) -> bool:
        """Event ``event_id`` of the partition of store key ``key`` (labelled ``partition``)
        is damaged; True when this process had not found it before."""
        if (key, event_id) in self._seen:
            return False
        self._seen.add((key, event_id))
        self.counts[partition] = self.counts.get(partition, 0) + 1
        return True
