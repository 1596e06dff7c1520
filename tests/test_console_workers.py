"""The web console behind ``serve --workers 2`` and behind two ``serve`` processes on one
PostgreSQL database: its sessions are the database's, so a login, a logout, the bound on
sessions and their idle time hold on every worker and process, and survive a restart.

Each request goes to the worker the test means: an HTTP connection is kept alive, and the
worker that took it is read from its debug log (it logs each HTTP request's peer before it
answers)."""

from __future__ import annotations

import asyncio
import http.client
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from urllib.parse import urlencode, urlsplit

import pytest

from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.storage import open_store

from .conftest import USERS, ServerProcess, add_user, execute_sql
from .test_push import Collector, running, stop
from .test_workers import WITHIN_SECONDS, Group, until

pytestmark = pytest.mark.functional

COOKIE = "futoin_evt_console"
ALICE = {"user": "alice", "password": USERS["alice"]}


@pytest.fixture
async def db(store_db: str, password_hashes: dict[str, str]) -> str:
    async with await open_store(store_db) as store:
        alice = await add_user(store, "alice", password_hashes["alice"])
        await store.register_consumer(alice, "TARGET")
    return store_db


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Servers killed at the end (whole groups), unless the test stopped them."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.kill()


class Reply:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.location = response.getheader("Location") or ""
        self.cookie = response.getheader("Set-Cookie") or ""
        self.text = response.read().decode()

    @property
    def token(self) -> str:
        """The session's token a login set."""
        match = re.match(rf"{COOKIE}=([\w-]+);", self.cookie)
        assert match is not None, self.cookie
        return match.group(1)

    @property
    def csrf(self) -> str:
        match = re.search(r'name="csrf" value="([^"]+)"', self.text)
        assert match is not None
        return match.group(1)

    @property
    def to_login(self) -> bool:
        return self.status == 303 and self.location.startswith("/console/login")


class Worker:
    """An HTTP connection to the console that one worker (or process) took, kept alive."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn

    def request(
        self,
        method: str,
        path: str,
        token: str | None = None,
        form: dict[str, str] | None = None,
        cookie: str | None = None,
    ) -> http.client.HTTPResponse:
        """``token``: the session's; ``cookie``: another cookie to send (``NAME=VALUE``)."""
        headers = {"Cookie": f"{COOKIE}={token}"} if token else {}
        if cookie is not None:
            headers["Cookie"] = cookie
        body = None
        if form is not None:
            body = urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        self.conn.request(method, "/console/" + path, body, headers)
        return self.conn.getresponse()

    def get(self, path: str, token: str | None = None) -> Reply:
        return Reply(self.request("GET", path, token))

    def post(self, path: str, token: str | None = None, **form: str) -> Reply:
        return Reply(self.request("POST", path, token, form))

    def log_in(self) -> str:
        """As a browser: the login page (its pre-session cookie and token), then its form."""
        page = self.get("login")
        pre_session = page.cookie.split(";", 1)[0]
        reply = Reply(
            self.request("POST", "login", None, {**ALICE, "csrf": page.csrf}, pre_session)
        )
        assert reply.status == 303, reply.text
        return reply.token

    @asynccontextmanager
    async def tail(self, token: str) -> AsyncIterator[http.client.HTTPResponse]:
        """A live tail of ``events``/0 (this connection carries it until it ends)."""
        response = self.request("GET", "tail/stream?stream=events&partition=0", token)
        assert response.status == 200
        assert await asyncio.to_thread(response.readline) == b"retry: 3000\n"
        yield response
        response.close()


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def connected(process: ServerProcess, slot: int | None = None) -> Worker:
    """A connection worker ``slot`` of ``process`` took (any, when None); those the kernel
    gave the other worker are closed until one lands there."""
    for _ in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", port_of(process.url), timeout=60)
        conn.request("GET", "/console/login")
        conn.getresponse().read()
        if slot is None:
            return Worker(conn)
        local = conn.sock.getsockname()[1]
        found = re.search(
            rf" worker (\d+) \S+: HTTP request from 127\.0\.0\.1:{local} ", process.logged()
        )
        assert found is not None, f"the request from port {local} is not logged"
        if int(found.group(1)) == slot:
            return Worker(conn)
        conn.close()
    raise AssertionError(f"no connection reached worker {slot}")


Connect = Callable[..., Worker]


@pytest.fixture
def worker() -> Iterator[Connect]:
    """``worker(process, slot=None)``: :func:`connected`, closed at the end."""
    opened: list[Worker] = []

    def connect(process: ServerProcess, slot: int | None = None) -> Worker:
        opened.append(connected(process, slot))
        return opened[-1]

    yield connect
    for page in opened:
        page.conn.close()


async def ended(tail: http.client.HTTPResponse) -> str:
    """What the ``ended`` event of a live tail says (heartbeats and data before it skipped)."""
    deadline = time.monotonic() + WITHIN_SECONDS
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(tail.readline)
        assert line, "the tail was closed without an ended event"
        if line == b"event: ended\n":
            data = await asyncio.to_thread(tail.readline)
            return data.decode().removeprefix("data: ").strip()
    raise AssertionError("the tail did not end")


def consoled(db: str, *extra: str) -> Group:
    return Group(db, "--console", *extra)


async def test_a_login_on_one_worker_holds_on_the_other(
    db: str, servers: list[ServerProcess], worker: Connect
) -> None:
    group = consoled(db)
    servers.append(group)
    first, second = worker(group, 0), worker(group, 1)
    token = first.log_in()
    page = second.get("consumers", token)
    assert page.status == 200
    assert 'data-component="TARGET"' in page.text
    # a form of a page one worker served is taken by the other
    form = {"stream": "events", "partition": "0", "user": "alice", "component": "TARGET"}
    csrf = first.get("consumers", token).csrf
    assert second.post("consumers/drop", token, **form).status == 403  # without its token
    reply = second.post("consumers/drop", token, csrf=csrf, **form)
    assert reply.status == 303
    assert "Dropped alice/TARGET of events/0." in first.get("consumers", token).text
    assert execute_sql(db, "SELECT count(*) FROM consumers") == [(0,)]


async def test_a_logout_on_one_worker_ends_a_live_tail_on_the_other(
    db: str, servers: list[ServerProcess], worker: Connect
) -> None:
    group = consoled(db)
    servers.append(group)
    first, second = worker(group, 0), worker(group, 1)
    token = first.log_in()
    async with first.tail(token) as tail:
        csrf = second.get("streams", token).csrf
        assert second.post("logout", token, csrf=csrf).status == 303
        assert await ended(tail) == '"The session has ended: log in again."'
    assert worker(group, 0).get("streams", token).to_login


@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_the_bound_and_the_idle_time_hold_across_workers(
    db: str, servers: list[ServerProcess], worker: Connect
) -> None:
    group = consoled(db, "--console-sessions", "2")
    servers.append(group)
    first, second = worker(group, 0), worker(group, 1)
    oldest, newer = first.log_in(), second.log_in()
    newest = first.log_in()  # the least recently used goes: the first, made on worker 0
    assert second.get("streams", oldest).to_login
    for token in (newer, newest):
        assert second.get("streams", token).status == 200
    assert execute_sql(db, "SELECT count(*) FROM console_sessions") == [(2,)]
    # a session left unused longer than the idle time (30 min) has ended, on every worker
    execute_sql(db, "UPDATE console_sessions SET used = used - 1801")
    assert second.get("streams", newer).to_login
    assert first.get("streams", newest).to_login
    assert execute_sql(db, "SELECT count(*) FROM console_sessions") == [(0,)]


async def test_a_session_outlives_a_restart(
    db: str, servers: list[ServerProcess], worker: Connect
) -> None:
    group = consoled(db)
    servers.append(group)
    token = worker(group).log_in()
    assert group.stop() == 0
    again = consoled(db)
    servers.append(again)
    for slot in range(again.count):
        assert worker(again, slot).get("streams", token).status == 200


async def test_a_push_consumer_shows_connected_on_every_worker(
    db: str, servers: list[ServerProcess], worker: Connect
) -> None:
    group = consoled(db)
    servers.append(group)
    receiver = ReliableReceiver(
        group.url, credentials=f"alice:{USERS['alice']}", component="TARGET",
        on_events=Collector(),
    )  # fmt: skip
    task = await running(receiver)
    try:
        first, second = worker(group, 0), worker(group, 1)
        token = first.log_in()
        shown: list[str] = []

        def both_show_it() -> bool:
            shown[:] = [
                re.sub(r"<[^>]+>", "", page.get("consumers", token).text)
                for page in (first, second)
            ]
            return all("connected" in text for text in shown)

        await until(both_show_it, "the consumer shown connected by both workers")
        here = [re.search(r"connected, \d+ in flight", text) is not None for text in shown]
        assert sorted(here) == [False, True]  # its figures where it is connected
        assert "connected to another worker" in shown[here.index(False)]
    finally:
        await stop(receiver, task)


async def test_two_processes_on_one_postgresql_database_share_sessions(
    pg_url: str, password_hashes: dict[str, str], servers: list[ServerProcess], worker: Connect
) -> None:
    async with await open_store(pg_url) as store:
        await add_user(store, "alice", password_hashes["alice"])
    for _ in range(2):
        servers.append(ServerProcess(pg_url, 0, "--console", workers=1))
    one, other = worker(servers[0]), worker(servers[1])
    token = one.log_in()
    assert other.get("streams", token).status == 200
    async with one.tail(token) as tail:
        csrf = other.get("streams", token).csrf
        assert other.post("logout", token, csrf=csrf).status == 303
        assert await ended(tail) == '"The session has ended: log in again."'
    assert worker(servers[0]).get("streams", token).to_login
