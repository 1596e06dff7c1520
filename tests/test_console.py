"""The web console in a real browser: Playwright driving the machine's Chromium.

Each page's screenshot goes to the test's temporary directory; with
``FUTOIN_EVT_SCREENSHOTS=DIR`` (``docs/screenshots`` for the README) there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trustme
from playwright.async_api import Browser, Page, expect
from prometheus_client.parser import text_string_to_metric_families

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import Event, EventStreamClient
from futoin_evt.client.notify import Notifications
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.console.config import ConsoleConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage import open_store

from .support.console import (
    ADMIN,
    client_of,
    console_login,
    in_browser,
    log_in,
    menu,
    needs_chromium,
    shoot,
)
from .support.servers import USERS, ServerFactory, ServerProcess, add_user, run_without
from .support.sql import execute_sql

pytestmark = pytest.mark.functional

ALICE = f"alice:{USERS['alice']}"
COOKIE = "futoin_evt_console"
#: Markup in event data: shown as text, never run.
HOSTILE = "<img src=x onerror=\"document.body.dataset.pwned='1'\"><script>pwned=1</script>"


@pytest.fixture
async def console(start_server: ServerFactory) -> EventServer:
    server = await start_server(console=ConsoleConfig(sample_seconds=0.2, refresh_seconds=0.3))
    await server.store.add_user(ADMIN[0], hash_password(ADMIN[1]), is_admin=True)
    return server


@pytest.fixture
async def alice(console: EventServer) -> AsyncIterator[EventStreamClient]:
    async with await client_of(console, "alice") as client:
        yield client


def row_of(page: Page, table: str, **data: str) -> str:
    return f"#{table} tr" + "".join(f'[data-{k}="{v}"]' for k, v in data.items())


@in_browser
@needs_chromium
async def test_log_in_and_see_a_streams_head_move(
    console: EventServer, page: Page, alice: EventStreamClient, shots: list[Path]
) -> None:
    info = await console.store.add_stream("orders", 3)
    await console.streams.refresh()
    await log_in(page, console, *ADMIN)
    await expect(page).to_have_url(re.compile(r"/console/streams$"))
    await expect(page.locator("header .who")).to_have_text("root (admin)")
    head = page.locator(row_of(page, "streams", stream="events", partition="0") + " .head")
    await expect(head).to_have_text("0")
    for burst in range(1, 7):
        for n in range(burst * 5):
            await alice.add_event("ORDER_PLACED", {"n": n})
        await expect(head).to_have_text(str(sum(b * 5 for b in range(1, burst + 1))))
    orders = console.store.partition_log(info.partitions[1])
    for _ in range(7):
        await orders.append("Placed", "{}")
    await expect(
        page.locator(row_of(page, "streams", stream="orders", partition="1") + " .head")
    ).to_have_text("7")
    await shoot(page, shots, "streams")
    await page.goto(f"{console.console_url}partition?stream=events&partition=0")
    await expect(page.locator("dd.head")).to_have_text("105")
    await expect(page.locator("figure.chart polyline")).to_have_count(1)
    await shoot(page, shots, "partition")


@in_browser
@needs_chromium
async def test_a_consumers_lag_goes_up_and_down_and_seek_moves_it(
    console: EventServer, page: Page, alice: EventStreamClient, shots: list[Path]
) -> None:
    await alice.register_consumer("BILLING")
    async with await client_of(console, "bob") as bob:
        await bob.register_consumer("AUDIT")
    received: list[Event] = []

    async def keep(events: list[Event]) -> None:
        received.extend(events)

    await console.store.add_stream("orders", 2)
    await console.streams.refresh()
    mailer = ReliableReceiver(  # a push consumer of another stream's partition
        console.url.rstrip("/") + "/orders/1",
        credentials=f"alice:{USERS['alice']}",
        component="MAILER",
        on_events=keep,
    )
    pushing = asyncio.create_task(mailer.run())
    await mailer.ready.wait()
    try:
        await log_in(page, console, *ADMIN)
        await menu(page, "Consumers")
        billing = page.locator(row_of(page, "consumers", user="alice", component="BILLING"))
        lag = billing.locator(".lag")
        await expect(lag).to_have_text("0")
        ids = [await alice.add_event("ORDER_PLACED", {"n": n}) for n in range(12)]
        await expect(lag).to_have_text("12")
        await alice.poll_events("BILLING", last_id=ids[8])
        await expect(lag).to_have_text("3")
        mailer_row = page.locator(row_of(page, "consumers", user="alice", component="MAILER"))
        await expect(mailer_row.locator(".lag")).to_have_text("0")
        await expect(mailer_row).to_contain_text("orders/1")
        await expect(mailer_row).to_contain_text("connected")
        await expect(page.locator(row_of(page, "consumers", component="AUDIT"))).to_contain_text(
            "holds back discarding"
        )
        await shoot(page, shots, "consumers")
        await billing.get_by_role("link", name="seek…").click()
        await page.get_by_label("Position").fill(str(ids[1]))
        await page.get_by_role("button", name="Seek").click()
        await expect(page.locator(".notice")).to_have_text(
            f"alice/BILLING of events/0 is at {ids[1]} now."
        )
        await expect(lag).to_have_text("10")
    finally:
        mailer.stop()
        await pushing


@in_browser
@needs_chromium
async def test_drop_a_consumer_after_the_confirmation(
    console: EventServer, page: Page, alice: EventStreamClient, shots: list[Path]
) -> None:
    await alice.register_consumer("OLD")
    await alice.register_consumer("KEPT")
    await log_in(page, console, "alice", USERS["alice"])
    await menu(page, "Consumers")
    row = page.locator(row_of(page, "consumers", user="alice", component="OLD"))
    await row.get_by_role("link", name="drop…").click()
    await expect(page.get_by_role("heading")).to_have_text("Drop consumer alice/OLD?")
    assert [r.component for r in await console.store.consumers()] == ["KEPT", "OLD"]
    await shoot(page, shots, "confirm")
    await page.get_by_role("button", name="Drop it").click()
    await expect(page.locator(".notice")).to_have_text("Dropped alice/OLD of events/0.")
    await expect(row).to_have_count(0)
    assert [r.component for r in await console.store.consumers()] == ["KEPT"]


@in_browser
@needs_chromium
async def test_the_live_tail_shows_only_the_events_that_match(
    console: EventServer, page: Page, alice: EventStreamClient, shots: list[Path]
) -> None:
    await log_in(page, console, "alice", USERS["alice"])
    await menu(page, "Live tail")
    await page.get_by_label("Selector").fill("eventType = 'ORDER_PLACED' AND total > 100")
    await page.get_by_label("Requested attributes").fill("total, region, note")
    await page.get_by_role("button", name="Follow").click()
    await expect(page.locator("#tail")).to_have_attribute("data-state", "live")
    await alice.add_event("ORDER_PLACED", {"total": 150, "region": "EU", "note": HOSTILE})
    await alice.add_event("ORDER_PLACED", {"total": 80, "region": "US"})
    await alice.add_event("ORDER_SHIPPED", {"total": 500, "region": "EU"})
    await alice.add_event("ORDER_PLACED", {"total": 200, "region": "APAC"})
    rows = page.locator("#tail tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text('"total":200')
    await expect(rows.nth(1)).to_contain_text('"total":150')
    await expect(rows.nth(1)).to_contain_text("<img src=x")
    await expect(page.locator("#tail")).not_to_contain_text('"total":80')
    await expect(page.locator("#tail")).not_to_contain_text("ORDER_SHIPPED")
    assert await page.locator("#tail img, #tail script").count() == 0
    assert await page.evaluate("document.body.dataset.pwned") is None
    await shoot(page, shots, "tail")


@in_browser
@needs_chromium
async def test_a_wrong_password_is_refused(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    await log_in(page, console, "alice", "not-her-password")
    await expect(page.get_by_role("alert")).to_have_text("Wrong user name or password.")
    await expect(page).to_have_url(re.compile(r"/console/login$"))
    await shoot(page, shots, "login")
    # the login form's pre-session cookie only: no session
    assert [c["name"] for c in await page.context.cookies()] == ["futoin_evt_console_login"]
    await page.goto(f"{console.console_url}consumers")
    await expect(page).to_have_url(re.compile(r"/console/login\?next=%2Fconsole%2Fconsumers$"))


@in_browser
@needs_chromium
async def test_another_users_consumers_are_invisible(
    console: EventServer, page: Page, alice: EventStreamClient
) -> None:
    await alice.register_consumer("MINE")
    async with await client_of(console, "bob") as bob:
        await bob.register_consumer("SECRET")
    await log_in(page, console, "alice", USERS["alice"])
    await menu(page, "Consumers")
    await expect(page.locator(row_of(page, "consumers", component="MINE"))).to_have_count(1)
    await expect(page.locator("#consumers")).not_to_contain_text("SECRET")
    await expect(page.locator(".count")).to_have_text("1 consumers")
    # nor reachable by address, nor droppable with her own valid session and token
    assert console.console_url is not None
    confirm = "consumers/confirm?action=drop&stream=events&partition=0&user=bob&component=SECRET"
    await page.goto(console.console_url + confirm)
    refused = "The manage right on stream events is needed."
    await expect(page.get_by_role("alert")).to_have_text(refused)
    csrf = await page.locator("header input[name=csrf]").get_attribute("value")
    assert csrf is not None
    reply = await page.request.post(
        console.console_url + "consumers/drop",
        form={"csrf": csrf, "stream": "events", "partition": "0", "user": "bob",
              "component": "SECRET"},
    )  # fmt: skip
    assert reply.status == 403
    assert refused in await reply.text()
    assert {r.component for r in await console.store.consumers()} == {"MINE", "SECRET"}


async def test_a_form_without_its_csrf_token_is_refused(
    console: EventServer, alice: EventStreamClient
) -> None:
    """A plain HTTP client with a valid session cookie, as a forged cross-site form would be."""
    await alice.register_consumer("TARGET")
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        reply = await console_login(http, "alice", USERS["alice"])
        assert reply.status_code == 303
        cookie, pre_session = reply.headers.get_list("set-cookie")
        assert re.fullmatch(
            r"futoin_evt_console=[\w-]{43}; Path=/console; HttpOnly; SameSite=Strict", cookie
        )
        assert pre_session.startswith("futoin_evt_console_login=; ")  # its work is done
        form = {"stream": "events", "partition": "0", "user": "alice", "component": "TARGET"}
        for csrf in ({}, {"csrf": "guessed"}):
            reply = await http.post("consumers/drop", data={**form, **csrf})
            assert reply.status_code == 403
            assert "CSRF token is missing or wrong" in reply.text
        assert (await http.post("logout", data={})).status_code == 403
        # from another site, even with the token
        page = await http.get("consumers")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        reply = await http.post(
            "consumers/drop",
            data={**form, "csrf": token.group(1)},
            headers={"Origin": "https://elsewhere.example"},
        )
        assert reply.status_code == 403
        assert [r.component for r in await console.store.consumers()] == ["TARGET"]
        # the same form with its token and no foreign origin works
        reply = await http.post("consumers/drop", data={**form, "csrf": token.group(1)})
        assert reply.status_code == 303
        assert await console.store.consumers() == []


@in_browser
@needs_chromium
async def test_the_event_browser_and_the_dcb_query_escape_what_they_show(
    console: EventServer, page: Page, alice: EventStreamClient, shots: list[Path]
) -> None:
    for n in range(3):
        await alice.add_event("ORDER_PLACED", {"n": n, "note": HOSTILE})
    dcb = console.url.replace("ws", "http", 1).rstrip("/") + "/dcb/v1/append"
    events = [
        {"type": "CourseDefined", "data": {"title": HOSTILE}, "tags": ["course:c1"]},
        {"type": "StudentSubscribed", "data": {"student": "s1"}, "tags": ["course:c1", "s:1"]},
        {"type": "CourseDefined", "data": {"title": "Other"}, "tags": ["course:c2"]},
    ]
    async with httpx.AsyncClient(timeout=30, auth=("alice", USERS["alice"])) as http:
        assert (await http.post(dcb, json={"events": events})).status_code == 200
    await log_in(page, console, "alice", USERS["alice"])
    await menu(page, "Events")
    await page.get_by_label("From id").fill("2")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("#events tbody tr")).to_have_count(5)
    await expect(page.locator("#events tbody tr").first).to_contain_text("<img src=x")
    await shoot(page, shots, "events")
    await menu(page, "DCB query")
    await page.get_by_label("Tags (all of)").fill("course:c1")
    await page.get_by_role("button", name="Query").click()
    rows = page.locator("#dcb tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("CourseDefined")
    await expect(rows.nth(1)).to_contain_text("StudentSubscribed")
    await shoot(page, shots, "dcb")
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("document.body.dataset.pwned") is None


@in_browser
@needs_chromium
async def test_names_and_queries_are_escaped_in_every_page(
    console: EventServer, page: Page
) -> None:
    """What users type (a component, a selector, a query string) comes back as text."""
    hostile_component = '"><img src=x onerror="document.body.dataset.pwned=1">'
    user = await console.store.get_user("alice")
    assert user is not None
    await console.store.register_consumer(user.id, hostile_component)  # no door allows it
    await log_in(page, console, "alice", USERS["alice"])
    assert console.console_url is not None
    await page.goto(f"{console.console_url}consumers?stream=%22%3E%3Cimg+src%3Dx%3E")
    await page.goto(f"{console.console_url}consumers")
    await expect(page.locator("#consumers")).to_contain_text(hostile_component)
    await page.locator("#consumers").get_by_role("link", name="seek…").click()
    await expect(page.get_by_role("heading")).to_contain_text(hostile_component)
    await page.goto(f"{console.console_url}tail?selector=%3Cscript%3Ex%3D1%3C/script%3E&run=1")
    await expect(page.get_by_role("alert")).to_be_visible()
    await page.goto(f"{console.console_url}events?id=%3Cb%3E")
    await expect(page.get_by_role("alert")).to_have_text("An event id is a positive number.")
    assert await page.locator("main img, main script, main b").count() == 0
    assert await page.evaluate("document.body.dataset.pwned") is None


@in_browser
@needs_chromium
async def test_a_logout_in_one_tab_ends_the_live_tail_in_another(
    browser: Browser, db_path: Path, password_hashes: dict[str, str]
) -> None:
    """``serve --console`` as an operator runs it (with $FUTOIN_EVT_WORKERS workers: the
    tabs' requests land on any of them)."""
    async with await open_store(db_path) as store:
        await add_user(store, "alice", password_hashes["alice"])
    server = ServerProcess(db_path, 0, "--console")
    context = await browser.new_context()
    try:
        console_url = server.url.replace("ws", "http", 1) + "console/"
        following = await context.new_page()
        await log_in(following, console_url, "alice", USERS["alice"])
        await menu(following, "Live tail")
        await following.get_by_role("button", name="Follow").click()
        await expect(following.locator("#tail")).to_have_attribute("data-state", "live")
        async with await EventStreamClient.connect(server.url, credentials=ALICE) as alice:
            await alice.add_event("ORDER_PLACED", {"n": 1})
        await expect(following.locator("#tail tbody tr")).to_have_count(1)
        other = await context.new_page()
        await other.goto(console_url + "streams")
        await other.get_by_role("button", name="Log out").click()
        await expect(other).to_have_url(re.compile(r"/console/login$"))
        await expect(following.get_by_role("alert")).to_have_text(
            "The session has ended: log in again."
        )
        await expect(following.locator("#tail")).to_have_attribute("data-state", "ended")
    finally:
        await context.close()
        server.stop()


# -- without a browser -----------------------------------------------------------------------


async def test_sessions_are_bounded_and_end_at_logout(
    start_server: ServerFactory, db_path: Path
) -> None:
    server = await start_server(console=ConsoleConfig(max_sessions=2))
    assert server.console_url is not None
    clients = [httpx.AsyncClient(base_url=server.console_url, timeout=30) for _ in range(3)]
    try:
        for http in clients:
            assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        first, second, third = clients
        # the least recently used session went to make room
        assert (await first.get("streams")).headers["location"].startswith("/console/login")
        assert (await second.get("streams")).status_code == 200
        page = await third.get("streams")
        assert page.status_code == 200
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        cookie = third.cookies["futoin_evt_console"]
        reply = await third.post("logout", data={"csrf": token.group(1)})
        assert reply.status_code == 303
        assert "Max-Age=0" in reply.headers["set-cookie"]
        # the cookie, sent again, opens nothing
        third.cookies.set("futoin_evt_console", cookie)
        again = await third.get("streams")
        assert again.headers["location"].startswith("/console/login")
        assert execute_sql(str(db_path), "SELECT count(*) FROM console_sessions") == [(1,)]
    finally:
        for http in clients:
            await http.aclose()


async def log_in_by_http(http: httpx.AsyncClient) -> str:
    """Log ``http`` in as alice; the session's token (the cookie's value)."""
    reply = await console_login(http, "alice", USERS["alice"])
    assert reply.status_code == 303
    return str(http.cookies[COOKIE])


def csrf_of(page: httpx.Response) -> str:
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token is not None
    return token.group(1)


async def test_the_database_keeps_the_digest_of_the_token_only(
    start_server: ServerFactory, store_db: str
) -> None:
    server = await start_server(db=store_db, console=ConsoleConfig())
    assert server.console_url is not None
    async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
        before = time.time()
        token = await log_in_by_http(http)
        after = time.time()
        csrf = csrf_of(await http.get("streams"))
        reply = await http.post(
            "consumers/seek", data={"csrf": csrf, "user": "alice", "component": "NONE"}
        )
        assert reply.status_code == 404  # the token was right
    alice = await server.store.get_user("alice")
    assert alice is not None
    rows = execute_sql(store_db, "SELECT * FROM console_sessions")
    assert [(bytes(r[0]), *r[1:]) for r in rows] == [
        (hashlib.sha256(token.encode()).digest(), alice.id, rows[0][2], rows[0][2], None)
    ]
    assert before <= rows[0][2] <= after  # wall-clock seconds
    # neither the token nor the CSRF token is anywhere in the database's files
    if not store_db.startswith("postgresql"):
        for path in Path(store_db).parent.glob(Path(store_db).name + "*"):
            content = path.read_bytes()
            assert token.encode() not in content
            assert csrf.encode() not in content
    # the session goes with its user
    await server.store.remove_user("alice")
    assert execute_sql(store_db, "SELECT count(*) FROM console_sessions") == [(0,)]


async def test_a_session_ends_unused_or_too_old_and_its_use_is_written_once_a_minute(
    start_server: ServerFactory, db_path: Path
) -> None:
    server = await start_server(console=ConsoleConfig())
    assert server.console_url is not None
    db = str(db_path)
    async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
        await log_in_by_http(http)
        [(created, used)] = execute_sql(db, "SELECT created, used FROM console_sessions")
        assert created == used
        for _ in range(3):
            assert (await http.get("streams")).status_code == 200
        assert execute_sql(db, "SELECT used FROM console_sessions") == [(used,)]
        execute_sql(db, "UPDATE console_sessions SET used = used - 61")
        moment = time.time()
        assert (await http.get("streams")).status_code == 200
        [(moved,)] = execute_sql(db, "SELECT used FROM console_sessions")
        assert moved >= moment
        # unused for longer than the idle time (30 min)
        execute_sql(db, "UPDATE console_sessions SET used = used - 1801")
        assert (await http.get("streams")).headers["location"].startswith("/console/login")
        assert execute_sql(db, "SELECT count(*) FROM console_sessions") == [(0,)]
        # older than the lifetime (12 h), however recently used
        await log_in_by_http(http)
        assert (await http.get("streams")).status_code == 200
        execute_sql(db, "UPDATE console_sessions SET created = created - 43201")
        assert (await http.get("streams")).headers["location"].startswith("/console/login")
        assert execute_sql(db, "SELECT count(*) FROM console_sessions") == [(0,)]


async def test_a_logout_ends_the_sessions_live_tail_at_once(start_server: ServerFactory) -> None:
    server = await start_server(console=ConsoleConfig())
    assert server.console_url is not None
    async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
        await log_in_by_http(http)
        async with http.stream("GET", "tail/stream?stream=events&partition=0") as tail:
            lines = tail.aiter_lines()
            assert await anext(lines) == "retry: 3000"
            csrf = csrf_of(await http.get("streams"))
            assert (await http.post("logout", data={"csrf": csrf})).status_code == 303
            async with asyncio.timeout(30):  # before any heartbeat (15 s) would show it
                assert [line async for line in lines] == [
                    "",
                    "event: ended",
                    'data: "The session has ended: log in again."',
                    "",
                ]


async def test_live_tails_of_one_partition_share_its_reader(start_server: ServerFactory) -> None:
    """Three tails and a notification subscriber of orders/1: each event is read from the
    database once, by the partition's one reader (the notification service's)."""
    server = await start_server(console=ConsoleConfig())
    assert server.console_url is not None
    await server.store.add_stream("orders", 2)
    await server.streams.refresh()
    reader = server.live_streams.of_stream("orders")[1]
    async with (
        httpx.AsyncClient(base_url=server.console_url, timeout=30) as http,
        await EventStreamClient.connect(server.url + "orders/1", credentials=ALICE) as ftn3,
        contextlib.AsyncExitStack() as tails,
    ):
        await log_in_by_http(http)
        subscribed = await Notifications(ftn3.ftn3).subscribe(stream="orders")
        lines = []
        for _ in range(3):
            tail = await tails.enter_async_context(
                http.stream("GET", "tail/stream?stream=orders&partition=1")
            )
            lines.append(tail.aiter_lines())
            assert await anext(lines[-1]) == "retry: 3000"
        read_before = reader.rows_read
        for n in range(10):
            await ftn3.add_event("ORDER_PLACED", {"n": n})
        async with asyncio.timeout(30):
            for tail_lines in lines:
                shown: list[int] = []
                while len(shown) < 10:
                    line = await anext(tail_lines)
                    if line.startswith("data: "):
                        shown += [m["message"]["properties"]["n"] for m in json.loads(line[6:])]
                assert shown == list(range(10))
            notified = [await subscribed.get() for _ in range(10)]
        assert [m["properties"]["n"] for m in notified] == list(range(10))
        assert reader.rows_read - read_before == 10


def test_cli_console_prints_its_url_and_serves_the_login_page(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        # as many workers as $FUTOIN_EVT_WORKERS says
        [sys.executable, "-m", "futoin_evt", "serve", "--db", str(tmp_path / "x.sqlite"),
         "--port", "0", "--console"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:[0-9]+/console/", line)
        assert url is not None, line
        reply = httpx.get(url.group(0) + "login", timeout=30)
        assert reply.status_code == 200
        assert "Log in" in reply.text
        assert "default-src 'none'" in reply.headers["content-security-policy"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_cli_console_without_jinja2_says_what_to_install(tmp_path: Path) -> None:
    argv = ["serve", "--db", str(tmp_path / "x.sqlite"), "--console"]
    proc = run_without("jinja2", argv)
    assert proc.returncode == 2
    assert proc.stderr == "futoin-evt: --console needs Jinja2: pip install 'futoin-evt[console]'\n"


async def test_the_console_counts_as_a_door_of_its_own(start_server: ServerFactory) -> None:
    server = await start_server(console=ConsoleConfig(), metrics=("127.0.0.1", 0))
    assert server.console_url is not None
    assert server.metrics_url is not None
    async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", "wrong")).status_code == 401
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        assert (await http.get("streams")).status_code == 200
        assert server.metrics is not None
        server.metrics.snapshot.cache_seconds = 0.0
        text = (await http.get(server.metrics_url)).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("futoin_evt_door_connections", door="console") == 1
    assert value("futoin_evt_door_refusals_total", door="console", reason="bad_credentials") == 1
    calls = {"door": "console", "iface": "console"}
    assert value("futoin_evt_calls_total", function="login", outcome="401", **calls) == 1
    assert value("futoin_evt_calls_total", function="login", outcome="303", **calls) == 1
    assert value("futoin_evt_calls_total", function="streams", outcome="200", **calls) == 1


async def test_the_console_on_postgresql(pg_url: str) -> None:
    config = ServerConfig(db=pg_url, transport=TransportConfig(port=0), console=ConsoleConfig())
    async with await EventServer.start(config) as server:
        alice = await add_user(server.store, "alice", hash_password(USERS["alice"]))
        await server.access.changed_here()
        info = await server.store.add_stream("orders", 2)
        await server.streams.refresh()
        orders = server.store.partition_log(info.partitions[1])
        await orders.register_consumer(alice, "BILLING")
        for _ in range(3):
            await orders.append("Placed", "{}")
        assert server.console_url is not None
        async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
            assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
            streams = await http.get("streams")
            assert re.search(r'data-stream="orders" data-partition="1">.*?class="num head">3<',
                             streams.text, re.S)  # fmt: skip
            consumers = await http.get("consumers")
            assert re.search(r'data-component="BILLING">.*?orders/1.*?class="num lag">3<',
                             consumers.text, re.S)  # fmt: skip


async def test_under_tls_the_session_cookie_is_secure(start_server: ServerFactory) -> None:
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    server = await start_server(tls=context, console=ConsoleConfig())
    assert server.console_url is not None
    assert server.console_url.startswith("https://")
    trusted = ssl.create_default_context()
    authority.configure_trust(trusted)
    async with httpx.AsyncClient(base_url=server.console_url, verify=trusted, timeout=30) as http:
        reply = await console_login(http, "alice", USERS["alice"])
        assert reply.status_code == 303
        for cookie in reply.headers.get_list("set-cookie"):
            assert "; HttpOnly; SameSite=Strict" in cookie
            assert cookie.endswith("; Secure")
        assert (await http.get("consumers")).status_code == 200


async def test_a_consumer_that_never_acknowledged_holds_back_discarding_on_every_page(
    console: EventServer, alice: EventStreamClient
) -> None:
    """Position 0 is a position: discarding waits for it (as ``futoin-evt info`` says)."""
    async with await client_of(console, "bob") as bob:
        await bob.register_consumer("AUDIT")
    await alice.add_event("ORDER_PLACED", {"n": 1})
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, *ADMIN)).status_code == 303
        streams = (await http.get("streams")).text
        row = re.search(r'<tr data-stream="events" data-partition="0">(.*?)</tr>', streams, re.S)
        assert row is not None
        assert "bob/AUDIT" in row.group(1)
        partition = (await http.get("partition?stream=events&partition=0")).text
        assert re.search(r"<dt>Holds back discarding</dt><dd>\s*bob/AUDIT\s*</dd>", partition)
        consumers = (await http.get("consumers")).text
        assert re.search(r'data-component="AUDIT">.*?holds back discarding', consumers, re.S)
