"""What the commands share: settings from the environment, errors, the database and the
connection to a server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import os
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, ClassVar, Final, NoReturn, TypeAlias, TypeVar

from ..auth.sas import SecretFileError, load_secret
from ..client.aio import OPS, CommError, EventStreamClient, RemoteError
from ..domain.partition import DEFAULT_STREAM, MAX_PARTITIONS, check_stream_name
from ..server.app import DEFAULT_DB
from ..stats import CONNECTION
from ..storage import is_postgres_url, open_store
from ..storage.base import Store

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
ENV_WORKERS: Final = "FUTOIN_EVT_WORKERS"

logger = logging.getLogger("futoin_evt")


class ManualFormatter(argparse.HelpFormatter):
    """``--help`` as the manual: an option whose help does not say its default gets
    ``(default: VALUE)`` added, when it has one (flags are off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and action.nargs != 0
            and "default" not in text
            and default not in (None, argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


class _CommandsAction(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose one-line ``help`` (in the list of commands) is also the description
    their own ``--help`` opens with."""

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        summary = kwargs.get("help")
        if summary and "description" not in kwargs:
            kwargs["description"] = summary[0].upper() + summary[1:] + "."
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """Bad arguments: one sentence and exit status 2 (argparse prints its usage too); help
    formatted by :class:`ManualFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", ManualFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _CommandsAction)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see --help.\n")


#: What a command group adds its commands to.
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


class CliError(Exception):
    """A one-sentence error for the user; exits with ``exit_status`` without a traceback."""

    exit_status = 1


class BadSetting(CliError):
    """A setting the command cannot run with (an option, a file, the database): exit
    status 2, as for arguments argparse refuses."""

    exit_status = 2


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


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get(ENV_DB, DEFAULT_DB),
        metavar="PATH|URL",
        help="SQLite file, or postgresql://user[:password]@host[:port]/dbname "
        f"(default: ${ENV_DB}, else {DEFAULT_DB})",
    )


def add_sas_secret(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
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


def add_endpoint(parser: argparse.ArgumentParser, *, partitioned: bool = False) -> None:
    """``--url`` of the server and the user's credentials; ``partitioned``: ``--stream`` and
    ``--partition`` too, which pick the URL's path (see :func:`stream_url`)."""
    parser.add_argument(
        "--url",
        default=os.environ.get(ENV_URL, DEFAULT_URL),
        help="the server's ws:// or wss:// URL; its path names a stream and partition "
        f"(/NAME/P) unless --stream says (default: ${ENV_URL}, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--user", help=f"the user to log in as (default: ${ENV_USER})", default=_env_user()
    )
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"read the password from stdin (default: ${ENV_PASSWORD})",
    )
    if partitioned:
        add_stream_target(
            parser,
            stream_help="the stream (default: that of --url's path, else events)",
            partition_help="the partition (default: that of --url's path, else 0; on a stream "
            "of several partitions without it, add spreads connections over them round robin "
            "and poll and tail are refused naming the partitions)",
        )


def _env_user() -> str | None:
    return os.environ.get(ENV_USER)


def add_stream_target(
    parser: argparse.ArgumentParser, *, stream_help: str, partition_help: str
) -> None:
    """``--stream NAME`` and ``--partition P``."""
    parser.add_argument("--stream", metavar="NAME", help=stream_help)
    parser.add_argument("--partition", type=int, metavar="P", help=partition_help)


def stream_url(args: argparse.Namespace) -> str:
    """``--url`` with its path set by ``--stream`` and ``--partition`` (``/NAME`` or
    ``/NAME/P``; the URL's own stream when only ``--partition`` is given); bad ones exit 2
    before anything is sent."""
    url: str = args.url
    if args.stream is None and args.partition is None:
        return url
    parts = urllib.parse.urlsplit(url)
    path = [part for part in parts.path.split("/") if part]
    name = args.stream if args.stream is not None else (path[0] if path else DEFAULT_STREAM)
    try:
        check_stream_name(name)
    except ValueError as exc:
        raise BadSetting(f"{exc}.") from None
    target = f"/{name}"
    if args.partition is not None:
        target += f"/{checked_partition(args.partition)}"
    return urllib.parse.urlunsplit(parts._replace(path=target))


def checked_partition(number: int) -> int:
    """``--partition``'s number, or exit 2 before anything is sent."""
    if not 0 <= number < MAX_PARTITIONS:
        raise BadSetting(f"--partition must be 0 to {MAX_PARTITIONS - 1}, not {number}.")
    return number


def sas_secret(path: Path | None, db: str) -> bytes:
    if path is None:
        path = Path(DEFAULT_SAS_SECRET if is_postgres_url(db) else db + SAS_SECRET_SUFFIX)
    try:
        return load_secret(path, create=True)
    except SecretFileError as exc:
        raise BadSetting(f"{exc}.") from None


def read_password() -> str:
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CliError("no password on standard input.")
    return password


class _DeprecatedUser(argparse.Action):
    """``--user`` where the acting user is ``--as`` (the command names a user of its own):
    it still works, and says it is deprecated."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: --user is deprecated here, use --as (the user who acts).",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_where(parser: argparse.ArgumentParser, *, acting: str = "--user") -> None:
    """``--db`` (the default), or ``--url`` of a running server with its credentials.
    ``acting="--as"``: the user who logs in is ``--as`` (for commands that name another
    user), with ``--user`` a hidden, deprecated alias."""
    add_db(parser)
    parser.add_argument(
        "--url",
        help="a running server's ws:// URL: act through its ops iface (default: none, act on --db)",
    )
    parser.add_argument(
        acting,
        dest="user",
        metavar="USER",
        default=_env_user(),
        help=f"with --url: the user who acts, logged in as (default: ${ENV_USER})",
    )
    if acting != "--user":
        parser.add_argument(
            "--user", dest="user", action=_DeprecatedUser, default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )  # fmt: skip
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"with --url: read the password from stdin (default: ${ENV_PASSWORD})",
    )


@contextlib.asynccontextmanager
async def opened_store(db: str) -> AsyncIterator[Store]:
    async with await open_store(db) as store:
        yield store


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log lines on stderr at ``level`` (debug, info, warning); shared by the commands.
    ``log_format`` ``json``: one JSON object per line (:class:`JsonFormatter`)."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())


class _WorkerTag(logging.Filter):
    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


def tag_logs(worker: int) -> None:
    """Every log line of this process names its worker (``serve --workers``): after the
    level in text, as ``worker`` in JSON."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerTag(worker))
        if not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(
                logging.Formatter(
                    "%(asctime)s %(levelname)s worker %(worker)s %(name)s: %(message)s"
                )
            )


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
    ``exception`` when there is one, and ``peer``, ``user``, ``door`` of the connection being
    served where there is one (set by the doors, see :data:`futoin_evt.stats.CONNECTION`)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        worker = getattr(record, "worker", None)
        if worker is not None:
            entry["worker"] = worker
        connection = CONNECTION.get()
        if connection is not None:
            entry["door"], entry["peer"], user = connection
            if user is not None:
                entry["user"] = user
        return json.dumps(entry, ensure_ascii=False)


def read_credentials(args: argparse.Namespace) -> tuple[str, str]:
    """(user, password) from ``--user``/``$FUTOIN_EVT_USER`` and ``--password-stdin``/
    ``$FUTOIN_EVT_PASSWORD``; CliError when either is missing."""
    if not args.user:
        option = getattr(args, "acting_option", "--user")
        raise CliError(f"no user given: use {option} or ${ENV_USER}.")
    password = read_password() if args.password_stdin else os.environ.get(ENV_PASSWORD)
    if password is None:
        raise CliError(f"no password given: use --password-stdin or ${ENV_PASSWORD}.")
    return args.user, password


def user_credentials(args: argparse.Namespace) -> str:
    return ":".join(read_credentials(args))


@contextlib.asynccontextmanager
async def connected_client(args: argparse.Namespace) -> Any:
    credentials = user_credentials(args)
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


class OnServer:
    """Calls of the ops iface on a running server (``--url``): the server's refusals named
    in :attr:`bad_input` exit 2 (:class:`BadSetting`), as the same input does on ``--db``;
    any other exits 1."""

    #: The ops iface's errors that say the input was bad.
    bad_input: ClassVar[tuple[str, ...]] = ()

    def __init__(self, client: Any) -> None:
        self._client = client

    async def call(self, func: str, params: dict[str, Any]) -> Any:
        try:
            return await self._client.ftn3.call(OPS, func, params)
        except RemoteError as exc:
            if exc.name in self.bad_input:
                raise BadSetting(f"{exc.desc}.") from None
            raise


_Acting = TypeVar("_Acting")


@contextlib.asynccontextmanager
async def acting_where(
    args: argparse.Namespace,
    on_server: Callable[[Any], _Acting],
    in_database: Callable[[Store], _Acting],
) -> AsyncIterator[_Acting]:
    """Where a command of :func:`add_where` acts: ``on_server(client)`` with ``--url``,
    else ``in_database(store)`` on ``--db``."""
    if args.url is not None:
        async with connected_client(args) as client:
            yield on_server(client)
    else:
        async with opened_store(args.db) as store:
            yield in_database(store)


def print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
