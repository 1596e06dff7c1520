"""The console manages what it shows, in a real browser (Playwright driving the machine's
Chromium): the overview, streams added, grown and dropped, an event published and its own
page, each through the server's rights as the caller; screenshots as in test_console."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, expect

import futoin_evt
from futoin_evt.amqp.config import AmqpConfig
from futoin_evt.auth.sas import InvalidToken, SasVerifier, sign
from futoin_evt.console.config import ConsoleConfig
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.rights import Right
from futoin_evt.domain.stream import EventDraft
from futoin_evt.server.app import EventServer

from .support.console import (
    ADMIN,
    client_of,
    console_login,
    csrf_in,
    in_browser,
    log_in,
    menu,
    needs_chromium,
    shoot,
)
from .support.servers import USERS, ServerFactory

# the browser tests' fixtures

pytestmark = pytest.mark.functional


@pytest.fixture
async def console(start_server: ServerFactory) -> EventServer:
    from futoin_evt.auth.users import hash_password

    server = await start_server(
        console=ConsoleConfig(sample_seconds=0.2, refresh_seconds=0.3), metrics=("127.0.0.1", 0)
    )
    await server.store.add_user(ADMIN[0], hash_password(ADMIN[1]), is_admin=True)
    await server.access.changed_here()
    return server


async def principal(server: EventServer, name: str) -> Principal:
    user = await server.store.get_user(name)
    assert user is not None
    return Principal(user.id, user.name, is_admin=user.is_admin)


@in_browser
@needs_chromium
async def test_the_overview_shows_the_server_its_doors_and_its_rates(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    await log_in(page, console, *ADMIN)
    await menu(page, "Overview")
    await expect(page.locator(".version")).to_have_text(f"futoin-evt {futoin_evt.__version__}")
    await expect(page.locator(".build")).to_have_text(futoin_evt.build())
    await expect(page.locator(".workers")).to_have_text("1 (one process)")
    await expect(page.locator(".uptime")).to_have_text(re.compile(r"^\d+ (s|min \d+ s)$"))
    doors = page.locator("#doors tbody tr")
    ftn18 = doors.filter(has_text="FTN18 over WebSocket")
    await expect(ftn18.locator("code")).to_have_text(console.url)
    web = doors.filter(has_text="Web console")
    await expect(web.locator("code")).to_have_text(console.console_url.rstrip("/"))  # type: ignore[union-attr]
    await expect(web.locator(".connections")).not_to_have_text("0")  # this browser's
    await expect(doors.filter(has_text="Metrics").locator("code")).to_have_text(
        str(console.metrics_url)
    )
    for name in ("HTTP feed", "DCB over HTTP", "Schema registry", "AsyncAPI document"):
        await expect(doors.filter(has_text=name)).to_have_count(1)
    # a client connected over FTN18 counts there, and its events make the rates move
    async with await client_of(console, "alice") as alice:
        for n in range(40):
            await alice.add_event("ORDER_PLACED", {"n": n, "note": "x" * 100})
        await expect(ftn18.locator(".connections")).to_have_text("1")  # past its login
        await expect(page.locator(".events-rate")).not_to_have_text(re.compile(r"^(—|0\.0)$"))
        await expect(page.locator(".bytes-rate")).to_have_text(re.compile(r"\d (B|KiB)/s$"))
        # and the hour's charts, with their values on hover
        moved = r" UTC: (?!0 |0\.0 )[\d,]+(\.\d)? "
        for chart, unit in (("events-hour", "events/s"), ("bytes-hour", "KiB/s")):
            dot = page.locator(f"#{chart} circle.dot[data-label$=' {unit}']").filter(
                has_text=re.compile(moved + unit)
            )
            await expect(dot.first).to_be_attached()
            await dot.last.hover()
            await expect(page.locator("#tip")).to_have_text(re.compile(moved + unit + "$"))
        await shoot(page, shots, "overview")


@in_browser
@needs_chromium
async def test_a_stream_is_added_grown_and_dropped_by_one_who_manages_it(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    await log_in(page, console, *ADMIN)
    await page.get_by_label("New stream").fill("orders")
    await page.get_by_label("Partitions").fill("2")
    await page.get_by_role("button", name="Add stream").click()
    await expect(page).to_have_url(re.compile(r"/console/stream\?name=orders$"))
    await expect(page.locator(".notice")).to_have_text("Added orders: 2 partitions.")
    await expect(page.locator("#partitions tbody tr")).to_have_count(2)
    info = console.streams.get("orders")
    assert info is not None
    assert len(info.partitions) == 2
    # sizes in bytes: 10 events of about 1 KiB each on partition 1
    events = console.logs.partition(info.partitions[1])
    root = await principal(console, "root")
    for n in range(10):
        await events.append(root, [EventDraft("ORDER_PLACED", {"n": n, "pad": "y" * 1000})])
    size = page.locator('#partitions tr[data-partition="1"] .size')
    await expect(size).to_have_text(re.compile(r"^(9\.\d|10\.\d) KiB$"))
    await expect(page.locator('#partitions tr[data-partition="0"] .size')).to_have_text("0 B")
    await page.get_by_label("Partitions").fill("3")
    await page.get_by_role("button", name="Grow").click()
    await expect(page.locator(".notice")).to_have_text("orders has 3 partitions now.")
    await expect(page.locator("#partitions tbody tr")).to_have_count(3)
    info = console.streams.get("orders")
    assert info is not None
    assert len(info.partitions) == 3
    await shoot(page, shots, "stream")
    # dropping needs the name typed
    await page.get_by_label("Type its name to confirm").fill("order")
    await page.get_by_role("button", name="Drop orders").click()
    await expect(page.get_by_role("alert")).to_have_text(
        "Type the stream's name, orders, to drop it."
    )
    assert console.streams.get("orders") is not None
    await page.go_back()
    await page.get_by_label("Type its name to confirm").fill("orders")
    await page.get_by_role("button", name="Drop orders").click()
    await expect(page).to_have_url(re.compile(r"/console/streams$"))
    await expect(page.locator(".notice")).to_have_text("Dropped orders and its events.")
    assert console.streams.get("orders") is None
    assert await console.store.stream("orders") is None


@in_browser
@needs_chromium
async def test_who_may_not_manage_a_stream_is_refused_and_changes_nothing(
    console: EventServer, page: Page
) -> None:
    await console.streams.add(await principal(console, "root"), "orders", 1)
    await log_in(page, console, "alice", USERS["alice"])  # read and write, no manage
    await page.get_by_label("New stream").fill("payments")
    await page.get_by_role("button", name="Add stream").click()
    await expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    await expect(page.get_by_role("alert")).to_have_text(
        "The manage right on stream payments is needed."
    )
    assert console.streams.get("payments") is None
    await page.goto(f"{console.console_url}stream?name=orders")
    await expect(page.locator("#partitions tbody tr")).to_have_count(1)
    await expect(page.locator("form#grow, form#drop")).to_have_count(0)


async def test_stream_forms_need_their_csrf_token_and_the_manage_right(
    console: EventServer,
) -> None:
    """As a forged form would post them, and as a user without manage would."""
    await console.streams.add(await principal(console, "root"), "orders", 1)
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, *ADMIN)).status_code == 303
        for path, form in (
            ("streams/add", {"name": "payments", "partitions": "1"}),
            ("streams/grow", {"name": "orders", "partitions": "2"}),
            ("streams/drop", {"name": "orders", "confirm": "orders"}),
            ("publish", {"stream": "orders", "type": "X", "data": "{}"}),
        ):
            reply = await http.post(path, data=form)
            assert reply.status_code == 403, path
            assert "CSRF token is missing or wrong" in reply.text
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        csrf = csrf_in((await http.get("streams")).text)
        for path, form in (
            ("streams/grow", {"name": "orders", "partitions": "2"}),
            ("streams/drop", {"name": "orders", "confirm": "orders"}),
        ):
            reply = await http.post(path, data={**form, "csrf": csrf})
            assert reply.status_code == 403, path
            assert "The manage right on stream orders is needed." in reply.text
    info = console.streams.get("orders")
    assert info is not None
    assert len(info.partitions) == 1


@in_browser
@needs_chromium
async def test_an_event_is_published_shown_on_its_own_page_and_found_by_type(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    await log_in(page, console, "alice", USERS["alice"])
    await menu(page, "Publish")
    await page.get_by_label("Type").fill("order_placed")
    await page.get_by_label("Data (JSON)").fill('{"order": 1042, "total": 12.5}')
    await page.get_by_role("button", name="Publish").click()
    await expect(page.get_by_role("alert")).to_have_text(
        re.compile(r"^Invalid event type:? 'order_placed'")
    )
    # the form keeps what was typed
    await expect(page.get_by_label("Data (JSON)")).to_have_value('{"order": 1042, "total": 12.5}')
    await page.get_by_label("Type").fill("ORDER_PLACED")
    await page.get_by_label("Key").fill("order-1042")
    await page.get_by_label("Data (JSON)").fill(
        '{"order": 1042, "total": 12.5, "note": "<b>x</b>"}'
    )
    await shoot(page, shots, "publish")
    await page.get_by_role("button", name="Publish").click()
    await expect(page).to_have_url(re.compile(r"/console/event\?stream=events&partition=0&id=1$"))
    await expect(page.locator(".notice")).to_have_text("Published event 1 to events/0.")
    await expect(page.locator("dd.type")).to_have_text("ORDER_PLACED")
    await expect(page.locator("dd.content-type")).to_have_text("application/json")
    shown = json.loads(await page.locator("#data").inner_text())
    assert shown == {"order": 1042, "total": 12.5, "note": "<b>x</b>"}
    assert "\n  " in await page.locator("#data").inner_text()  # pretty
    await shoot(page, shots, "event")
    # stored as FTN18's addEvent stores it; the same key again stores nothing new
    async with await client_of(console, "alice") as alice:
        await alice.register_consumer("CHECK")
        (event,) = await alice.poll_events("CHECK")
        assert (event.id, event.type, event.data["order"]) == (1, "ORDER_PLACED", 1042)
        await alice.add_event("ORDER_PAID", {"order": 1042})
    await menu(page, "Publish")
    await page.get_by_label("Type").fill("ORDER_PLACED")
    await page.get_by_label("Key").fill("order-1042")
    await page.get_by_label("Data (JSON)").fill('{"order": 1042}')
    await page.get_by_role("button", name="Publish").click()
    await expect(page.locator(".notice")).to_have_text("Published event 1 to events/0.")
    # search by type
    await menu(page, "Events")
    await page.get_by_label("Types").fill("ORDER_PAID")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("#events tbody tr")).to_have_count(1)
    await expect(page.locator("#events tbody tr")).to_contain_text("ORDER_PAID")
    await page.locator("#events tbody tr").get_by_role("link", name="2").click()
    await expect(page.locator("dd.id")).to_have_text("2")


async def test_an_event_page_needs_read_and_names_no_event_it_does_not_have(
    console: EventServer,
) -> None:
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        reply = await http.get("event", params={"stream": "events", "id": "7"})
        assert reply.status_code == 404
        assert "No event 7 in events/0" in reply.text
        reply = await http.get("event", params={"stream": "payroll", "id": "1"})
        assert reply.status_code == 404  # no right on that name: as if it did not exist


@in_browser
@needs_chromium
async def test_an_admin_adds_a_user_grants_revokes_and_removes_them(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    await console.streams.add(await principal(console, "root"), "orders-eu", 1)
    await console.streams.add(await principal(console, "root"), "payroll", 1)
    await log_in(page, console, *ADMIN)
    await menu(page, "Users")
    await page.get_by_label("New user").fill("shop")
    await page.get_by_label("Password").fill("shop-pw")
    await page.get_by_role("button", name="Add user").click()
    await expect(page.locator(".notice")).to_have_text("Added user shop.")
    await expect(page.locator("#grants tbody")).to_have_text("No grants.")
    # the new user logs in at once, and may do nothing yet
    async with httpx.AsyncClient(base_url=str(console.console_url), timeout=30) as shop:
        assert (await console_login(shop, "shop", "shop-pw")).status_code == 303
        await page.get_by_label("Stream pattern").fill("orders-*")
        await page.get_by_label("read").check()
        await page.get_by_label("write").check()
        await page.get_by_role("button", name="Grant").click()
        await expect(page.locator(".notice")).to_have_text(
            "Granted read,write on orders-* to shop."
        )
        await expect(page.locator('#may tr[data-stream="orders-eu"] .rights')).to_have_text(
            "read, write"
        )
        await expect(page.locator('#may tr[data-stream="payroll"]')).to_have_count(0)
        shop_user = await principal(console, "shop")
        assert console.streams.access.allows(shop_user, Right.WRITE, "orders-eu")
        page_of_shop = await shop.get("partition", params={"stream": "orders-eu"})
        assert page_of_shop.status_code == 200
        await shoot(page, shots, "user")
        await (
            page.locator('#grants tr[data-pattern="orders-*"]')
            .get_by_role("button", name="Revoke")
            .click()
        )
        await expect(page.locator(".notice")).to_have_text(
            "Revoked read,write on orders-* from shop."
        )
        assert not console.streams.access.allows(shop_user, Right.READ, "orders-eu")
        page_of_shop = await shop.get("partition", params={"stream": "orders-eu"})
        assert page_of_shop.status_code == 403
        await menu(page, "Users")
        await expect(page.locator('#users tr[data-user="shop"] .grants')).to_have_text("none")
        await expect(page.locator('#users tr[data-user="root"] .grants')).to_have_text("everything")
        await shoot(page, shots, "users")
        await page.locator('#users tr[data-user="shop"]').get_by_role("link").click()
        await page.get_by_label("Type the user's name to confirm").fill("shop")
        await page.get_by_role("button", name="Remove shop").click()
        await expect(page.locator(".notice")).to_have_text("Removed user shop and their consumers.")
        await expect(page.locator('#users tr[data-user="shop"]')).to_have_count(0)
        assert await console.store.get_user("shop") is None
        # their console session went with them
        reply = await shop.get("streams")
        assert reply.status_code == 303
        assert reply.headers["location"].startswith("/console/login")


async def test_users_pages_and_forms_are_for_admins_only(console: EventServer) -> None:
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        assert "/console/users" not in (await http.get("streams")).text  # no menu entry
        for path in ("users", "user?name=bob"):
            reply = await http.get(path)
            assert reply.status_code == 403
            assert "Only admin users manage users and their rights." in reply.text
        csrf = csrf_in((await http.get("streams")).text)
        for path, form in (
            ("users/add", {"name": "mallory", "password": "x"}),
            ("users/grant", {"name": "alice", "pattern": "*", "manage": "1"}),
            ("users/revoke", {"name": "bob", "pattern": "*", "read": "1"}),
            ("users/remove", {"name": "bob", "confirm": "bob"}),
        ):
            reply = await http.post(path, data={**form, "csrf": csrf})
            assert reply.status_code == 403, path
    assert await console.store.get_user("mallory") is None
    assert await console.store.get_user("bob") is not None
    alice = await principal(console, "alice")
    assert not console.streams.access.allows(alice, Right.MANAGE, "events")


@in_browser
@needs_chromium
async def test_a_consumers_lag_is_charted_with_its_values_on_hover(
    console: EventServer, page: Page, shots: list[Path]
) -> None:
    async with await client_of(console, "alice") as alice:
        await alice.register_consumer("BILLING")
        ids = [await alice.add_event("ORDER_PLACED", {"n": n}) for n in range(12)]
        await log_in(page, console, "alice", USERS["alice"])
        await menu(page, "Consumers")
        await page.locator("#consumers").get_by_role("link", name="BILLING").click()
        await expect(page.locator("dd.lag")).to_have_text("12 events")
        twelve = page.locator('figure.chart circle.dot[data-label$=" UTC: 12 events behind"]')
        await expect(twelve.first).to_be_attached()
        await alice.poll_events("BILLING", last_id=ids[8])
        await expect(page.locator("dd.lag")).to_have_text("3 events")
        three = page.locator('figure.chart circle.dot[data-label$=" UTC: 3 events behind"]')
        await expect(three.first).to_be_attached()
        await three.last.hover()
        await expect(page.locator("#tip")).to_be_visible()
        await expect(page.locator("#tip")).to_have_text(
            re.compile(r"^\d\d:\d\d:\d\d UTC: 3 events behind$")
        )
        await shoot(page, shots, "consumer")
        # the partition's chart tells its values the same way
        await page.goto(f"{console.console_url}partition?stream=events&partition=0")
        await page.locator("figure.chart circle.dot").last.hover()
        await expect(page.locator("#tip")).to_have_text(re.compile(r" UTC: [\d.,]+ events/s$"))


async def test_another_users_consumer_page_needs_manage(console: EventServer) -> None:
    async with await client_of(console, "bob") as bob:
        await bob.register_consumer("AUDIT")
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        query = {"stream": "events", "partition": "0", "user": "bob", "component": "AUDIT"}
        reply = await http.get("consumer", params=query)
        assert reply.status_code == 403
        assert "The manage right on stream events is needed." in reply.text
        assert "AUDIT" not in reply.text


async def test_events_are_found_by_time_range_and_the_page_says_keys_are_not_searchable(
    console: EventServer,
) -> None:
    assert console.console_url is not None
    async with await client_of(console, "alice") as alice:
        for n in range(3):
            await alice.add_event("ORDER_PLACED", {"n": n})
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303

        async def shown(**query: str) -> tuple[list[str], str]:
            reply = await http.get("events", params={"stream": "events", **query})
            assert reply.status_code == 200
            return re.findall(r'<td class="ts">([^<]+)</td>', reply.text), reply.text

        times, text = await shown()
        assert len(times) == 3
        assert "There is no search by key" in text
        assert (await shown(time=times[0], to=times[-1]))[0] == times
        assert (await shown(to="2000-01-01T00:00:00Z"))[0] == []  # before every event
        assert (await shown(time="2000-01-01T00:00Z", to=times[-1]))[0] == times
        none, text = await shown(time=times[-1], to="2000-01-01T00:00Z")
        assert none == []
        assert "The time range ends before it starts." in text
        none, text = await shown(to="yesterday")
        assert none == []
        assert "A time is YYYY-MM-DDTHH:MM:SS in UTC." in text


@in_browser
@needs_chromium
async def test_an_admin_adds_a_sas_policy_sees_its_key_once_and_removes_it(
    start_server: ServerFactory, page: Page, shots: list[Path]
) -> None:
    from futoin_evt.auth.users import hash_password

    secret = b"s" * 32
    server = await start_server(console=ConsoleConfig(), amqp=AmqpConfig(port=0, sas_secret=secret))
    await server.store.add_user(ADMIN[0], hash_password(ADMIN[1]), is_admin=True)
    await server.access.changed_here()
    await log_in(page, server, *ADMIN)
    await menu(page, "Users")
    await expect(page.locator("#policies tbody")).to_have_text("No SAS policies.")
    await page.get_by_label("New policy").fill("shop-sender")
    await page.get_by_label("Streams").fill("orders-*")
    await page.get_by_label("Send").check()
    await page.get_by_label("Listen").check()
    await page.get_by_role("button", name="Add policy").click()
    await expect(page.locator("#policy-key")).to_contain_text("Added SAS policy shop-sender.")
    key = await page.locator("#policy-key code").inner_text()
    row = page.locator('#policies tr[data-policy="shop-sender"]')
    await expect(row.locator(".claims")).to_have_text("Send,Listen on orders-*")
    await shoot(page, shots, "policies")
    # the key signs tokens the server takes, with the claims as rights
    resource = "sb://127.0.0.1/orders-eu"
    verifier = SasVerifier(server.store, secret)
    token = sign(resource, "shop-sender", key, int(time.time()) + 600)
    claims = await verifier.verify(token, resource)
    assert claims.principal.name == "shop-sender"
    assert server.streams.access.allows(claims.principal, Right.WRITE, "orders-eu")
    assert not server.streams.access.allows(claims.principal, Right.MANAGE, "orders-eu")
    # shown once: the page again does not show it
    await menu(page, "Users")
    await expect(page.locator("#policy-key")).to_have_count(0)
    await row.get_by_role("button", name="Remove").click()
    await expect(page.locator(".notice")).to_have_text(
        "Removed SAS policy shop-sender: its key no longer works."
    )
    await expect(row).to_have_count(0)
    with pytest.raises(InvalidToken):
        await verifier.verify(token, resource)


async def test_sas_policy_forms_are_for_admins_and_a_user_is_no_policy(
    console: EventServer,
) -> None:
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        csrf = csrf_in((await http.get("streams")).text)
        reply = await http.post(
            "users/policies/add",
            data={"name": "p", "pattern": "*", "manage": "1", "csrf": csrf},
        )
        assert reply.status_code == 403
        reply = await http.post("users/policies/remove", data={"name": "bob", "csrf": csrf})
        assert reply.status_code == 403
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as http:
        assert (await console_login(http, *ADMIN)).status_code == 303
        page = await http.get("users")
        assert "This server has no SAS secret" in page.text  # no AMQP door here
        csrf = csrf_in(page.text)
        reply = await http.post("users/policies/remove", data={"name": "bob", "csrf": csrf})
        assert reply.status_code == 404
        assert "No such SAS policy: bob." in reply.text
        reply = await http.post(
            "users/policies/add", data={"name": "p", "pattern": "*", "send": "1", "csrf": csrf}
        )
        assert reply.status_code == 400
        assert "This server has no SAS secret" in reply.text
    assert await console.store.get_user("p") is None
    assert await console.store.get_user("bob") is not None
