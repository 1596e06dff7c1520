"""The checks ``futoin-evt serve`` makes before it starts: the addresses it listens on,
the ports, the database file, and the database's answer (waited for with
``--wait-for-db``) and start check."""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sqlite3
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeVar

from ..amqp import AmqpConfig
from ..kafka.config import KafkaConfig
from ..server.app import ServerConfig
from ..storage import is_postgres_url, open_store, start_check
from ..storage.errors import StoreUnreachable
from .common import BadSetting, logger


def address(host: str, port: int) -> str:
    """``host:port`` as a message names it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Where ``--metrics PORT`` listens: this machine only (/metrics names every stream and
#: consumer; ``--metrics 0.0.0.0:PORT`` opens it wider, ``--metrics-user`` asks a password).
METRICS_HOST: Final = "127.0.0.1"


def host_port(option: str, value: str) -> tuple[str, int]:
    """``value`` of ``option`` as ``HOST:PORT`` (an IPv6 host may be in brackets)."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or re.fullmatch(r"[0-9]{1,5}", port) is None or int(port) > 65535:
        raise BadSetting(f"{option} must be HOST:PORT, not {value!r}.")
    return host, int(port)


def metrics_address(value: str | None) -> tuple[str, int] | None:
    """``--metrics``: ``HOST:PORT``, or a port alone on :data:`METRICS_HOST`."""
    if value is None:
        return None
    if re.fullmatch(r":?[0-9]{1,5}", value) is not None:  # PORT alone: this machine only
        value = f"{METRICS_HOST}:{value.lstrip(':')}"
    address = host_port("--metrics", value)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise BadSetting(
            "--metrics needs prometheus-client: pip install 'futoin-evt[metrics]'"
        ) from None
    return address


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The server's TLS from ``--tls-cert`` and ``--tls-key`` (both or neither)."""
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


def listeners(
    args: argparse.Namespace,
    amqp: AmqpConfig | None,
    metrics: tuple[str, int] | None,
    kafka: KafkaConfig | None = None,
) -> list[tuple[str, str, int]]:
    """(option, host, port) of every port ``serve`` listens on."""
    found = [("--port", args.host, args.port)]
    if amqp is not None:
        found.append(("--amqp", amqp.host, amqp.port))
    if kafka is not None:
        found.append(("--kafka", kafka.host, kafka.port))
    if metrics is not None:
        found.append(("--metrics", *metrics))
    return found


def port_taken(option: str, host: str, port: int, exc: OSError) -> BadSetting:
    said = str(exc.strerror or exc).rstrip(".")
    return BadSetting(f"cannot listen on {address(host, port)} ({option}): {said}.")


def check_ports(ports: list[tuple[str, str, int]]) -> None:
    """Each port is bound (and let go) before anything is made, so a port in use is
    refused naming that port and its option, and leaves no database file behind. Port 0
    (any free one) cannot be taken."""
    seen: dict[tuple[str, int], str] = {}
    for option, host, port in ports:
        if port and (host, port) in seen:
            raise BadSetting(f"{seen[host, port]} and {option} name the same port, {port}.")
        seen[host, port] = option
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, _, _, _, sockaddr in infos:
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio
                    if family == socket.AF_INET6:
                        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    probe.bind(sockaddr[:2])
        except OSError as exc:
            raise port_taken(option, host, port, exc) from None


#: The first 16 bytes of every SQLite database file.
SQLITE_HEADER: Final = b"SQLite format 3\x00"
#: Tables every futoin-evt SQLite database has had since its first schema.
OWN_TABLES: Final = frozenset({"events", "meta"})


def check_db_file(db: str) -> None:
    """``--db`` as a SQLite file ``serve`` can use, checked before anything is made: a
    directory, a file that cannot be read or written, a file that is not a SQLite database
    and another program's database are each refused in a sentence of their own (exit 2),
    and left as they are. A futoin-evt file whose pages fail their checks is the start
    check's to call damaged (:func:`run_start_check`)."""
    if is_postgres_url(db):
        return
    path = Path(db)
    if path.is_dir():
        raise BadSetting(
            f"--db {db} is a directory, not a database file: give a file's path (a new"
            " database is made there when there is no file)."
        )
    if not path.exists():
        if not path.parent.is_dir():
            raise BadSetting(f"--db {db} cannot be made: there is no directory {path.parent}.")
        return
    if not path.is_file():
        raise BadSetting(f"--db {db} is not a regular file, so it cannot be a database.")
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise BadSetting(f"cannot read --db {db}: {exc.strerror or exc}.") from None
    if header and header != SQLITE_HEADER:
        raise BadSetting(
            f"--db {db} is not a SQLite database (it does not begin as one): give another"
            " file; this one was left as it is."
        )
    tables = sqlite_tables(path) if header else None
    if tables and OWN_TABLES.isdisjoint(tables):
        raise BadSetting(
            f"--db {db} is another program's SQLite database (it has none of futoin-evt's"
            " tables): give another file; this one was left as it is."
        )
    try:
        with path.open("r+b"):
            pass
    except OSError as exc:
        raise BadSetting(f"cannot write --db {db}: {exc.strerror or exc}.") from None


def sqlite_tables(path: Path) -> frozenset[str] | None:
    """The tables of a SQLite file, read only; None when they cannot be read (a damaged
    file, said by the start check, or one locked for long)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return frozenset(str(row[0]) for row in rows)


#: Seconds SQLite's quick check of the file may take at start: about a GB (it read 1 GB in
#: 1 s from the page cache, 30 s from a cold disk, on the test machine).
DEFAULT_START_CHECK: Final = 2.0
#: Seconds between attempts to reach the database with --wait-for-db.
DB_RETRY_SECONDS: Final = 1.0


_T = TypeVar("_T")


async def waiting_for_db(start: Callable[[], Awaitable[_T]], wait: float) -> _T:
    """``start()``; while the database does not answer (StoreUnreachable), try again
    every second, with a log line each time, until ``wait`` seconds have passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            return await start()
        except StoreUnreachable as exc:
            left = deadline - loop.time()
            if left <= 0:
                raise
            delay = min(DB_RETRY_SECONDS, left)
            logger.warning("%s; trying again in %.1f s (%.1f s left)", exc, delay, left)
            await asyncio.sleep(delay)


async def run_start_check(db: str, seconds: float) -> None:
    """SQLite's quick check of the file, bounded in time; a damaged file is refused
    (:class:`~futoin_evt.storage.errors.StoreDamaged`: one line, exit 2)."""
    started = time.monotonic()
    if await start_check(db, seconds):
        logger.debug("quick check of %s: ok in %.2f s", db, time.monotonic() - started)
    else:
        logger.info(
            "quick check of %s stopped after %.1f s, before the end of the file (a large"
            " file: --start-check sets the time; futoin-evt check --db checks it all)",
            db,
            seconds,
        )


async def migrated(config: ServerConfig) -> tuple[bool, str]:
    """Open the database once (migrating it), so the workers do not race to; whether it
    has users, and its description (without a password)."""
    store = await open_store(config.db, durability=config.durability, pool=config.pool)
    try:
        return bool(await store.list_users()), store.description
    finally:
        await store.close()
