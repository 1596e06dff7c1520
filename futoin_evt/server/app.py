"""The futoin-evt server: the store, the FTN18 services and the WebSocket transport together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from websockets.http11 import Request

from ..amqp import AmqpConfig
from ..auth.sas import SasVerifier
from ..auth.sasl_logins import ConnectionStringLogins, ScramLogins
from ..auth.users import Authenticator
from ..console.config import ConsoleConfig
from ..dcb.service import DcbService, stream_dcb_log
from ..domain.management import ManagementBus
from ..domain.stream import DEFAULT_DEDUP_WINDOW, PARAM_TYPE_RULES
from ..feed.service import FeedService
from ..ftn3.ifaces import IfaceRegistry
from ..ftn18.doors import PartitionDoors
from ..ftn18.grant_ops import GrantAdmin
from ..ftn18.notify import NotifyService
from ..ftn18.push import PushConfig, PushService
from ..kafka.config import KafkaConfig
from ..log.access import Access, AccessControl
from ..log.aggregate import AggregateConfig, Aggregator
from ..log.archive import InProcessArchiver
from ..log.checkpoints import HubCheckpoints
from ..log.connections import Connections
from ..log.consumers import ConsumerLifecycle
from ..log.deliveries import ConnectedDeliveries
from ..log.figures import StoreFigures
from ..log.kafka import KafkaShared
from ..log.retention import Discarder, RetentionConfig
from ..log.schemas import SchemaRegistry
from ..log.sessions import ConsoleSessions
from ..log.streams import DEFAULT_POLL_SECONDS, StreamLogs, StreamRegistry
from ..log.termini import LinkTermini
from ..log.users import GRANT_RIGHTS, UserAdmin
from ..notify.live import LiveEvents, LiveStreams
from ..storage import open_store
from ..storage.base import DEFAULT_POOL, Durability, PoolLimits, Store
from ..wsio import HttpHandler, ServerIO
from .asyncapi import ASYNCAPI_PATH, AsyncApiEndpoint
from .dcb_http import DCB_PATH, DcbEndpoint
from .executor import Executor
from .http import STREAM_FEEDS_PATH, FeedConfig, FeedEndpoint, HttpEndpoint
from .peers import DISCARDING_SLOT, PeerChannel, WorkerPlace
from .schemas_http import SCHEMAS_PATH, SchemaRegistryEndpoint
from .websocket import TransportConfig, WebSocketTransport

if TYPE_CHECKING:
    from ..amqp.listener import AmqpListener
    from ..console.app import Console
    from ..kafka.listener import KafkaListener
    from .console_http import ConsoleEndpoint
    from .metrics import MetricsListener

logger = logging.getLogger(__name__)

#: Iface versions served, each with its own limits (poll 1.0 replies within 64 KiB, 1.1 8 MiB).
SERVED_IFACES: Final = {
    "futoin.ping": ("1.0",),
    "futoin.evt.gen": ("1.0", "1.1", "1.2"),
    "futoin.evt.poll": ("1.0", "1.1"),
    "futoin.evt.push": ("1.0", "1.1"),
    "futoinevt.ops": ("1.0",),
    "futoin.evt.dcb": ("1.0",),
    "futoin.evt.notify": ("1.0",),
}
DEFAULT_DB: Final = "futoin-evt.sqlite"
#: Consumers reported one by one per scrape at most (``--metrics-consumers``).
DEFAULT_CONSUMER_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    #: A SQLite file path, or a ``postgresql://`` URL.
    db: str | Path = DEFAULT_DB
    durability: Durability = Durability.FULL
    #: Seconds a producer's key of an event is remembered per partition (0: keys ignored).
    dedup_window: float = DEFAULT_DEDUP_WINDOW
    #: PostgreSQL's pool: its size, and how long a call waits for a connection.
    pool: PoolLimits = DEFAULT_POOL
    transport: TransportConfig = field(default_factory=TransportConfig)
    #: Check every reply against the iface (tests); peers' input is always checked.
    check_results: bool = False
    #: How long a verified password is trusted without checking the hash again.
    auth_cache_seconds: float = 30.0
    push: PushConfig = field(default_factory=PushConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    #: How soon events that other processes add to the file reach push consumers.
    other_writers_seconds: float = 0.2
    #: Seconds between reads of the streams registry's version: a stream added or grown by
    #: another process is known here within this.
    streams_poll_seconds: float = DEFAULT_POLL_SECONDS
    #: Archive every event to this SQLite file (a reliable consumer inside the server).
    archive_path: Path | None = None
    #: The HTTP feed (FeedAPI v2, ZeroEventHub v1) on the same port.
    feed: FeedConfig = field(default_factory=FeedConfig)
    #: Where the DCB API is served over HTTP; None: not at all.
    dcb_path: str | None = DCB_PATH
    #: Where the schema registry (Confluent's REST API) is served over HTTP; None: not at
    #: all (the schemas registered are still checked).
    schemas_path: str | None = SCHEMAS_PATH
    #: Where the AsyncAPI 3.0 document of the streams is served; None: not at all.
    asyncapi_path: str | None = ASYNCAPI_PATH
    #: The AMQP 1.0 listener (off when None).
    amqp: AmqpConfig | None = None
    #: The Kafka listener (off when None). Needs kafka-python and cramjam (the ``kafka``
    #: extra).
    kafka: KafkaConfig | None = None
    #: (host, port) of the metrics listener (``/metrics``, ``/healthz``, ``/readyz``); None:
    #: off. Needs prometheus-client (the ``metrics`` extra).
    metrics: tuple[str, int] | None = None
    #: Consumers reported one by one per scrape at most (the rest are counted).
    metrics_consumers: int = DEFAULT_CONSUMER_LIMIT
    #: The user whose password ``/metrics`` asks for (HTTP Basic); None: it asks for none.
    metrics_user: str | None = None
    #: One worker of a group (``serve --workers``): the channel to the others is opened.
    worker: WorkerPlace | None = None
    #: The copying into aggregated streams (every serving process competes for it).
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    #: The web console on the WebSocket port; None: off. Needs Jinja2 (the ``console`` extra).
    console: ConsoleConfig | None = None


async def _all_done(calls: list[Callable[[], Awaitable[None]]]) -> None:
    for call in list(calls):
        await call()


def live_streams(logs: StreamLogs, streams: StreamRegistry, schemas: SchemaRegistry) -> LiveStreams:
    """The shared readers of every stream's partitions, that of ``events``/0 the default."""
    return LiveStreams(
        LiveEvents(logs.default),
        streams.get,
        logs.partition,
        streams.listen,
        streams.access,
        schemas.attributes,
    )


def build_registry() -> IfaceRegistry:
    registry = IfaceRegistry(rules=PARAM_TYPE_RULES)
    for name, versions in SERVED_IFACES.items():
        registry.serve(name, versions)
    return registry


def _home_links(config: ServerConfig) -> list[tuple[str, str, str]]:
    """What ``GET /`` on the port links to: the doors a browser can open that are on."""
    links = []
    if config.console is not None:
        links.append(("Console", config.console.path + "/", "streams, consumers and events"))
    if config.asyncapi_path is not None:
        links.append(("AsyncAPI document", config.asyncapi_path, "the API of every door"))
    if config.feed.path is not None:
        links.append(("HTTP feed", config.feed.path, "the events as a feed (FeedAPI v2)"))
    if config.schemas_path is not None:
        links.append(("Schema registry", config.schemas_path, "the events' JSON schemas"))
    if config.dcb_path is not None:
        links.append(("DCB event store", config.dcb_path, "the DCB HTTP API"))
    return links


def door_addresses(
    config: ServerConfig,
    url: str,
    amqp_url: str | None,
    metrics_url: str | None,
    kafka_url: str | None = None,
) -> list[tuple[str, str]]:
    """(door, address) of every door ``config`` turns on, in the order the start-up banner
    lists them: FTN18 on the WebSocket port ``url``, the HTTP doors on the same port, AMQP,
    Kafka, metrics."""
    http = url.replace("ws", "http", 1).rstrip("/")
    found = [("FTN18 (WebSocket, /NAME/P)", url)]
    for name, path in (
        ("HTTP feed", config.feed.path),
        ("DCB", config.dcb_path),
        ("schema registry", config.schemas_path),
        ("AsyncAPI", config.asyncapi_path),
        ("console", config.console.path + "/" if config.console is not None else None),
    ):
        if path is not None:
            found.append((name, http + path))
    if amqp_url is not None:
        found.append(("AMQP", amqp_url))
    if kafka_url is not None:
        found.append(("Kafka", kafka_url))
    if metrics_url is not None:
        found.append(("metrics", metrics_url))
    return found


def _route(endpoints: list[HttpEndpoint]) -> HttpHandler:
    """One handler for the transport: the first endpoint whose path fits takes the request."""

    def take(io: ServerIO, request: Request, body: bytes) -> bool:
        return any(endpoint.take(io, request, body) for endpoint in endpoints)

    return take


async def _start_amqp(
    store: Store,
    logs: StreamLogs,
    live: LiveStreams,
    bus: ManagementBus,
    authenticator: Authenticator,
    config: AmqpConfig,
    access: Access,
) -> AmqpListener:
    """The AMQP listener (imported here: its filter parser, lark, is an optional dependency),
    with the store's termini and checkpoints behind their calls in ``log/``."""
    from ..amqp.listener import AmqpListener
    from ..amqp.node import EventLogNode
    from ..amqp.notify import NotificationNode

    sas = (
        SasVerifier(store, config.sas_secret, config.sas_max_lifetime)
        if config.sas_secret is not None
        else None
    )
    notifications = NotificationNode(live, bus)
    node = EventLogNode(logs.default, config.limits.node, logs, termini=LinkTermini(store))
    listener = AmqpListener(
        node,
        authenticator,
        config,
        sas=sas,
        notifications=notifications,
        checkpoints=HubCheckpoints(store, access),
        access=access,
    )
    listener.notices = bus
    try:
        await listener.start()
    except OSError as exc:  # say which of the listeners could not start
        where = f"AMQP on {config.host}:{config.port}"
        raise OSError(exc.errno, f"{where}: {exc.strerror or exc}") from None
    return listener


async def _start_kafka(
    store: Store,
    logs: StreamLogs,
    streams: StreamRegistry,
    bus: ManagementBus,
    authenticator: Authenticator,
    config: KafkaConfig,
    schemas: SchemaRegistry,
    shared: KafkaShared,
) -> KafkaListener:
    """The Kafka listener (imported here: kafka-python and cramjam are optional), with SCRAM
    logins and Event Hubs connection strings."""
    from ..kafka.listener import KafkaListener

    listener = KafkaListener(
        logs, streams, authenticator, config, schemas=schemas.type_of_schema, shared=shared
    )
    listener.notices = bus
    listener.scram = ScramLogins(store, store, authenticator)
    sas = SasVerifier(store, config.sas_secret) if config.sas_secret is not None else None
    listener.connection_strings = ConnectionStringLogins(sas, authenticator)
    try:
        await listener.start()
    except OSError as exc:  # say which of the listeners could not start
        where = f"Kafka on {config.host}:{config.port}"
        raise OSError(exc.errno, f"{where}: {exc.strerror or exc}") from None
    return listener


def _console_endpoint(
    config: ConsoleConfig,
    logs: StreamLogs,
    streams: StreamRegistry,
    push: ConnectedDeliveries,
    authenticator: Authenticator,
    notices: ManagementBus,
    live: LiveStreams,
    sessions: ConsoleSessions,
    transport: WebSocketTransport,
    tls: bool,
    schemas: SchemaRegistry,
) -> ConsoleEndpoint:
    """The console's endpoint (imported here: Jinja2 is an optional dependency)."""
    from ..console.app import Console
    from .console_http import ConsoleEndpoint

    console = Console(logs, streams, push, authenticator, notices, live, sessions, config, schemas)
    return ConsoleEndpoint(console, authenticator, transport.is_secure, tls)


async def _start_metrics(server: EventServer, config: ServerConfig) -> MetricsListener:
    """The metrics listener (imported here: prometheus-client is an optional dependency)."""
    from .metrics import MetricsListener

    assert config.metrics is not None
    host, port = config.metrics
    listener = MetricsListener(
        server,
        host,
        port,
        consumer_limit=config.metrics_consumers,
        reuse_port=config.worker is not None,  # the port was reserved by the supervisor
        user=config.metrics_user,
    )
    if config.metrics_user is not None and await server.store.get_user(config.metrics_user) is None:
        logger.warning(
            "the metrics user %s does not exist: /metrics refuses every scrape until it is"
            " added (futoin-evt user add %s)",
            config.metrics_user,
            config.metrics_user,
        )
    try:
        await listener.start()
    except OSError as exc:
        raise OSError(exc.errno, f"metrics on {host}:{port}: {exc.strerror or exc}") from None
    return listener


class EventServer:
    """A running server. ``async with EventServer.start(config) as server: ...``"""

    def __init__(
        self,
        store: Store,
        logs: StreamLogs,
        push: PushService,
        discarder: Discarder,
        transport: WebSocketTransport,
        authenticator: Authenticator,
        executor: Executor,
        streams: StreamRegistry,
        access: AccessControl,
        notify: NotifyService,
        notices: ManagementBus,
        schemas: SchemaRegistry,
    ) -> None:
        self.store = store
        #: The store's own figures for the operator (what ``/metrics`` and ``/readyz`` read).
        self.figures = StoreFigures(store)
        #: Every partition's event log: what every door calls.
        self.logs = logs
        #: The streams and partitions of the database, followed across processes.
        self.streams = streams
        #: Who may read, write and manage which stream (:mod:`futoin_evt.log.access`).
        self.access = access
        #: The event types' schemas (:mod:`futoin_evt.log.schemas`).
        self.schemas = schemas
        #: Users, SAS policies and rights as an admin changes them (the console's pages).
        self.users = UserAdmin(store, access)
        #: The database as configured: a SQLite path or a PostgreSQL URL.
        self.db: str | Path = DEFAULT_DB
        #: What the server was started with.
        self.config = ServerConfig()
        self.push = push
        self.discarder = discarder
        self.archiver: InProcessArchiver | None = None
        #: The copying into aggregated streams (set by :meth:`start`).
        self.aggregator: Aggregator | None = None
        #: Which partition a WebSocket path reaches (the FTN18 door per partition).
        self.doors: PartitionDoors | None = None
        self.feed: FeedEndpoint | None = None
        self.http_endpoints: list[HttpEndpoint] = []
        self.amqp: AmqpListener | None = None
        self.kafka: KafkaListener | None = None
        self.metrics: MetricsListener | None = None
        self.console: Console | None = None
        self.authenticator = authenticator
        self.executor = executor
        #: Event notification: management events, the shared readers (that of ``events``/0
        #: and those of every partition read), the FTN3 service.
        self.notices = notices
        self.live_streams = notify.streams
        self.live = self.live_streams.default
        self.notify = notify
        #: The channel to the other workers of the group, when this is one.
        self.channel: PeerChannel | None = None
        self._transport = transport

    @classmethod
    async def start(cls, config: ServerConfig = ServerConfig()) -> EventServer:
        # The channel is bound before the store reads its heads: nothing committed later
        # by another worker goes unheard.
        channel = PeerChannel(config.worker) if config.worker is not None else None
        try:
            store = await open_store(
                config.db,
                durability=config.durability,
                pool=config.pool,
                dedup_window=config.dedup_window,
            )
        except BaseException:
            if channel is not None:
                channel.close()
            raise
        notices = ManagementBus()
        if channel is not None:
            turns = channel.place.channel_dir / "turns.lock"
            channel.listen(store.join_peers(channel, turns), notices)
            notices.relay = channel.management
        # follows the store's access version: a change by any process is in use at once
        access = AccessControl(store, changes=store)
        # What another worker says changed (grants or schemas) is in use here before it
        # hears back; schemas join once their registry is made, before their first load.
        catch_ups: list[Callable[[], Awaitable[None]]] = [access.catch_up]
        if channel is not None:  # before the first load: a change told meanwhile is not lost
            channel.serve_access(lambda: _all_done(catch_ups))
            access.tell_others = channel.grants_changed
        try:
            await access.start()
            streams = await StreamRegistry.open(store, config.streams_poll_seconds, access)
            schemas = SchemaRegistry(store, streams)
            catch_ups.append(schemas.catch_up)
            if channel is not None:
                schemas.tell_others = channel.grants_changed
            await schemas.start()
            access.followers.append(schemas.catch_up)
        except BaseException:
            await access.close()
            await store.close()
            raise
        consumers = ConsumerLifecycle(store, notices)
        logs = StreamLogs(streams, store, consumers, schemas.schema_of)
        lives = live_streams(logs, streams, schemas)
        notify = NotifyService(lives, notices)
        try:
            push = PushService(logs.default, config.push, notices)
            consumers.deliveries = push
            if channel is not None:
                channel.serve_push(push)
            discarding = config.worker is None or config.worker.slot == DISCARDING_SLOT
            discarder = Discarder(
                store,
                push,
                config.retention,
                notices,
                streams,
                discarding=discarding,
                grants=streams.access,  # a reader of an aggregate who lost read on its source too
            )
            if channel is not None:
                channel.serve_retention(discarder)
            authenticator = Authenticator(
                store, cache_seconds=config.auth_cache_seconds, notices=notices
            )
            access.users_changed.append(authenticator.users_changed)
            executor = Executor(build_registry(), authenticator, check_results=config.check_results)
            executor.recheck = access.fresh  # a refusal reads the rights again first
            transport = WebSocketTransport(executor, config.transport)
            transport.notices = notices
            grants = GrantAdmin(UserAdmin(store, access, refusal=GRANT_RIGHTS))
            doors = PartitionDoors(streams, logs, push, discarder, notify, grants)
            transport.doors = doors
            feed = None
            endpoints: list[HttpEndpoint] = []
            if config.feed.path is not None:
                service = FeedService(logs, streams, await store.stream_id())
                feed = FeedEndpoint(service, authenticator, config.feed, transport.is_secure)
                endpoints.append(feed)
            if config.dcb_path is not None:
                dcb = DcbEndpoint(
                    DcbService(logs.default),
                    authenticator,
                    transport.is_secure,
                    config.dcb_path,
                    lambda who, name, right: DcbService(
                        stream_dcb_log(
                            name, lambda n: streams.reachable(who, n, right), logs.partition
                        )
                    ),
                )
                endpoints.append(dcb)
            if config.schemas_path is not None:
                endpoints.append(
                    SchemaRegistryEndpoint(
                        schemas, authenticator, transport.is_secure, config.schemas_path
                    )
                )
            asyncapi = None
            if config.asyncapi_path is not None:
                asyncapi = AsyncApiEndpoint(
                    streams,
                    schemas.typed,
                    authenticator,
                    transport.is_secure,
                    lambda: transport.url,
                    feed is not None,
                    config.asyncapi_path,
                )
                endpoints.append(asyncapi)
            console = None
            if config.console is not None:
                endpoint = _console_endpoint(
                    config.console,
                    logs,
                    streams,
                    push,
                    authenticator,
                    notices,
                    lives,
                    ConsoleSessions(store),
                    transport,
                    config.transport.tls is not None,
                    schemas,
                )
                endpoints.append(endpoint)
                console = endpoint.console
                transport.connections = Connections()  # the console's connections page
            if endpoints:
                transport.http_handler = _route(endpoints)
            transport.home_links = _home_links(config)
            await transport.start()
            amqp = None
            if config.amqp is not None:
                try:
                    amqp = await _start_amqp(
                        store, logs, lives, notices, authenticator, config.amqp, streams.access
                    )
                except BaseException:
                    await transport.close()
                    raise
                if asyncapi is not None:
                    asyncapi.amqp_url = amqp.url
                amqp.connections = transport.connections
            kafka = None
            if config.kafka is not None:
                try:
                    kafka = await _start_kafka(
                        store,
                        logs,
                        streams,
                        notices,
                        authenticator,
                        config.kafka,
                        schemas,
                        KafkaShared(store),
                    )
                except BaseException:
                    if amqp is not None:
                        await amqp.close()
                    await transport.close()
                    raise
        except BaseException:
            await schemas.close()
            await streams.close()
            await store.close()
            if channel is not None:
                channel.close()
            raise
        store.watch_other_writers(config.other_writers_seconds)
        archiver = None
        if config.archive_path is not None:
            archiver = InProcessArchiver(store, config.archive_path)
            await archiver.start()
        discarder.start()
        aggregator = Aggregator(store, streams, config.aggregate)
        aggregator.start()
        logger.info("serving %s on %s", store.description, transport.url)
        server = cls(
            store,
            logs,
            push,
            discarder,
            transport,
            authenticator,
            executor,
            streams,
            access,
            notify,
            notices,
            schemas,
        )
        server.archiver = archiver
        server.aggregator = aggregator
        server.doors = doors
        server.db = config.db
        server.config = config
        server.feed = feed
        server.http_endpoints = endpoints
        server.amqp = amqp
        server.kafka = kafka
        server.console = console
        if config.amqp is not None:  # a SAS policy's key derives from its secret
            server.users = UserAdmin(store, access, config.amqp.sas_secret)
        if console is not None:
            from .console_http import attach  # (Jinja2 is there: the console is)

            attach(console, server)
            console.start()
        server.channel = channel
        if config.metrics is not None:
            try:
                server.metrics = await _start_metrics(server, config)
            except BaseException:
                await server.close()
                raise
        if server.feed_url is not None:
            logger.info("HTTP feed on %s", server.feed_url)
        if server.console_url is not None:
            logger.info("console on %s", server.console_url)
        if amqp is not None:
            logger.info("AMQP on %s", amqp.url)
        if kafka is not None:
            logger.info("Kafka on %s", kafka.url)
        if server.metrics is not None:
            logger.info("metrics on %s", server.metrics.url)
        return server

    @property
    def feed_url(self) -> str | None:
        """``http(s)://host:port/feed``, or None when the feed is off."""
        return self._http_url(self.feed.path) if self.feed is not None else None

    @property
    def schemas_url(self) -> str | None:
        """``http(s)://host:port/schemas``: the schema registry, or None when it is off."""
        for endpoint in self.http_endpoints:
            if isinstance(endpoint, SchemaRegistryEndpoint):
                return self._http_url(endpoint.path)
        return None

    @property
    def console_url(self) -> str | None:
        """``http(s)://host:port/console/``, or None when the console is off."""
        return self._http_url(self.console.base + "/") if self.console is not None else None

    def _http_url(self, path: str) -> str:
        return self._transport.url.replace("ws", "http", 1).rstrip("/") + path

    def stream_feed_url(self, name: str) -> str | None:
        """``http(s)://host:port/feeds/NAME``, or None when the feed is off."""
        if self.feed is None:
            return None
        return (
            self._transport.url.replace("ws", "http", 1).rstrip("/") + f"{STREAM_FEEDS_PATH}/{name}"
        )

    @property
    def url(self) -> str:
        return self._transport.url

    @property
    def transport(self) -> WebSocketTransport:
        """The WebSocket port (which also serves the HTTP feed and DCB)."""
        return self._transport

    @property
    def amqp_url(self) -> str | None:
        """``amqp(s)://host:port``, or None when the AMQP listener is off."""
        return self.amqp.url if self.amqp is not None else None

    @property
    def kafka_url(self) -> str | None:
        """``kafka://host:port``, or None when the Kafka listener is off."""
        return self.kafka.url if self.kafka is not None else None

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics``, or None when the metrics listener is off."""
        return self.metrics.url if self.metrics is not None else None

    def addresses(self) -> list[tuple[str, str]]:
        """(door, address) of every door that is on: :func:`door_addresses`."""
        return door_addresses(
            self.config, self.url, self.amqp_url, self.metrics_url, self.kafka_url
        )

    @property
    def port(self) -> int:
        return self._transport.port

    async def close(self) -> None:
        """Graceful: pushes stop, calls in flight finish, queued writes commit, the file closes.

        Connections get one drain grace (``Limits.drain_seconds``) in total: the WebSocket
        connections, the feed's responses and the push streams wind down side by side.
        """
        deadline = asyncio.get_running_loop().time() + self._transport.limits.drain_seconds
        if self.metrics is not None:
            await self.metrics.close()
        if self.amqp is not None:
            await self.amqp.close()
        if self.kafka is not None:
            await self.kafka.close()
        await self.discarder.close()
        if self.aggregator is not None:
            await self.aggregator.close()
        if self.console is not None:
            await self.console.close()
        if self.archiver is not None:
            await self.archiver.close()
        endings = [self.push.close(), self.notify.close(), self._transport.close(deadline)]
        endings += [endpoint.close(deadline) for endpoint in self.http_endpoints]
        await asyncio.gather(*endings)
        self._transport.abort_all()
        if self.doors is not None:
            self.doors.close()
        await self.schemas.close()
        await self.streams.close()
        await self.access.close()
        await self.store.close()
        if self.channel is not None:
            self.channel.close()

    async def __aenter__(self) -> EventServer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
