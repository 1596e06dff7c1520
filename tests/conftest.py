"""Shared fixtures: a real server on 127.0.0.1 over a real SQLite file, clients, the JS peer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import settings

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.rights import Right
from futoin_evt.domain.stream import UserId
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage.base import Store
from tests import nethosts
from tests.faultfs import FaultFS, unavailable

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "js"
NPM_CACHE = ROOT / ".cache" / "npm"
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
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


#: What the tests' users may do unless a test says otherwise: what every user could do before
#: rights per stream (tests of rights grant their own).
TEST_RIGHTS: Final = Right.READ | Right.WRITE


async def add_user(
    store: Store, name: str, password_hash: str, *, is_admin: bool = False
) -> UserId:
    """A user with :data:`TEST_RIGHTS` on every stream."""
    user_id = await store.add_user(name, password_hash, is_admin=is_admin)
    await store.grant(user_id, "*", int(TEST_RIGHTS))
    return user_id


ServerFactory = Callable[..., Awaitable[EventServer]]


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


ClientFactory = Callable[..., Awaitable[EventStreamClient]]


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(params=WORKER_COUNTS, ids=lambda count: f"workers{count}")
def serve_workers(request: pytest.FixtureRequest) -> int:
    """``--workers`` of the ``futoin-evt serve`` processes a test starts: 1, then 2."""
    return int(request.param)


class ServerProcess:
    """``futoin-evt serve`` as its own process, as an operator runs it, in a session of its
    own: :meth:`kill` kills the supervisor and its workers at once. ``workers``: the
    ``--workers`` option (default: ``$FUTOIN_EVT_WORKERS``)."""

    def __init__(
        self,
        db: str | Path,
        port: int = 0,
        *extra: str,
        log_level: str = "warning",
        workers: int | None = None,
    ) -> None:
        self.db = db
        if workers is not None:
            extra = ("--workers", str(workers), *extra)
        # The log goes to a file: a pipe nobody reads would stop the server once it is full.
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "futoin_evt", "--log-level", log_level, "serve",
             "--db", str(db), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"ws://\S+", line)
        if match is None:
            self.proc.communicate(timeout=30)
            raise AssertionError(f"no URL in {line!r}; stderr: {self.logged()}")
        self.line = line
        self.url = match.group(0)
        try:
            self.port = int(self.url.rsplit(":", 1)[1].strip("/"))
        except ValueError:
            self.kill()  # not left running when the start-up line is not understood
            raise
        amqp = re.search(r"amqps?://\S+", line)
        self.amqp_url = amqp.group(0) if amqp else None

    def logged(self) -> str:
        """What the server logged so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        """SIGTERM, as an operator stops it; returns the exit code."""
        return self.stop_and_read_log(timeout=30)[0]

    def stop_and_read_log(self, timeout: float) -> tuple[int, str]:
        """SIGTERM; the exit code and everything the server logged."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=timeout)  # also closes the pipes
        logged = self.logged()
        self.log.close()
        return self.proc.returncode, logged

    def kill(self) -> None:
        """SIGKILL to the process and its workers at once: a crash of the whole server."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=30)
        self.log.close()


@pytest.fixture
def processes() -> Iterator[list[ServerProcess]]:
    """Server processes a test starts: those still running are killed after it."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        if process.proc.poll() is None:
            process.kill()


def run_without(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The command line, run with ``module`` missing (as if it were not installed)."""
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from futoin_evt.cli import main\n"
        f"sys.exit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


async def run_js(js_dir: Path, script: str, scenario: dict[str, Any]) -> list[Any]:
    """Run a script of tests/js with a JSON scenario; return its JSON output lines."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        script,
        json.dumps(scenario),
        cwd=js_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


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


def pg_schema_at(url: str, version: int) -> None:
    """Make the empty database ``url`` as a release at schema ``version`` left it (the
    migration steps stay in the code)."""
    import psycopg

    from futoin_evt.storage.postgres.schema import MIGRATIONS

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for step in range(1, version + 1):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))


class PgCluster:
    """The PostgreSQL cluster (Debian's pg_ctlcluster) that serves the test database."""

    def __init__(self, version: str, name: str, host: str, port: int) -> None:
        self.version, self.name, self.host, self.port = version, name, host, port

    def control(self, action: str, *, check: bool = True) -> None:
        """``restart``, ``stop`` or ``start`` (fast mode: connections are cut); returns once
        the cluster answers again (or, for ``stop``, has stopped)."""
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action],
            check=check,
            capture_output=True,
            timeout=120,
        )
        if action != "stop":
            self.wait_ready()

    def is_ready(self) -> bool:
        ready = subprocess.run(
            ["pg_isready", "-q", "-h", self.host, "-p", str(self.port), "-t", "1"],
            check=False,
            timeout=30,
        )
        return ready.returncode == 0

    def wait_ready(self, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while not self.is_ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"PostgreSQL on port {self.port} not ready in {seconds} s")
            time.sleep(0.1)  # between probes; each probe itself waits up to 1 s


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


def execute_sql(db: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the database outside any store (``?`` placeholders)."""
    if db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description is not None else []
    with sqlite3.connect(db, isolation_level=None) as conn:
        return conn.execute(sql, params).fetchall()


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
