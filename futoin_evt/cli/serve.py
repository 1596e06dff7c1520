"""``futoin-evt serve``: the server, its settings checked before it starts."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import math
import os
import re
import shlex
import shutil
import signal
import ssl
import sys
from pathlib import Path

from .. import __version__
from ..amqp import AmqpConfig, AmqpLimits
from ..auth.sas import DEFAULT_MAX_LIFETIME
from ..console.config import DEFAULT_MAX_SESSIONS, ConsoleConfig
from ..domain.rights import ANY_STREAM, Right
from ..domain.stream import DEFAULT_DEDUP_WINDOW
from ..kafka.config import KafkaConfig, KafkaLimits
from ..log.aggregate import DEFAULT_LEASE_SECONDS, AggregateConfig
from ..log.retention import RetentionConfig
from ..server.app import (
    DEFAULT_CONSUMER_LIMIT,
    DEFAULT_DB,
    EventServer,
    ServerConfig,
    door_addresses,
)
from ..server.dcb_http import DCB_PATH
from ..server.http import DEFAULT_FEED_PATH, STREAM_FEEDS_PATH, FeedConfig
from ..server.peers import WorkerPlace
from ..server.websocket import DEFAULT_LIMITS, Limits, TransportConfig
from ..server.workers import Supervisor, WorkerFailed, channel_dir, die_with_parent, reserve_port
from ..slots import COUNTS_FILE, GroupShare, clear_counts, create_counts
from ..storage import is_postgres_url, open_store
from ..storage.base import DEFAULT_POOL, Durability, PoolLimits
from .common import (
    DEFAULT_PORT,
    ENV_DB,
    ENV_WORKERS,
    BadSetting,
    Commands,
    add_db,
    add_sas_secret,
    logger,
    sas_secret,
    tag_logs,
)
from .serve_checks import (
    DEFAULT_START_CHECK,
    address,
    check_db_file,
    check_ports,
    host_port,
    listeners,
    metrics_address,
    migrated,
    port_taken,
    run_start_check,
    tls_context,
    waiting_for_db,
)


def add_commands(commands: Commands) -> None:
    serve = commands.add_parser("serve", help="run the server")
    add_db(serve)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address of the WebSocket/HTTP port (0.0.0.0: every one)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help=f"server processes sharing the ports (Linux; default: ${ENV_WORKERS}, else one on "
        "SQLite, whose writers take turns at one lock and each pay their own fsync, so a "
        "second is slower; the number of cores on PostgreSQL); 1 runs the server in this "
        "process",
    )
    serve.add_argument("--worker", help=argparse.SUPPRESS)  # set by the supervisor
    serve.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="the WebSocket/HTTP port: FTN18, the feed, DCB, the schema registry, AsyncAPI and "
        "the console (0 picks a free port)",
    )
    serve.add_argument(
        "--durability",
        choices=["full", "normal"],
        default="full",
        help="full: acknowledged events survive power loss; normal: a process crash only",
    )
    pg = serve.add_argument_group("PostgreSQL")
    pg.add_argument(
        "--pg-pool-size",
        type=int,
        default=DEFAULT_POOL.size,
        metavar="N",
        help="pooled connections for reads and consumer updates (plus one writer, one listener)",
    )
    pg.add_argument(
        "--pg-pool-timeout",
        type=float,
        default=DEFAULT_POOL.timeout,
        metavar="T",
        help="a call waits T seconds for a pooled connection, then fails (InternalError)",
    )
    pg.add_argument(
        "--pg-link-timeout",
        type=float,
        default=DEFAULT_POOL.link_timeout,
        metavar="T",
        help="a database connection that gets no answer from the database's host for about T "
        "seconds (a cut link, a firewall dropping packets) counts as broken, and a session "
        "left inside a transaction that long is ended by the server, freeing its locks",
    )
    pg.add_argument(
        "--wait-for-db",
        type=float,
        default=0.0,
        metavar="T",
        help="at start, try an unreachable database again for up to T seconds "
        "(no effect on SQLite)",
    )
    serve.add_argument(
        "--start-check",
        type=float,
        default=DEFAULT_START_CHECK,
        metavar="T",
        help="SQLite: run PRAGMA quick_check on the file for at most T seconds before serving, "
        "and refuse a damaged file (0: skip it)",
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="PEM certificate: serve wss:// and https:// (default: none, plain ws://)",
    )
    serve.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="PEM private key for --tls-cert (default: none)"
    )
    serve.add_argument(
        "--trust-channel",
        action="store_true",
        help="treat plain ws:// from any peer as secure (TLS ends at a proxy in front)",
    )
    limits = serve.add_argument_group("limits")
    limits.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_LIMITS.max_connections,
        metavar="N",
        help="connections past their handshake, per port, in the whole server (all its "
        "workers); more are refused (HTTP 503, SASL sys-temp)",
    )
    limits.add_argument(
        "--max-handshakes",
        type=int,
        metavar="N",
        help="sockets still in their handshake, per port, in the whole server (each worker "
        "holds its share), on top of --max-connections; when all are taken the oldest is "
        "closed for a new one (default: a quarter of --max-connections, at least 8)",
    )
    limits.add_argument(
        "--max-calls-in-flight",
        type=int,
        default=DEFAULT_LIMITS.max_calls_in_flight,
        metavar="N",
        help="calls run at once per connection; more wait unread",
    )
    limits.add_argument(
        "--max-frame-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_frame_bytes,
        metavar="N",
        help="a larger WebSocket message closes the connection (each function has its own, "
        "smaller limit: 64 KiB unless its iface says more)",
    )
    serve.add_argument(
        "--archive",
        type=Path,
        metavar="PATH",
        help="copy every event to this SQLite file (default: none)",
    )
    amqp = serve.add_argument_group(
        "AMQP 1.0",
        "The event log node 'events' for AMQP clients (SASL PLAIN with the same users; "
        "amqps with --tls-cert/--tls-key).",
    )
    amqp.add_argument(
        "--amqp", metavar="HOST:PORT", help="listen for AMQP here (port 0: any; default: off)"
    )
    amqp.add_argument(
        "--amqp-idle-timeout",
        type=float,
        default=AmqpLimits().idle_timeout,
        metavar="T",
        help="disconnect AMQP peers silent for T seconds",
    )
    kafka = serve.add_argument_group(
        "Kafka",
        "The streams as topics for Kafka clients (SASL PLAIN or SCRAM with the same users; "
        "SASL_SSL with --tls-cert/--tls-key).",
    )
    kafka.add_argument(
        "--kafka", metavar="HOST:PORT", help="listen for Kafka here (port 0: any; default: off)"
    )
    kafka.add_argument(
        "--kafka-advertise",
        metavar="HOST:PORT",
        help="the address Kafka clients are told to connect to (default: where it listens)",
    )
    kafka.add_argument(
        "--kafka-max-request-bytes",
        type=int,
        default=KafkaLimits().max_request_bytes,
        metavar="N",
        help="close Kafka connections that send a larger request"
        f" (default: {KafkaLimits().max_request_bytes})",
    )
    sas = serve.add_argument_group(
        "shared access signatures",
        "Event Hubs' SAS keys and tokens, taken by the AMQP door and by the Kafka door's "
        "$ConnectionString login.",
    )
    add_sas_secret(sas)
    sas.add_argument(
        "--sas-max-lifetime",
        type=float,
        default=DEFAULT_MAX_LIFETIME,
        metavar="SECONDS",
        help="refuse SAS tokens that expire more than SECONDS from now"
        f" (default: {DEFAULT_MAX_LIFETIME}, 7 days)",
    )
    feed = serve.add_argument_group(
        "HTTP feed",
        "FeedAPI v2 and ZeroEventHub v1 over plain HTTP GET on the same port (HTTP Basic "
        "auth with the same users).",
    )
    feed.add_argument(
        "--feed-path", default=DEFAULT_FEED_PATH, metavar="PATH", help="where it is served"
    )
    feed.add_argument("--no-feed", action="store_true", help="do not serve the HTTP feed")
    feed.add_argument(
        "--feed-users",
        metavar="U1,U2",
        help="deprecated (rights per stream decide who reads a feed): at start, each of these "
        "users who lacks it is granted read on '*'; others keep their own grants (default: none)",
    )
    keep = serve.add_argument_group(
        "retention",
        "Events every registered consumer has read are discarded. Without registered consumers "
        "nothing is discarded, unless a --keep-* policy is set.",
    )
    keep.add_argument(
        "--keep-events", type=int, metavar="N", help="always keep the newest N (default: none)"
    )
    keep.add_argument(
        "--keep-seconds",
        type=float,
        metavar="T",
        help="always keep events younger than T seconds (default: none)",
    )
    keep.add_argument(
        "--expire-consumers-after",
        type=float,
        metavar="T",
        help="drop consumers not seen for T seconds (default: never)",
    )
    keep.add_argument(
        "--discard-interval",
        type=float,
        default=1.0,
        metavar="T",
        help="seconds between two rounds of discarding (and of expiring consumers)",
    )
    keep.add_argument(
        "--dedup-window",
        type=float,
        default=DEFAULT_DEDUP_WINDOW,
        metavar="T",
        help="a producer's key of an event is remembered for T seconds per partition: an "
        "addEvent with a key stored within T stores nothing and answers the first event's id "
        "(0: keys are accepted and ignored)",
    )
    keep.add_argument(
        "--discard-dcb-events",
        action="store_true",
        help="discard events appended through DCB too (kept by default: they are the record)",
    )
    serve.add_argument(
        "--dcb-path", default=DCB_PATH, metavar="PATH", help="where the DCB HTTP API is served"
    )
    serve.add_argument("--no-dcb", action="store_true", help="do not serve the DCB HTTP API")
    serve.add_argument(
        "--aggregate-lease",
        type=float,
        default=DEFAULT_LEASE_SECONDS,
        metavar="T",
        help="one serving process copies into each aggregated stream; another takes over "
        "within 1.5 T seconds after it dies",
    )
    serve.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve GET /metrics (Prometheus), /healthz and /readyz over plain HTTP here; "
        "PORT alone (or :PORT) listens on 127.0.0.1 (port 0: any; needs the 'metrics' extra; "
        "default: off)",
    )
    serve.add_argument(
        "--metrics-consumers",
        type=int,
        default=DEFAULT_CONSUMER_LIMIT,
        metavar="N",
        help="report at most N consumers one by one per scrape (the rest are counted)",
    )
    serve.add_argument(
        "--metrics-user",
        metavar="USER",
        help="GET /metrics asks for this user's password (HTTP Basic); the probes stay open "
        "(default: none, /metrics is open to whoever reaches its port: a warning at start)",
    )
    serve.add_argument(
        "--console",
        action="store_true",
        help="serve the web console at /console/ on the WebSocket port (needs the 'console' extra)",
    )
    serve.add_argument(
        "--console-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help="console sessions open at once at most, for every process on the database"
        " (the least recently used ends)",
    )
    serve.set_defaults(run=_serve)


async def _serve(args: argparse.Namespace) -> int:
    place = _worker_place(args.worker)
    if place is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor's SIGTERM stops it
        die_with_parent(place.supervisor)
        tag_logs(place.slot)
    workers = _workers(args.workers, args.db) if place is None else 1
    tls = tls_context(args.tls_cert, args.tls_key)
    for name in ("keep_events", "keep_seconds", "expire_consumers_after"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise BadSetting(f"--{name.replace('_', '-')} cannot be negative.")
    if not 0 <= args.dedup_window < math.inf:
        raise BadSetting("--dedup-window must be 0 or more seconds.")
    if args.discard_interval <= 0:
        raise BadSetting("--discard-interval must be above 0.")
    if not args.aggregate_lease > 0:
        raise BadSetting("--aggregate-lease must be above 0.")
    if args.pg_pool_size < 1:
        raise BadSetting("--pg-pool-size must be at least 1.")
    if args.pg_pool_timeout <= 0:
        raise BadSetting("--pg-pool-timeout must be above 0.")
    if not 1 <= args.pg_link_timeout < math.inf:
        raise BadSetting("--pg-link-timeout must be at least 1 (seconds).")
    if args.wait_for_db < 0:
        raise BadSetting("--wait-for-db cannot be negative.")
    if args.start_check < 0:
        raise BadSetting("--start-check cannot be negative.")
    if not 0 <= args.port <= 65535:
        raise BadSetting(f"--port must be 0 to 65535, not {args.port}.")
    if args.max_handshakes is not None and args.max_handshakes < 1:
        raise BadSetting("--max-handshakes must be at least 1.")
    for name in ("max_connections", "max_calls_in_flight", "max_frame_bytes"):
        if getattr(args, name) < 1:
            raise BadSetting(f"--{name.replace('_', '-')} must be at least 1.")
    for option, value in (("--feed-path", args.feed_path), ("--dcb-path", args.dcb_path)):
        if not value.startswith("/") or "?" in value:
            raise BadSetting(f"{option} must be a path starting with /, not {value!r}.")
    if (
        not args.no_feed
        and not args.no_dcb
        and args.dcb_path.rstrip("/") == args.feed_path.rstrip("/")
    ):
        raise BadSetting("--dcb-path and --feed-path must differ.")
    for option, value in (("--feed-path", args.feed_path), ("--dcb-path", args.dcb_path)):
        if not args.no_feed and (value + "/").startswith(STREAM_FEEDS_PATH + "/"):
            raise BadSetting(
                f"{option} cannot be under {STREAM_FEEDS_PATH}: each stream's feed is."
            )
    amqp = _amqp_config(args, tls)
    kafka = _kafka_config(args, tls)
    metrics = metrics_address(args.metrics)
    group = None  # the limits are the group's: its workers count their connections together
    if place is not None:
        group = GroupShare(place.channel_dir / COUNTS_FILE, place.slot, place.count)
    if group is not None and amqp is not None:
        amqp = dataclasses.replace(amqp, reuse_port=True, group=group)
    if group is not None and kafka is not None:
        kafka = dataclasses.replace(kafka, reuse_port=True, group=group)
    if args.metrics_consumers < 0:
        raise BadSetting("--metrics-consumers cannot be negative.")
    if args.metrics_user is not None and metrics is None:
        raise BadSetting("--metrics-user needs --metrics.")
    console = _console_config(args)
    config = ServerConfig(
        db=args.db,
        durability=Durability(args.durability.upper()),
        dedup_window=args.dedup_window,
        pool=PoolLimits(
            size=args.pg_pool_size, timeout=args.pg_pool_timeout, link_timeout=args.pg_link_timeout
        ),
        transport=TransportConfig(
            host=args.host,
            port=args.port,
            tls=tls,
            trust_channel=args.trust_channel,
            reuse_port=place is not None,
            group=group,
            limits=Limits(
                max_frame_bytes=args.max_frame_bytes,
                max_connections=args.max_connections,
                max_handshakes=args.max_handshakes,
                max_calls_in_flight=args.max_calls_in_flight,
            ),
        ),
        # one archiver and one metrics listener per group: those of worker 0
        archive_path=args.archive if place is None or place.slot == 0 else None,
        amqp=amqp,
        kafka=kafka,
        metrics=metrics if place is None or place.slot == 0 else None,
        metrics_consumers=args.metrics_consumers,
        metrics_user=args.metrics_user,
        console=console,
        feed=FeedConfig(path=None if args.no_feed else args.feed_path),
        dcb_path=None if args.no_dcb else args.dcb_path,
        aggregate=AggregateConfig(lease_seconds=args.aggregate_lease),
        retention=RetentionConfig(
            interval=args.discard_interval,
            keep_events=args.keep_events,
            keep_seconds=args.keep_seconds,
            expire_consumers_after=args.expire_consumers_after,
            discard_dcb_events=args.discard_dcb_events,
        ),
        worker=place,
    )
    if place is None:  # once, before any worker starts and anything is made
        check_db_file(args.db)
        check_ports(listeners(args, amqp, metrics, kafka))
    if amqp is not None or kafka is not None:  # SAS tokens, and Kafka's connection strings
        secret = sas_secret(args.sas_secret, args.db)
        if amqp is not None:
            config = dataclasses.replace(config, amqp=dataclasses.replace(amqp, sas_secret=secret))
        if kafka is not None:
            config = dataclasses.replace(
                config, kafka=dataclasses.replace(kafka, sas_secret=secret)
            )
    if place is None and args.start_check:  # once, before any worker starts
        await run_start_check(args.db, args.start_check)
    if args.feed_users is not None and place is None:  # once, before any worker starts
        names = [name.strip() for name in args.feed_users.split(",") if name.strip()]
        if args.no_feed:
            logger.warning("--feed-users is deprecated, and has no effect with --no-feed")
        else:
            await waiting_for_db(lambda: _feed_users_as_grants(config, names), args.wait_for_db)
    if workers > 1:
        return await _supervise(args, config, workers)
    try:
        server = await waiting_for_db(lambda: EventServer.start(config), args.wait_for_db)
    except OSError as exc:  # taken since check_ports: the door's own words, or the port's
        said = str(exc.strerror or exc)
        if not said.startswith(("AMQP on ", "Kafka on ", "metrics on ")):
            said = f"{address(args.host, args.port)} (--port): {said}"
        raise BadSetting(f"cannot listen on {said.rstrip('.')}.") from None
    urls = " and ".join(
        url
        for url in (
            server.url,
            server.amqp_url,
            server.kafka_url,
            server.metrics_url,
            server.console_url,
        )
        if url is not None
    )
    where = server.store.description
    # What start-up made (modules, grammars, schemas: most of the heap) leaves the garbage
    # collector's passes: a full pass walks only what serving made since, and pauses every
    # connection for a few milliseconds rather than tens (the tail of notification fan-out).
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # a worker stops when its supervisor says so (Ctrl-C reaches the whole process group);
    # handled before the start-up line: a SIGTERM as soon as it is read stops it gracefully
    for sig in (signal.SIGTERM,) if place is not None else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"futoin-evt {__version__} listening on {urls} (database {where})", flush=True)
    if place is None:  # a group's supervisor says it for the group
        users = bool(await server.store.list_users())
        _say_started(args, server.addresses(), users, server.store.description)
    await stop.wait()
    logger.info("shutting down")
    await server.close()
    if place is not None and os.getppid() != place.supervisor:
        shutil.rmtree(place.channel_dir, ignore_errors=True)  # the supervisor died: tidy up
    return 0


def _say_started(
    args: argparse.Namespace, doors: list[tuple[str, str]], users: bool, where: str
) -> None:
    """What follows the start-up line: the banner's other lines on stdout (:func:`_banner`),
    then, in the log, that the SQLite file may be shared and when /metrics is open."""
    print(_banner(args.db, doors, users, where), flush=True)
    _say_sharing(args.db)
    metrics = dict(doors).get("metrics")
    if metrics is not None and args.metrics_user is None:
        logger.warning(
            "%s is open to whoever reaches its port: it names every stream, partition and"
            " consumer; --metrics-user USER asks for a password",
            metrics,
        )


def _banner(db: str, doors: list[tuple[str, str]], users: bool, where: str) -> str:
    """The lines under the start-up line: every door that is on with its address, and on a
    database without users, the two commands that add one with rights (``where``: the
    database as it may be shown, without a password)."""
    width = max(len(name) for name, _ in doors)
    lines = [f"  {name.ljust(width)}  {address}" for name, address in doors]
    if not users:
        option = ""
        if db != os.environ.get(ENV_DB, DEFAULT_DB):
            option = f" --db {shlex.quote(where if is_postgres_url(db) else db)}"
        lines += [
            "  no users yet: add one, with rights on every stream, by",
            f"    futoin-evt user add NAME{option}",
            f"    futoin-evt grant NAME read,write '*'{option}",
        ]
    return "\n".join(lines)


async def _feed_users_as_grants(config: ServerConfig, names: list[str]) -> None:
    """``--feed-users`` (deprecated) as grants: each listed user who cannot read every
    stream is granted read on ``*`` (the option let them read every feed), once; users not
    listed keep their own grants. A warning says what was done and what to run instead."""
    store = await open_store(config.db, durability=config.durability, pool=config.pool)
    try:
        rows = await store.list_grants()
        granted, unknown, listed = [], [], set()
        for name in names:
            user = await store.get_user(name)
            if user is None:
                unknown.append(name)
                continue
            listed.add(user.id)
            reads_all = any(
                row.user_id == user.id and row.pattern == ANY_STREAM and row.rights & Right.READ
                for row in rows
            )
            if not user.is_admin and not reads_all:
                await store.grant(user.id, ANY_STREAM, int(Right.READ))
                granted.append(name)
        users = {user.id: user for user in await store.list_users()}
        readers = {
            users[row.user_id].name
            for row in rows
            if row.user_id in users
            and row.user_id not in listed
            and not users[row.user_id].is_admin
            and row.rights & Right.READ
        }
    finally:
        await store.close()
    said = ["--feed-users is deprecated: rights per stream decide who reads a feed"]
    if granted:
        said.append(f"granted read on * to {', '.join(granted)}")
    if unknown:
        said.append(f"no user {', '.join(unknown)}")
    if readers:
        said.append(
            "users not listed keep their own grants, and these may read streams through them: "
            + ", ".join(sorted(readers))
        )
    logger.warning(
        "%s. Instead, run futoin-evt grant USER read PATTERN for each reader (futoin-evt revoke"
        " USER read PATTERN for the others) and drop --feed-users.",
        "; ".join(said),
    )


def _console_config(args: argparse.Namespace) -> ConsoleConfig | None:
    if not args.console:
        return None
    if args.console_sessions < 1:
        raise BadSetting("--console-sessions must be at least 1.")
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise BadSetting("--console needs Jinja2: pip install 'futoin-evt[console]'") from None
    return ConsoleConfig(max_sessions=args.console_sessions)


def _amqp_config(args: argparse.Namespace, tls: ssl.SSLContext | None) -> AmqpConfig | None:
    if args.amqp is None:
        return None
    host, port = host_port("--amqp", args.amqp)
    if args.amqp_idle_timeout <= 0:
        raise BadSetting("--amqp-idle-timeout must be above 0.")
    try:
        import lark  # noqa: F401
    except ImportError:
        raise BadSetting("--amqp needs lark: pip install 'futoin-evt[amqp]'") from None
    limits = AmqpLimits(
        max_connections=args.max_connections,
        max_handshakes=args.max_handshakes,
        idle_timeout=args.amqp_idle_timeout,
    )
    if not args.sas_max_lifetime > 0:
        raise BadSetting("--sas-max-lifetime must be above 0.")
    return AmqpConfig(
        host=host,
        port=port,
        tls=tls,
        limits=limits,
        sas_secret=None,  # read (or made) once the ports are known to be free: _serve
        sas_max_lifetime=args.sas_max_lifetime,
    )


def _kafka_config(args: argparse.Namespace, tls: ssl.SSLContext | None) -> KafkaConfig | None:
    if args.kafka is None:
        if args.kafka_advertise is not None:
            raise BadSetting("--kafka-advertise needs --kafka.")
        return None
    host, port = host_port("--kafka", args.kafka)
    advertise = None
    if args.kafka_advertise is not None:
        advertise = host_port("--kafka-advertise", args.kafka_advertise)
        if not advertise[1]:
            raise BadSetting("--kafka-advertise needs a port other than 0.")
    if args.kafka_max_request_bytes < 1024:
        raise BadSetting("--kafka-max-request-bytes must be at least 1024.")
    try:
        import cramjam  # noqa: F401
        import kafka.protocol  # noqa: F401
    except ImportError:
        raise BadSetting("--kafka needs its extra: pip install 'futoin-evt[kafka]'") from None
    limits = KafkaLimits(
        max_connections=args.max_connections,
        max_handshakes=args.max_handshakes,
        max_request_bytes=args.kafka_max_request_bytes,
    )
    return KafkaConfig(host=host, port=port, advertise=advertise, tls=tls, limits=limits)


def default_workers(db: str) -> int:
    """The workers ``serve`` runs on ``db`` unless told: what its backend gains from more,
    measured (``python -m bench.workers``; docs/operations.md, Workers). SQLite: one. Its
    writers take turns at one lock, each with its own commit (and fsync at ``full``), so a
    second worker made addEvent slower one at a time and, from the official client, with 32
    in flight too. PostgreSQL: one per core, its writers commit side by side."""
    return (os.cpu_count() or 1) if is_postgres_url(db) else 1


def _workers(value: int | None, db: str) -> int:
    """The number of workers: ``--workers``, else ``$FUTOIN_EVT_WORKERS``, else
    :func:`default_workers`."""
    if value is None:
        env = os.environ.get(ENV_WORKERS)
        if env is None:
            return default_workers(db)
        if re.fullmatch(r"[0-9]{1,4}", env.strip()) is None:
            raise BadSetting(f"${ENV_WORKERS} must be a number of processes, not {env!r}.")
        value = int(env)
    if value < 1:
        raise BadSetting("--workers must be at least 1.")
    if value > 1 and not sys.platform.startswith("linux"):
        raise BadSetting("--workers above 1 needs Linux (SO_REUSEPORT spreads connections).")
    return value


def _worker_place(value: str | None) -> WorkerPlace | None:
    """``--worker SLOT/COUNT/SUPERVISOR_PID/CHANNEL_DIR``, as the supervisor passes it."""
    if value is None:
        return None
    slot, count, supervisor, where = value.split("/", 3)
    return WorkerPlace(int(slot), int(count), Path(where), int(supervisor))


def _group_doors(config: ServerConfig, line: str) -> list[tuple[str, str]]:
    """The doors of a group of workers, with the addresses worker 0's start-up line gives."""

    def found(pattern: str) -> str | None:
        match = re.search(pattern, line)
        return match.group(0) if match else None

    url = found(r"wss?://\S+") or ""
    return door_addresses(
        config,
        url,
        found(r"amqps?://\S+"),
        found(r"http://\S+/metrics\b"),
        found(r"kafka://\S+"),
    )


def _say_sharing(db: str) -> None:
    """What start-up says once of a SQLite file: other processes may use it too."""
    if not is_postgres_url(db):
        logger.info(
            "database %s: other futoin-evt processes may use this file at the same time"
            " (another serve on its own ports, the commands with --db); their writes take"
            " turns at SQLite's lock, and their events reach this server's readers within"
            " 0.2 s (--workers N shares one server's ports and wakes them at once)",
            db,
        )


async def _supervise(args: argparse.Namespace, config: ServerConfig, workers: int) -> int:
    """``serve --workers N``: reserve the ports, start the workers, keep them running; the
    start-up line is worker 0's (every worker serves the same URLs)."""
    held = []
    held_fds: list[int] = []
    try:
        port_args = []
        for option, host, port in listeners(args, config.amqp, config.metrics, config.kafka):
            try:
                port, sockets = reserve_port(host, port)
            except OSError as exc:
                raise port_taken(option, host, port, exc) from None
            held += sockets
            port_args += [option, str(port) if option == "--port" else address(host, port)]
        # the ports are the group's: only now is the database made (or migrated)
        users, where = await waiting_for_db(lambda: migrated(config), args.wait_for_db)
        workdir, owner = channel_dir()
        held_fds.append(owner)
        counts = workdir / COUNTS_FILE
        create_counts(counts, workers)
        base = [sys.executable, "-m", "futoin_evt", *args.argv, *port_args, "--worker"]

        def command(slot: int) -> list[str]:
            return [*base, f"{slot}/{workers}/{os.getpid()}/{workdir}"]

        supervisor = Supervisor(
            workers, command, workdir, on_exit=lambda slot: clear_counts(counts, slot)
        )
        try:
            line = await supervisor.start()
        except WorkerFailed as exc:
            logger.error("%s", exc)
            return exc.returncode if exc.returncode > 0 else 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before the start-up line, as one process
            loop.add_signal_handler(sig, stop.set)
        print(line, flush=True)
        _say_started(args, _group_doors(config, line), users, where)
        logger.info("%d workers: pids %s", workers, " ".join(map(str, supervisor.pids)))
        await stop.wait()
        logger.info("shutting down %d workers", workers)
        await supervisor.close()
        return 0
    finally:
        for sock in held:
            sock.close()
        for fd in held_fds:  # the channel's owner lock, once its directory is gone
            os.close(fd)
