"""The ``futoin-evt`` command line. The only module that reads argv and the environment."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sqlite3
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from . import __version__
from .archive import RemoteArchiver
from .auth import hash_password
from .client.aio import OPS, CommError, Event, EventStreamClient, RemoteError
from .client.notify import Notifications
from .client.receiver import LiveReceiver, Receiver, ReliableReceiver
from .ftn3.messages import decode_json
from .model import LIVE_COMPONENT
from .notify.message import NotifyError, Transformation
from .notify.selector import compile_selector
from .retention import RetentionConfig
from .sas import SecretFileError, load_secret, sas_key
from .server.amqp import AmqpConfig, AmqpLimits
from .server.app import DEFAULT_DB, EventServer, ServerConfig
from .server.dcb_http import DCB_PATH
from .server.http import DEFAULT_FEED_PATH, FeedConfig
from .server.websocket import DEFAULT_LIMITS, Limits, TransportConfig
from .storage import is_postgres_url, open_store
from .storage.base import DEFAULT_POOL, Durability, PoolLimits, Store, StoreError, StoreUnreachable

DEFAULT_PORT: Final = 8480
DEFAULT_URL: Final = f"ws://127.0.0.1:{DEFAULT_PORT}/"
ENV_URL: Final = "FUTOIN_EVT_URL"
ENV_USER: Final = "FUTOIN_EVT_USER"
ENV_PASSWORD: Final = "FUTOIN_EVT_PASSWORD"
ENV_DB: Final = "FUTOIN_EVT_DB"
ENV_SAS_SECRET: Final = "FUTOIN_EVT_SAS_SECRET"
DEFAULT_SAS_SECRET: Final = "futoin-evt.sas-secret"
SAS_SECRET_SUFFIX: Final = ".sas-secret"
ENV_LOOP: Final = "FUTOIN_EVT_LOOP"

log = logging.getLogger("futoin_evt")


class CliError(Exception):
    """A one-sentence error for the user; exits with ``exit_status`` without a traceback."""

    exit_status = 1


class BadSetting(CliError):
    """A setting the command cannot run with (an option, a file, the database): exit
    status 2, as for arguments argparse refuses."""

    exit_status = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.log_level != "debug":
        logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return int(runner.run(args.run(args)) or 0)
    except CliError as exc:
        print(f"futoin-evt: {exc}", file=sys.stderr)
        return exc.exit_status
    except StoreError as exc:  # the database cannot be opened or has a newer schema
        print(f"futoin-evt: {str(exc).rstrip('.')}.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency on Linux): it runs the
    per-call work of a loop turn (polling, reading, writing, callbacks) in C. ``None``
    (asyncio's own loop) elsewhere, or with ``FUTOIN_EVT_LOOP=asyncio``."""
    if os.environ.get(ENV_LOOP) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one sentence and exit status 2 (argparse prints its usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see --help.\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="futoin-evt", description="FutoIn FTN18 event stream server and tools.")
    parser.add_argument("--version", action="version", version=f"futoin-evt {__version__}")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the server")
    _add_db(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
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
        "--wait-for-db",
        type=float,
        default=0.0,
        metavar="T",
        help="at start, try an unreachable database again for up to T seconds "
        "(no effect on SQLite)",
    )
    serve.add_argument("--tls-cert", type=Path, help="PEM certificate: serve wss://")
    serve.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    serve.add_argument(
        "--trust-channel",
        action="store_true",
        help="treat plain ws:// from any peer as secure (TLS ends at a proxy in front)",
    )
    limits = serve.add_argument_group("limits")
    limits.add_argument(
        "--max-connections", type=int, default=DEFAULT_LIMITS.max_connections, metavar="N"
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
        "--archive", type=Path, metavar="PATH", help="copy every event to this SQLite file"
    )
    amqp = serve.add_argument_group(
        "AMQP 1.0",
        "The event log node 'events' for AMQP clients (SASL PLAIN with the same users; "
        "amqps with --tls-cert/--tls-key; needs the 'amqp' extra).",
    )
    amqp.add_argument("--amqp", metavar="HOST:PORT", help="listen for AMQP here (port 0: any)")
    amqp.add_argument(
        "--amqp-idle-timeout",
        type=float,
        default=AmqpLimits().idle_timeout,
        metavar="T",
        help="disconnect AMQP peers silent for T seconds",
    )
    _add_sas_secret(amqp)
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
        "--feed-users", metavar="U1,U2", help="only these users may read it (default: all)"
    )
    keep = serve.add_argument_group(
        "retention",
        "Events every registered consumer has read are discarded. Without registered consumers "
        "nothing is discarded, unless a --keep-* policy is set.",
    )
    keep.add_argument("--keep-events", type=int, metavar="N", help="always keep the newest N")
    keep.add_argument(
        "--keep-seconds", type=float, metavar="T", help="always keep events younger than T"
    )
    keep.add_argument(
        "--expire-consumers-after",
        type=float,
        metavar="T",
        help="drop consumers not seen for T seconds",
    )
    keep.add_argument("--discard-interval", type=float, default=1.0, metavar="T")
    keep.add_argument(
        "--discard-dcb-events",
        action="store_true",
        help="discard events appended through DCB too (kept by default: they are the record)",
    )
    serve.add_argument(
        "--dcb-path", default=DCB_PATH, metavar="PATH", help="where the DCB HTTP API is served"
    )
    serve.add_argument("--no-dcb", action="store_true", help="do not serve the DCB HTTP API")
    serve.set_defaults(run=_serve)

    user = commands.add_parser("user", help="manage users").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser("add", help="add a user; the password is read from stdin")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", required=True)
    add.add_argument("--admin", action="store_true", help="may see and manage every consumer")
    _add_db(add)
    add.set_defaults(run=_user_add)
    passwd = user.add_parser("passwd", help="set a user's password from stdin")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true", required=True)
    _add_db(passwd)
    passwd.set_defaults(run=_user_passwd)
    listing = user.add_parser("list", help="list users")
    _add_db(listing)
    listing.set_defaults(run=_user_list)
    remove = user.add_parser("remove", help="remove a user and their consumers")
    remove.add_argument("name")
    _add_db(remove)
    remove.set_defaults(run=_user_remove)
    sas = user.add_parser(
        "sas-key",
        help="print a user's shared access key, for Event Hubs clients (SharedAccessKey=); "
        "it changes with the user's password",
    )
    sas.add_argument("name")
    _add_db(sas)
    _add_sas_secret(sas)
    sas.set_defaults(run=_user_sas_key)

    add_event = commands.add_parser("add", help="add an event through a running server")
    add_event.add_argument("type", help="event type, e.g. USER_CREATED")
    add_event.add_argument("data", help="event data as JSON")
    _add_endpoint(add_event)
    add_event.set_defaults(run=_add_event)

    poll = commands.add_parser(
        "poll", help="print events of a consumer as JSON lines, acknowledging what was printed"
    )
    poll.add_argument("component", help="consumer component (registered if new), or LIVE")
    poll.add_argument("--want", help="comma-separated event types")
    poll.add_argument("--last-id", type=int, help="LIVE only: start after this id")
    poll.add_argument("--follow", action="store_true", help="keep polling for new events")
    _add_endpoint(poll)
    poll.set_defaults(run=_poll)

    tail = commands.add_parser(
        "tail", help="print events as they are pushed, as JSON lines, until interrupted"
    )
    tail.add_argument("component", nargs="?", help="consumer component (registered if new)")
    tail.add_argument("--live", action="store_true", help="new events only, no registration")
    tail.add_argument("--want", help="comma-separated event types")
    tail.add_argument(
        "--selector",
        help="with --live: only the events (and server management events) a selector matches,"
        " e.g. \"eventType = 'ORDER_PLACED' AND total > 100\"",
    )
    tail.add_argument(
        "--fields", help="with --live: print only these attributes (comma-separated), in order"
    )
    tail.add_argument(
        "--compact", action="store_true", help="with --fields: print each as a list of values"
    )
    _add_endpoint(tail)
    tail.set_defaults(run=_tail)

    events = commands.add_parser(
        "events", help="event types and their attributes, for selectors (GET-EVENTS)"
    )
    events.add_argument("--type", help="only this event type")
    events.add_argument("--json", action="store_true", help="print JSON instead of lines")
    _add_endpoint(events)
    events.set_defaults(run=_events)

    archive = commands.add_parser(
        "archive", help="copy every event from a running server to an archive SQLite file"
    )
    archive.add_argument("--out", type=Path, required=True, metavar="PATH")
    archive.add_argument("--component", default="ARCHIVE")
    _add_endpoint(archive)
    archive.set_defaults(run=_archive)

    info = commands.add_parser("info", help="stream and consumer information (lag, who holds back)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_endpoint(info)
    info.set_defaults(run=_info)

    consumer = commands.add_parser("consumer", help="list or drop consumers").add_subparsers(
        dest="consumer_command", required=True, metavar="ACTION"
    )
    listing = consumer.add_parser("list", help="your consumers (an admin sees all)")
    listing.add_argument("--json", action="store_true")
    _add_endpoint(listing)
    listing.set_defaults(run=_consumer_list)
    drop = consumer.add_parser("drop", help="unregister a consumer")
    drop.add_argument("user")
    drop.add_argument("component")
    _add_endpoint(drop)
    drop.set_defaults(run=_consumer_drop)
    return parser


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get(ENV_DB, DEFAULT_DB),
        help=f"SQLite file, or postgresql://user[:password]@host[:port]/dbname (${ENV_DB})",
    )


def _add_sas_secret(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--sas-secret",
        type=Path,
        default=os.environ.get(ENV_SAS_SECRET),
        metavar="FILE",
        help="the secret that users' shared access keys derive from; created when missing. "
        "Every server of one database uses the same file (default: the SQLite file's name "
        f"with {SAS_SECRET_SUFFIX!r} added, or {DEFAULT_SAS_SECRET} with PostgreSQL; "
        f"${ENV_SAS_SECRET})",
    )


def _add_endpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get(ENV_URL, DEFAULT_URL))
    parser.add_argument("--user", default=os.environ.get(ENV_USER))
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"read the password from stdin (default: ${ENV_PASSWORD})",
    )


# -- serve -------------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> int:
    tls = _tls_context(args.tls_cert, args.tls_key)
    for name in ("keep_events", "keep_seconds", "expire_consumers_after"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise BadSetting(f"--{name.replace('_', '-')} cannot be negative.")
    if args.discard_interval <= 0:
        raise BadSetting("--discard-interval must be above 0.")
    if args.pg_pool_size < 1:
        raise BadSetting("--pg-pool-size must be at least 1.")
    if args.pg_pool_timeout <= 0:
        raise BadSetting("--pg-pool-timeout must be above 0.")
    if args.wait_for_db < 0:
        raise BadSetting("--wait-for-db cannot be negative.")
    if not 0 <= args.port <= 65535:
        raise BadSetting(f"--port must be 0 to 65535, not {args.port}.")
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
    amqp = _amqp_config(args, tls)
    feed_users = None
    if args.feed_users is not None:
        feed_users = frozenset(u for u in args.feed_users.split(",") if u)
    config = ServerConfig(
        db=args.db,
        durability=Durability(args.durability.upper()),
        pool=PoolLimits(size=args.pg_pool_size, timeout=args.pg_pool_timeout),
        transport=TransportConfig(
            host=args.host,
            port=args.port,
            tls=tls,
            trust_channel=args.trust_channel,
            limits=Limits(
                max_frame_bytes=args.max_frame_bytes,
                max_connections=args.max_connections,
                max_calls_in_flight=args.max_calls_in_flight,
            ),
        ),
        archive_path=args.archive,
        amqp=amqp,
        feed=FeedConfig(path=None if args.no_feed else args.feed_path, users=feed_users),
        dcb_path=None if args.no_dcb else args.dcb_path,
        retention=RetentionConfig(
            interval=args.discard_interval,
            keep_events=args.keep_events,
            keep_seconds=args.keep_seconds,
            expire_consumers_after=args.expire_consumers_after,
            discard_dcb_events=args.discard_dcb_events,
        ),
    )
    try:
        server = await _start_waiting_for_db(config, args.wait_for_db)
    except OSError as exc:
        raise BadSetting(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    urls = server.url if server.amqp_url is None else f"{server.url} and {server.amqp_url}"
    where = server.store.description
    print(f"futoin-evt {__version__} listening on {urls} (database {where})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.close()
    return 0


#: Seconds between attempts to reach the database with --wait-for-db.
DB_RETRY_SECONDS: Final = 1.0


async def _start_waiting_for_db(config: ServerConfig, wait: float) -> EventServer:
    """Start the server; while the database does not answer (StoreUnreachable), try again
    every second, with a log line each time, until ``wait`` seconds have passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            return await EventServer.start(config)
        except StoreUnreachable as exc:
            left = deadline - loop.time()
            if left <= 0:
                raise
            delay = min(DB_RETRY_SECONDS, left)
            log.warning("%s; trying again in %.1f s (%.1f s left)", exc, delay, left)
            await asyncio.sleep(delay)


def _amqp_config(args: argparse.Namespace, tls: ssl.SSLContext | None) -> AmqpConfig | None:
    if args.amqp is None:
        return None
    host, sep, port = args.amqp.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or re.fullmatch(r"[0-9]{1,5}", port) is None or int(port) > 65535:
        raise BadSetting(f"--amqp must be HOST:PORT, not {args.amqp!r}.")
    if args.amqp_idle_timeout <= 0:
        raise BadSetting("--amqp-idle-timeout must be above 0.")
    try:
        import proton  # noqa: F401
    except ImportError:
        raise BadSetting(
            "--amqp needs python-qpid-proton: pip install 'futoin-evt[amqp]'"
        ) from None
    limits = AmqpLimits(max_connections=args.max_connections, idle_timeout=args.amqp_idle_timeout)
    secret = _sas_secret(args.sas_secret, args.db)
    return AmqpConfig(host=host, port=int(port), tls=tls, limits=limits, sas_secret=secret)


def _sas_secret(path: Path | None, db: str) -> bytes:
    if path is None:
        path = Path(DEFAULT_SAS_SECRET if is_postgres_url(db) else db + SAS_SECRET_SUFFIX)
    try:
        return load_secret(path, create=True)
    except SecretFileError as exc:
        raise BadSetting(f"{exc}.") from None


def _tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise BadSetting("--tls-cert and --tls-key go together.")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise BadSetting(f"cannot load the TLS certificate or key: {exc}") from None
    return context


# -- users -------------------------------------------------------------------------------------


def _read_password() -> str:
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CliError("no password on standard input.")
    return password


@contextlib.asynccontextmanager
async def _open_store(db: str) -> AsyncIterator[Store]:
    async with await open_store(db) as store:
        yield store


async def _user_add(args: argparse.Namespace) -> int:
    if not args.name or len(args.name) > 64 or ":" in args.name:
        raise CliError("a user name is 1 to 64 characters without ':'.")
    password_hash = hash_password(_read_password())
    async with _open_store(args.db) as store:
        try:
            await store.add_user(args.name, password_hash, is_admin=args.admin)
        except KeyError:
            raise CliError(f"user {args.name} exists already.") from None
    print(f"added user {args.name}")
    return 0


async def _user_passwd(args: argparse.Namespace) -> int:
    password_hash = hash_password(_read_password())
    async with _open_store(args.db) as store:
        if not await store.set_password(args.name, password_hash):
            raise CliError(f"no user {args.name}.")
    print(f"password of {args.name} changed")
    return 0


async def _user_list(args: argparse.Namespace) -> int:
    async with _open_store(args.db) as store:
        for user in await store.list_users():
            print(f"{user.name}{' (admin)' if user.is_admin else ''}")
    return 0


async def _user_sas_key(args: argparse.Namespace) -> int:
    secret = _sas_secret(args.sas_secret, args.db)
    async with _open_store(args.db) as store:
        user = await store.get_user(args.name)
    if user is None:
        raise CliError(f"no user {args.name}.")
    print(sas_key(secret, user))
    return 0


async def _user_remove(args: argparse.Namespace) -> int:
    async with _open_store(args.db) as store:
        if not await store.remove_user(args.name):
            raise CliError(f"no user {args.name}.")
    print(f"removed user {args.name}")
    return 0


# -- small clients -----------------------------------------------------------------------------


def configure_logging(level: str) -> None:
    """Log lines on stderr at ``level`` (debug, info, warning); shared by the commands."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def read_credentials(args: argparse.Namespace) -> tuple[str, str]:
    """(user, password) from ``--user``/``$FUTOIN_EVT_USER`` and ``--password-stdin``/
    ``$FUTOIN_EVT_PASSWORD``; CliError when either is missing."""
    if not args.user:
        raise CliError(f"no user given: use --user or ${ENV_USER}.")
    password = _read_password() if args.password_stdin else os.environ.get(ENV_PASSWORD)
    if password is None:
        raise CliError(f"no password given: use --password-stdin or ${ENV_PASSWORD}.")
    return args.user, password


def _credentials(args: argparse.Namespace) -> str:
    return ":".join(read_credentials(args))


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> Any:
    credentials = _credentials(args)
    try:
        client = await EventStreamClient.connect(args.url, credentials=credentials)
    except CommError as exc:
        raise CliError(f"{exc}.") from None
    except Exception as exc:  # a URL that is not ws:// or wss://
        raise CliError(f"cannot connect to {args.url}: {exc}") from None
    try:
        async with client:
            yield client
    except RemoteError as exc:
        raise CliError(f"the server refused: {exc.name}: {exc.desc}") from None
    except CommError as exc:
        raise CliError(f"lost the connection to {args.url}: {exc}") from None


async def _add_event(args: argparse.Namespace) -> int:
    try:
        data = decode_json(args.data)
    except ValueError as exc:
        raise CliError(f"event data is not valid JSON: {exc}") from None
    async with _client(args) as client:
        print(await client.add_event(args.type, data))
    return 0


async def _poll(args: argparse.Namespace) -> int:
    want = [t for t in args.want.split(",") if t] if args.want else None
    live = args.component == LIVE_COMPONENT
    if args.last_id is not None and not live:
        raise CliError("--last-id is for LIVE; a registered consumer resumes where it stopped.")
    async with _client(args) as client:
        if not live:
            await client.register_consumer(args.component)
        last_id = args.last_id
        delay = 0.05
        while True:
            events = await client.poll_events(args.component, last_id, want)
            for event in events:
                _print_json(
                    {"id": str(event.id), "type": event.type, "data": event.data, "ts": event.ts}
                )
            sys.stdout.flush()
            if events:
                last_id = events[-1].id
                delay = 0.05
                continue
            # The empty poll above acknowledged everything printed so far.
            if not args.follow:
                return 0
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _tail(args: argparse.Namespace) -> int:
    if args.live == bool(args.component):
        raise CliError("give a COMPONENT, or --live, but not both.")
    if args.selector is not None or args.fields is not None or args.compact:
        return await _tail_selected(args)
    want = [t for t in args.want.split(",") if t] if args.want else None
    credentials = _credentials(args)

    async def show(events: list[Event]) -> None:
        for event in events:
            _print_json({"id": str(event.id), "type": event.type, "data": event.data,
                         "ts": event.ts})  # fmt: skip
        sys.stdout.flush()

    receiver: Receiver
    if args.live:
        receiver = LiveReceiver(args.url, credentials=credentials, on_events=show, want=want)
    else:
        receiver = ReliableReceiver(
            args.url, credentials=credentials, component=args.component, on_events=show, want=want
        )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, receiver.stop)
    await receiver.run()
    return 0


async def _tail_selected(args: argparse.Namespace) -> int:
    """``tail --live --selector/--fields``: the notifications of a selector subscription."""
    if not args.live:
        raise BadSetting("--selector, --fields and --compact go with --live.")
    if args.want:
        raise BadSetting(
            "--want and --selector do not go together: name the types in the selector."
        )
    if args.compact and args.fields is None:
        raise BadSetting("--compact needs --fields: the values are printed in their order.")
    fields = None
    if args.fields is not None:
        fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    try:
        if args.selector is not None:
            compile_selector(args.selector)
        if fields is not None:
            Transformation.parse({"requestedAttributes": fields})
    except NotifyError as exc:
        raise BadSetting(f"{exc}.") from None
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with _client(args) as client:
        notifications = Notifications(client.ftn3)
        queue = await notifications.subscribe(args.selector, fields, compact=args.compact)
        print("futoin-evt: subscribed; printing notifications until interrupted", file=sys.stderr)
        sys.stderr.flush()
        closed = asyncio.ensure_future(client.ftn3.wait_closed())
        stopping = asyncio.ensure_future(stopped.wait())
        while True:
            message = asyncio.ensure_future(queue.get())
            await asyncio.wait({message, closed, stopping}, return_when="FIRST_COMPLETED")
            if not message.done():
                message.cancel()
                break
            _print_json(_printed(message.result(), fields, args.compact))
            sys.stdout.flush()
        stopping.cancel()
        if closed.done() and not stopped.is_set():
            raise CliError(f"lost the connection to {args.url}.")
    return 0


def _printed(message: dict[str, Any], fields: list[str] | None, compact: bool) -> Any:
    """A notification as printed: the requested attributes (with --compact their values
    alone), or every attribute and the event's data."""
    if compact:
        return message.get("body")
    properties = dict(message.get("properties") or {})
    if fields is None:
        return {**properties, "data": message.get("body")}
    return properties


async def _events(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        types = await Notifications(client.ftn3).event_types(args.type)
    if args.json:
        _print_json(types)
    elif args.type is not None and not types:
        raise CliError(f"no event type {args.type} is known.")
    else:
        for name, attributes in sorted(types.items()):
            print(f"{name}: {', '.join(attributes)}")
    return 0


async def _archive(args: argparse.Namespace) -> int:
    try:
        archiver = RemoteArchiver(args.url, _credentials(args), args.out, args.component)
    except sqlite3.Error as exc:
        raise BadSetting(f"cannot open the archive {args.out}: {exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, archiver.stop)
    await archiver.run()
    return 0


async def _info(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        stream = await client.ftn3.call(OPS, "streamInfo", {})
        consumers = await client.ftn3.call(OPS, "listConsumers", {})
    if args.json:
        _print_json({"stream": stream, "consumers": consumers})
        return 0
    held = stream.get("held_back_by")
    print(
        f"events {stream['events']}: ids {stream.get('first_id', '-')} .. "
        f"{stream.get('last_id', '-')} ({stream.get('first_ts', '-')} .. "
        f"{stream.get('last_ts', '-')})"
    )
    print(
        f"discarded {stream['discarded_total']}; may discard up to "
        f"{stream.get('discard_up_to', '-')}; held back by "
        f"{held['user'] + '/' + held['component'] if held else '-'}"
    )
    for expired in stream["expired_consumers"]:
        print(f"expired: {expired['user']}/{expired['component']}")
    print()
    _print_consumers(consumers)
    return 0


def _print_consumers(consumers: list[dict[str, Any]]) -> None:
    header = (
        "USER", "COMPONENT", "POSITION", "BEHIND", "OLDEST_UNREAD_S", "LAST_SEEN", "PUSH",
        "RETRYING",
    )  # fmt: skip
    rows = [header] + [_consumer_row(c) for c in consumers]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def _consumer_row(c: dict[str, Any]) -> tuple[str, ...]:
    return (
        c["user"],
        c["component"],
        c.get("position", "-"),
        str(c["behind"]),
        str(c.get("oldest_unread_age", "-")),
        c["last_seen"],
        "connected" if c["push_connected"] else "-",
        str(c["push_retrying"]),
    )


async def _consumer_list(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        consumers = await client.ftn3.call(OPS, "listConsumers", {})
    if args.json:
        _print_json(consumers)
    else:
        _print_consumers(consumers)
    return 0


async def _consumer_drop(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await client.ftn3.call(
            OPS, "dropConsumer", {"user": args.user, "component": args.component}
        )
    print(f"dropped consumer {args.component} of user {args.user}")
    return 0


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
