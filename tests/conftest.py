"""Shared fixtures: a real server on 127.0.0.1 over a real SQLite file, clients, the JS peer."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from hypothesis import settings

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage import open_store
from futoin_evt.storage.base import Store
from tests import nethosts
from tests.faultfs import FaultFS, unavailable

from .support.cli import admin_server  # noqa: F401 (a fixture)
from .support.console import browser, page, servers, shots, worker  # noqa: F401 (fixtures)
from .support.notify import streams_server  # noqa: F401 (a fixture)
from .support.servers import (
    ROOT,
    USERS,
    ClientFactory,
    ServerFactory,
    ServerProcess,
    add_user,
)
from .support.sql import PgCluster

JS_DIR = ROOT / "tests" / "js"
NPM_CACHE = ROOT / ".cache" / "npm"
TRANSPORT_OPTIONS = {"host", "tls", "trust_channel", "limits"}
#: ``futoin-evt serve`` started by the tests runs one process unless a test asks for more
#: (tests/test_workers.py) or the whole suite runs with FUTOIN_EVT_WORKERS=2.
os.environ.setdefault("FUTOIN_EVT_WORKERS", "1")
#: The worker counts the tests that matter (crash, takeover, commit order, notification) run
#: ``futoin-evt serve`` with, whatever the suite's default: one process, and a supervisor
#: with two workers.
WORKER_COUNTS = (1, 2)


@pytest.fixture(scope="session")
def password_hashes() -> dict[str, str]:
    return {name: hash_password(password) for name, password in USERS.items()}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "events.sqlite"


@pytest.fixture
async def start_server(
    db_path: Path, password_hashes: dict[str, str]
) -> AsyncIterator[ServerFactory]:
    """Start servers on free ports (closed at the end); users alice and bob exist."""
    started: list[EventServer] = []

    async def start(**options: Any) -> EventServer:
        """Options of TransportConfig (host, limits, ...) or of ServerConfig (``db``: another
        database than the test's SQLite file)."""
        transport = {k: options.pop(k) for k in list(options) if k in TRANSPORT_OPTIONS}
        config = ServerConfig(
            db=options.pop("db", db_path),
            transport=TransportConfig(port=0, **transport),
            check_results=True,
            # discarding runs when a test asks for it (server.discarder.discard())
            retention=RetentionConfig(interval=3600),
            **options,
        )
        server = await EventServer.start(config)
        started.append(server)
        existing = {user.name for user in await server.store.list_users()}
        for name, password_hash in password_hashes.items():
            if name not in existing:
                await add_user(server.store, name, password_hash)
        await server.access.changed_here()
        return server

    yield start
    for server in reversed(started):
        await server.close()


@pytest.fixture
async def server(start_server: ServerFactory) -> EventServer:
    return await start_server()


@pytest.fixture
async def amqp_server(start_server: ServerFactory) -> EventServer:
    """A server with the AMQP door on a free port."""
    return await start_server(amqp=AmqpConfig(port=0))


@pytest.fixture
async def connect(server: EventServer) -> AsyncIterator[ClientFactory]:
    """Open clients to ``server`` as a user (closed at the end)."""
    clients: list[EventStreamClient] = []

    async def open_client(user: str = "alice", password: str | None = None) -> EventStreamClient:
        secret = USERS[user] if password is None else password
        client = await EventStreamClient.connect(server.url, credentials=f"{user}:{secret}")
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()


@pytest.fixture
async def alice(connect: ClientFactory) -> EventStreamClient:
    return await connect("alice")


@pytest.fixture
async def bob(connect: ClientFactory) -> EventStreamClient:
    return await connect("bob")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that authenticates as alice (Basic)."""
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as client:
        yield client


# -- the official JavaScript client -------------------------------------------------------------


@pytest.fixture(scope="session")
def js_peer() -> Path:
    """The official FutoIn JS packages, installed once into tests/js/node_modules."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the interop tests")
    stamp = JS_DIR / "node_modules" / ".installed-from"
    wanted = (JS_DIR / "package.json").read_text()
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--cache",
                str(NPM_CACHE),
            ],
            cwd=JS_DIR,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
        stamp.write_text(wanted)
    return JS_DIR


@pytest.fixture(params=WORKER_COUNTS, ids=lambda count: f"workers{count}")
def serve_workers(request: pytest.FixtureRequest) -> int:
    """``--workers`` of the ``futoin-evt serve`` processes a test starts: 1, then 2."""
    return int(request.param)


@pytest.fixture
def processes() -> Iterator[list[ServerProcess]]:
    """Server processes a test starts: those still running are killed after it."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        if process.proc.poll() is None:
            process.kill()


# -- PostgreSQL ----------------------------------------------------------------------------------

PG_ENV = "FUTOIN_EVT_TEST_PG"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A new database with a random name on the PostgreSQL that ``$FUTOIN_EVT_TEST_PG`` names
    (default: 127.0.0.1:5432, user postgres), dropped at the end. Skips when none is
    reachable, except under CI, where PostgreSQL tests must run."""
    import psycopg

    admin = os.environ.get(PG_ENV, DEFAULT_PG)
    try:
        conn = psycopg.connect(admin, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = (
            f"PostgreSQL is not reachable ({reason}): start it with `pg_ctlcluster "
            f"--skip-systemctl-redirect <version> main start` or set {PG_ENV} to a URL"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    name = f"futoin_evt_test_{secrets.token_hex(6)}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin)._replace(path="/" + name))
    finally:
        # a new connection: the outage tests restart the server under the session
        with psycopg.connect(admin, autocommit=True, connect_timeout=30) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The test database, emptied: each test starts without tables."""
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def store_db(request: pytest.FixtureRequest, db_path: Path) -> str:
    """A database for each backend: a new SQLite file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    """The store of ``store_db`` (each backend), opened by the test itself."""
    async with await open_store(store_db) as opened:
        yield opened


@pytest.fixture
def pg_cluster(pg_database: str) -> Iterator[PgCluster]:
    """Control of the cluster that serves the test database (found by its port with
    ``pg_lsclusters``), for the outage tests; whatever the test does, the cluster runs
    again at its end. Skips when that cluster is not local, except under CI."""
    parts = urlsplit(pg_database)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    found = None
    if host in ("127.0.0.1", "localhost", "::1") and shutil.which("pg_lsclusters"):
        listing = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
        ).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == str(port):
                found = PgCluster(fields[0], fields[1], host, port)
    if found is None:
        message = f"no local cluster (pg_lsclusters) serves PostgreSQL on {host}:{port}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield found
    finally:
        if not found.is_ready():
            found.control("start", check=False)  # (it may be starting already)


# -- property-based tests -----------------------------------------------------------------------

# The default profile keeps CI bounded; `pytest --hypothesis-profile=long` explores much more.
# No deadline in either: how long one example takes is not what these tests assert, and a busy
# machine must not fail them.
settings.register_profile("default", deadline=None)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile("default")


# -- the power-loss filesystem -------------------------------------------------------------------


@pytest.fixture
def needs_fuse() -> None:
    """Skips with one line where FUSE, Debian's fuse3 or mfusepy is missing, except under CI
    (.ci/run installs them), where it fails."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def faultfs(needs_fuse: None, tmp_path: Path) -> Iterator[FaultFS]:
    """The power-loss filesystem (tests/faultfs) mounted over a new directory."""
    with FaultFS(tmp_path / "faultfs") as fs:
        yield fs


# -- test hosts in network namespaces --------------------------------------------------------------


@pytest.fixture
def needs_nethosts() -> None:
    """Skips with one line where network namespaces, iptables or PostgreSQL's server are
    missing (or not root), except under CI (.ci/run installs them), where it fails."""
    reason = nethosts.unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
