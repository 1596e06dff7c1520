"""``serve --metrics HOST:PORT``: Prometheus metrics, liveness and readiness on a plain HTTP port.

``GET /metrics`` is the Prometheus text format, written by ``prometheus-client`` from a
registry of the server's own (never the global one: several servers may share a process).
The hot paths only bump plain counters (:mod:`futoin_evt.stats`); :class:`ServerCollector`
reads them at scrape time. What needs the store (consumers, the oldest id kept) comes from one
bounded read through :class:`~futoin_evt.log.figures.StoreFigures`, shared by the scrapes of
:attr:`MetricsListener.cache_seconds`: per partition of the registry (at most
:data:`MAX_PARTITIONS`) its newest and oldest ids in one query, then one count of the
consumers by partition, then the lags of the partitions that have consumers, in registry
order, until ``--metrics-consumers`` are read.

``GET /healthz`` is 200 while the process serves; ``GET /readyz`` is 200 when the store answers
a trivial read within :data:`READY_TIMEOUT` seconds and every listener accepts connections,
else 503 with the reason in one line. Anything else is 404.

With ``serve --metrics-user USER``, ``GET /metrics`` asks for that user's password (HTTP
Basic, checked by the server's :class:`~futoin_evt.auth.users.Authenticator`, so a verified
password is remembered as an FTN3 login's is and checks are limited per address): 401 with
a ``WWW-Authenticate`` challenge without credentials, with wrong ones, or with another
user's. The probes stay open. A refused scrape counts under door ``metrics``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ..domain.partition import Partition
from ..domain.principal import NotAuthenticated
from ..slots import Slots
from ..stats import (
    BAD_CREDENTIALS,
    CONNECTION,
    DEFAULT_STREAM,
    DOORS,
    HANDSHAKE_EVICTED,
    REFUSAL_REASONS,
    TOO_MANY_CONNECTIONS,
    Calls,
    Histogram,
)

if TYPE_CHECKING:
    from ..amqp.listener import AmqpListener
    from ..auth.users import Authenticator
    from ..domain.management import ManagementBus
    from ..ftn18.notify import NotifyService
    from ..ftn18.push import PushService
    from ..kafka.listener import KafkaListener
    from ..log.archive import InProcessArchiver
    from ..log.figures import ConsumerRow, StoreFigures
    from ..log.retention import Discarder
    from ..log.streams import StreamRegistry
    from .executor import Executor
    from .http import HttpEndpoint
    from .websocket import WebSocketTransport

logger = logging.getLogger(__name__)

#: /readyz: the store answers within this many seconds, or the server is not ready.
READY_TIMEOUT: Final = 2.0
#: Scrapes within this many seconds share one read of the store.
DEFAULT_CACHE_SECONDS: Final = 1.0
#: A request head larger than this, or slower than the timeout, is dropped.
MAX_REQUEST_BYTES: Final = 8192
REQUEST_TIMEOUT: Final = 10.0
#: Connections served at once; more are closed at once.
MAX_CONNECTIONS: Final = 32
#: Partitions reported per scrape at most (in registry order; each costs one indexed query).
MAX_PARTITIONS: Final = 1000
#: The metrics port as the door label of its refused scrapes.
METRICS_DOOR: Final = "metrics"
#: What the 401 challenge names.
REALM: Final = "futoin-evt metrics"

STREAM_LABELS: Final = ("stream", "partition")
CONSUMER_LABELS: Final = ("user", "component", "stream", "partition")
CALL_LABELS: Final = ("door", "iface", "function", "outcome")


class ServerFigures(Protocol):
    """What the metrics read of the server (:class:`futoin_evt.server.app.EventServer`)."""

    figures: StoreFigures
    streams: StreamRegistry
    push: PushService
    notify: NotifyService
    discarder: Discarder
    archiver: InProcessArchiver | None
    authenticator: Authenticator
    executor: Executor
    http_endpoints: list[HttpEndpoint]
    amqp: AmqpListener | None
    kafka: KafkaListener | None
    notices: ManagementBus

    @property
    def transport(self) -> WebSocketTransport: ...


class StoreSnapshot:
    """What the metrics read from the store: each partition's newest and oldest ids, at most
    ``limit`` consumers with their partitions, the count of the rest. One read at a time;
    reused for ``cache_seconds``."""

    def __init__(self, server: ServerFigures, limit: int, cache_seconds: float) -> None:
        self._server = server
        self.limit = limit
        self.cache_seconds = cache_seconds
        #: (partition, consumer) for the first ``limit`` consumers.
        self.consumers: list[tuple[Partition, ConsumerRow]] = []
        self.registered = 0
        #: (newest id, oldest id) of each partition read.
        self.extents: dict[Partition, tuple[int, int]] = {}
        #: How long the last read took (seconds).
        self.read_seconds = 0.0
        self._read: asyncio.Future[None] | None = None
        self._read_at = -1e9

    async def refresh(self) -> None:
        """Read the store again unless a read is under way or fresh enough."""
        now = time.monotonic()
        if self._read is None or (self._read.done() and now - self._read_at >= self.cache_seconds):
            self._read_at = now
            self._read = asyncio.ensure_future(self._load())
        await asyncio.shield(self._read)

    async def _load(self) -> None:
        """Read; when the store fails, keep what was read last (the rest of /metrics is worth
        serving while the database is away) and say so in the log."""
        try:
            await self._read_store()
        except Exception as exc:
            logger.warning("metrics: the store could not be read: %s", exc or type(exc).__name__)

    async def _read_store(self) -> None:
        figures = self._server.figures
        started = time.perf_counter()
        partitions = [p for info in self._server.streams for p in info.partitions]
        extents = {}
        for partition in partitions[:MAX_PARTITIONS]:
            limits = await figures.discard_limits(partition)
            extents[partition] = (limits.newest_id, limits.oldest_id)
        counts = await figures.consumer_counts()
        rows: list[tuple[Partition, ConsumerRow]] = []
        for partition in partitions:
            if len(rows) >= self.limit:
                break
            if counts.get(partition.key):
                read = await figures.consumer_lags(partition, self.limit - len(rows))
                rows.extend((partition, row) for row in read)
        self.consumers, self.registered, self.extents = rows, sum(counts.values()), extents
        self.read_seconds = time.perf_counter() - started


class ServerCollector(Collector):
    """The server's families, from its counters and the last :class:`StoreSnapshot`."""

    def __init__(self, server: ServerFigures, snapshot: StoreSnapshot) -> None:
        self._server = server
        self._snapshot = snapshot

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to check at registration: the names are this module's

    def collect(self) -> Iterator[Metric]:
        yield from self._streams()
        yield from self._consumers()
        yield from self._doors()
        yield from self._write_path()

    def _streams(self) -> Iterator[Metric]:
        figures = self._server.figures
        stats = figures.write_stats
        appended = CounterMetricFamily(
            "futoin_evt_events_appended",
            "Events appended since the process started (every door).",
            labels=STREAM_LABELS,
        )
        size = CounterMetricFamily(
            "futoin_evt_events_appended_bytes",
            "Bytes of the events appended since the process started, as stored (FTN18 JSON).",
            labels=STREAM_LABELS,
        )
        head = GaugeMetricFamily(
            "futoin_evt_stream_head_id", "The newest event id.", labels=STREAM_LABELS
        )
        oldest = GaugeMetricFamily(
            "futoin_evt_stream_oldest_id",
            "The oldest event id kept (0: the stream is empty).",
            labels=STREAM_LABELS,
        )
        for partition, (newest, oldest_id) in list(self._snapshot.extents.items()):
            key = (partition.stream, str(partition.number))
            labels = list(key)
            appended.add_metric(labels, stats.appended.get(key, 0))
            size.add_metric(labels, stats.appended_bytes.get(key, 0))
            known = figures.known_head(partition)  # newer than the read, maybe
            head.add_metric(labels, max(newest, known))
            oldest.add_metric(labels, oldest_id)
        yield from (appended, size, head, oldest)

    def _consumers(self) -> Iterator[Metric]:
        snapshot = self._snapshot
        position = GaugeMetricFamily(
            "futoin_evt_consumer_position",
            "The id of the last event the consumer acknowledged.",
            labels=CONSUMER_LABELS,
        )
        lag = GaugeMetricFamily(
            "futoin_evt_consumer_lag_events",
            "Events kept after the consumer's position.",
            labels=CONSUMER_LABELS,
        )
        age = GaugeMetricFamily(
            "futoin_evt_consumer_oldest_unread_age_seconds",
            "Age of the oldest event the consumer has not acknowledged (0: none).",
            labels=CONSUMER_LABELS,
        )
        in_flight = GaugeMetricFamily(
            "futoin_evt_consumer_push_groups_in_flight",
            "Pushed groups of events not acknowledged yet (push consumers connected here).",
            labels=CONSUMER_LABELS,
        )
        retries = CounterMetricFamily(
            "futoin_evt_consumer_push_retries",
            "Pushed groups that failed and were sent again, on the current push connection.",
            labels=CONSUMER_LABELS,
        )
        streams = {s.key: s for s in self._server.push.all_streams if s.reliable}
        now = time.time()
        for partition, row in snapshot.consumers:
            labels = [row.user, row.component, partition.stream, str(partition.number)]
            position.add_metric(labels, row.position)
            lag.add_metric(labels, row.behind)
            age.add_metric(labels, _age(row.oldest_unread_ts, now))
            push = streams.get((partition.key, row.user_id, row.component))
            in_flight.add_metric(labels, push.in_flight if push is not None else 0)
            retries.add_metric(labels, push.stats.groups_failed if push is not None else 0)
        yield from (position, lag, age, in_flight, retries)
        yield GaugeMetricFamily(
            "futoin_evt_consumers_registered",
            "Registered consumers.",
            value=snapshot.registered,
        )
        yield GaugeMetricFamily(
            "futoin_evt_consumers_left_out",
            "Registered consumers not reported per consumer (past the limit of the scrape).",
            value=max(snapshot.registered - len(snapshot.consumers), 0),
        )
        yield GaugeMetricFamily(
            "futoin_evt_consumers_read_seconds",
            "How long the last read of the consumers from the store took.",
            value=snapshot.read_seconds,
        )

    def _doors(self) -> Iterator[Metric]:
        server = self._server
        connections = GaugeMetricFamily(
            "futoin_evt_door_connections",
            "Connections past their login, each under one door: an HTTP connection under the "
            "door of its last request, a WebSocket connection holding notification "
            "subscriptions under notify.",
            labels=("door",),
        )
        handshakes = GaugeMetricFamily(
            "futoin_evt_door_handshakes",
            "Connections still in their handshake or login, per listening port (door "
            "websocket: the port of the WebSocket, HTTP feed, DCB and console doors).",
            labels=("door",),
        )
        refusals: dict[tuple[str, str], int] = dict.fromkeys(
            ((door, reason) for door in DOORS for reason in REFUSAL_REASONS), 0
        )
        for key, count in list(server.authenticator.refusals.counts.items()):
            refusals[key] = refusals.get(key, 0) + count
        ports: list[tuple[str, Slots[Any]]] = [("websocket", server.transport.slots)]
        if server.amqp is not None:
            ports.append(("amqp", server.amqp.slots))
        if server.kafka is not None:
            ports.append(("kafka", server.kafka.slots))
        for door, count in _connections_by_door(server).items():
            connections.add_metric([door], count)
        for door, slots in ports:
            handshakes.add_metric([door], slots.handshakes)
            refusals[(door, TOO_MANY_CONNECTIONS)] += slots.refused
            refusals[(door, HANDSHAKE_EVICTED)] += slots.evicted
        refused = CounterMetricFamily(
            "futoin_evt_door_refusals",
            "Connections, handshakes and logins refused, by door and reason.",
            labels=("door", "reason"),
        )
        for (door, reason), count in sorted(refusals.items()):
            refused.add_metric([door, reason], count)
        yield from (connections, handshakes, refused)
        calls = [server.executor.calls, *(e.calls for e in server.http_endpoints)]
        if server.amqp is not None:
            calls.append(server.amqp.node.calls)
        yield from _calls(calls)

    def _write_path(self) -> Iterator[Metric]:
        server = self._server
        stats = server.figures.write_stats
        yield _histogram(
            "futoin_evt_commit_batch_writes",
            "Writes (appends and others) committed together in one group commit.",
            stats.batch_sizes,
        )
        yield _histogram(
            "futoin_evt_commit_duration_seconds",
            "Time of one group commit, from the writer's start to the commit's end.",
            stats.commit_seconds,
        )
        pool = server.figures.pool_usage()
        if pool is not None:
            in_use, waiting = pool
            yield GaugeMetricFamily(
                "futoin_evt_pg_pool_connections_in_use",
                "PostgreSQL pooled connections in use (PostgreSQL only).",
                value=in_use,
            )
            yield GaugeMetricFamily(
                "futoin_evt_pg_pool_requests_waiting",
                "Calls waiting for a pooled PostgreSQL connection (PostgreSQL only).",
                value=waiting,
            )
        discarded = CounterMetricFamily(
            "futoin_evt_events_discarded",
            "Events discarded by retention since the process started.",
            labels=STREAM_LABELS,
        )
        by_partition = {(p.stream, str(p.number)): n for p, n in server.discarder.discarded.items()}
        for labels, count in {DEFAULT_STREAM: 0, **by_partition}.items():
            discarded.add_metric(list(labels), count)
        archived = CounterMetricFamily(
            "futoin_evt_events_archived",
            "Events copied to the --archive file since the process started.",
            labels=STREAM_LABELS,
        )
        archiver = server.archiver
        archived.add_metric(list(DEFAULT_STREAM), archiver.archived_total if archiver else 0)
        published = CounterMetricFamily(
            "futoin_evt_management_events",
            "Management events published, by type.",
            labels=("type",),
        )
        for event_type, count in sorted(dict(server.notices.published).items()):
            published.add_metric([event_type], count)
        damaged = CounterMetricFamily(
            "futoin_evt_damaged_events",
            "Events read that did not match their checksum (never served), each counted once"
            " since the process started.",
            labels=STREAM_LABELS,
        )
        for labels, count in {DEFAULT_STREAM: 0, **server.figures.damage_stats.counts}.items():
            damaged.add_metric(list(labels), count)
        yield from (discarded, archived, published, damaged)


def _connections_by_door(server: ServerFigures) -> dict[str, int]:
    """Established connections by door (one pass over the WebSocket port's connections)."""
    counts = dict.fromkeys(DOORS, 0)
    for io in server.transport.slots.established_sockets():
        counts[io.door] = counts.get(io.door, 0) + 1
    notify = min(server.notify.connections, counts["websocket"])
    counts["websocket"] -= notify
    counts["notify"] += notify
    counts["amqp"] = server.amqp.slots.established if server.amqp is not None else 0
    counts["kafka"] = server.kafka.slots.established if server.kafka is not None else 0
    return counts


def _calls(sources: list[Calls]) -> Iterator[Metric]:
    total = CounterMetricFamily(
        "futoin_evt_calls",
        "Calls by door, iface, function and outcome (ok, the FTN3 error, or the HTTP status; "
        "a function or iface the server does not define counts as unknown).",
        labels=CALL_LABELS,
    )
    seconds = HistogramMetricFamily(
        "futoin_evt_call_duration_seconds",
        "Time from a call's arrival to its reply.",
        labels=CALL_LABELS,
    )
    for calls in sources:
        for (iface, function, outcome), histogram in list(calls.by_key.items()):
            labels = [calls.door, iface, function, outcome]
            buckets = histogram.cumulative()
            total.add_metric(labels, buckets[-1][1])
            seconds.add_metric(labels, buckets, histogram.sum)
    yield from (total, seconds)


def _histogram(name: str, documentation: str, histogram: Histogram) -> Metric:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], histogram.cumulative(), histogram.sum)
    return family


def _age(ts: str | None, now: float) -> float:
    if ts is None:
        return 0.0
    return max(now - datetime.fromisoformat(ts).timestamp(), 0.0)


class MetricsListener:
    """The plain HTTP port of ``--metrics``."""

    def __init__(
        self,
        server: ServerFigures,
        host: str,
        port: int,
        *,
        consumer_limit: int = 1000,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        reuse_port: bool = False,
        user: str | None = None,
    ) -> None:
        """``user``: the only user whose password opens ``/metrics`` (None: no credentials
        asked)."""
        self._eventserver = server
        self.user = user
        self._reuse_port = reuse_port
        self.host = host
        self._port = port
        self.snapshot = StoreSnapshot(server, consumer_limit, cache_seconds)
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(ServerCollector(server, self.snapshot))
        self._server: asyncio.Server | None = None
        self._connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self._port,
            limit=MAX_REQUEST_BYTES,
            reuse_port=self._reuse_port or None,
        )

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.is_serving()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def scrape(self) -> bytes:
        """The text of ``GET /metrics``, written in a thread: the event loop goes on serving
        (the collector copies what it reads from the loop's objects in single C calls)."""
        await self.snapshot.refresh()
        return await asyncio.to_thread(generate_latest, self.registry)

    async def readiness(self) -> str | None:
        """None when ready, else why not (one line)."""
        server = self._eventserver
        if not server.transport.serving:
            return "the WebSocket port is not serving"
        if server.amqp is not None and not server.amqp.serving:
            return "the AMQP listener is not serving"
        if server.kafka is not None and not server.kafka.serving:
            return "the Kafka listener is not serving"
        try:
            await asyncio.wait_for(server.figures.probe(), READY_TIMEOUT)
        except TimeoutError:
            return f"the store did not answer within {READY_TIMEOUT:g} s"
        except Exception as exc:
            return f"the store does not answer: {exc or type(exc).__name__}"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections <= MAX_CONNECTIONS:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
                peer = writer.get_extra_info("peername")
                host = str(peer[0]) if isinstance(peer, tuple) else ""
                writer.write(await self._respond(head, host))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        except Exception:
            logger.exception("metrics request failed")
            writer.write(_response(500, b"Internal error.\n"))
        finally:
            self._connections -= 1
            writer.close()

    async def _respond(self, head: bytes, peer: str = "") -> bytes:
        words = head.split(b"\r\n", 1)[0].split(b" ")
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return _response(400, b"Bad request.\n")
        method, target = words[0], words[1].split(b"?", 1)[0]
        if target not in (b"/metrics", b"/healthz", b"/readyz"):
            return _response(404, b"Not found: /metrics, /healthz and /readyz are.\n")
        if method != b"GET":
            return _response(405, b"GET only.\n", [("Allow", "GET")])
        if target == b"/healthz":
            return _response(200, b"ok\n")
        if target == b"/readyz":
            reason = await self.readiness()
            if reason is not None:
                return _response(503, f"not ready: {reason}\n".encode())
            return _response(200, b"ready\n")
        if self.user is not None:
            refused = await self._refusal(head, peer)
            if refused is not None:
                challenge = ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
                return _response(401, f"{refused}\n".encode(), [challenge])
        return _response(200, await self.scrape(), [("Content-Type", CONTENT_TYPE_LATEST)])

    async def _refusal(self, head: bytes, peer: str) -> str | None:
        """None when the request carries :attr:`user`'s password, else why not (one
        sentence)."""
        encoded = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, encoded = value.strip().partition(b" ")
                if scheme.lower() != b"basic":
                    encoded = None
        if not encoded:
            return "Credentials required (HTTP Basic)."
        CONNECTION.set((METRICS_DOOR, peer, None))  # a refusal counts under this door
        try:
            credentials = base64.b64decode(encoded.strip(), validate=True).decode()
            principal = await self._eventserver.authenticator.authenticate(credentials, peer)
        except (binascii.Error, UnicodeDecodeError):
            return "Malformed Basic credentials."
        except NotAuthenticated as exc:
            return f"{exc}."
        if principal.name != self.user:  # told as a wrong password is: no names are probed
            self._eventserver.authenticator.refusals.note(METRICS_DOOR, BAD_CREDENTIALS)
            return "Invalid credentials."
        return None


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _response(status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}"]
    fields: dict[str, Any] = {"Content-Type": "text/plain; charset=utf-8"}
    fields.update(headers or [])
    fields["Content-Length"] = len(body)
    fields["Connection"] = "close"
    lines += [f"{name}: {value}" for name, value in fields.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
