"""The web console from the outside: logging in as a browser does (the login page first, with
its pre-session cookie and the form's CSRF token, then the form), Chromium driven by
Playwright, and the console behind a group of workers reached worker by worker."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store

from .servers import USERS, ServerProcess, add_user
from .workers import Group


def csrf_in(page: str) -> str:
    """The CSRF token of the (first) form of ``page``."""
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None, "the page has no CSRF token"
    return token.group(1)


async def console_login(
    http: httpx.AsyncClient, user: str, password: str, **fields: str
) -> httpx.Response:
    """``http`` (based at the console's URL, keeping cookies) logs in as ``user``; the
    login's answer (303 when it worked)."""
    page = await http.get("login")
    form = {"user": user, "password": password, "csrf": csrf_in(page.text), **fields}
    return await http.post("login", data=form)


CHROMIUM = Path("/usr/bin/chromium")


#: The tests that drive the browser.
in_browser = pytest.mark.browser


needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Chromium (apt-get install chromium)"
)


ADMIN = ("root", "root-pw")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 720})
    opened = await context.new_page()
    yield opened
    await context.close()


async def client_of(server: EventServer, user: str) -> EventStreamClient:
    return await EventStreamClient.connect(server.url, credentials=f"{user}:{USERS[user]}")


async def log_in(page: Page, server: EventServer | str, user: str, password: str) -> None:
    """Log in to ``server``'s console (or the console at that URL)."""
    url = server if isinstance(server, str) else server.console_url
    assert url is not None
    await page.goto(url)
    await page.get_by_label("User").fill(user)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Log in").click()


async def menu(page: Page, entry: str) -> None:
    await page.locator("header nav").get_by_role("link", name=entry).click()


@pytest.fixture
def shots(tmp_path: Path) -> list[Path]:
    """Where screenshots go: the test's output, and $FUTOIN_EVT_SCREENSHOTS when set."""
    shared = os.environ.get("FUTOIN_EVT_SCREENSHOTS")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
    return [tmp_path, *([Path(shared)] if shared else [])]


async def shoot(page: Page, shots: list[Path], name: str) -> None:
    for directory in shots:
        await page.screenshot(path=directory / f"{name}.png", full_page=True)


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


def consoled(db: str, *extra: str) -> Group:
    return Group(db, "--console", *extra)
