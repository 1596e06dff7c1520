"""Rights per stream at the HTTP doors: the feed and DCB over HTTP (both backends), the web
console in a real browser, ``/metrics`` with ``--metrics-user``, ``--feed-users`` as grants,
and the files the server makes.

Two tenants, alice and bob, neither an admin. alice holds read,write on ``payroll`` and on
``orders*``; bob's grants are each case's. Whatever bob lacks is refused with 403 and one
sentence naming the right and the stream, the same for a name no stream has unless he holds
some right on that name (then 404).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from playwright.async_api import Page, expect
from prometheus_client.parser import text_string_to_metric_families

from futoin_evt.console.config import ConsoleConfig
from futoin_evt.domain.rights import ALL_RIGHTS, Grant, Right, Rights, rights_text
from futoin_evt.domain.stream import UserId
from futoin_evt.server.app import EventServer

from .support.console import console_login, in_browser, log_in, needs_chromium
from .support.servers import USERS, ServerFactory, ServerProcess

pytestmark = pytest.mark.functional

READ, WRITE, MANAGE = Right.READ, Right.WRITE, Right.MANAGE
ALICE: Final = ("alice", USERS["alice"])
BOB: Final = ("bob", USERS["bob"])
#: Each stream of the tenancy and its partition count (``events`` is every database's).
STREAMS: Final = {"events": 1, "orders": 2, "orders-eu": 1, "payroll": 1, "invoices": 1}
#: Names no stream has: one under ``orders*``, one under nothing but ``*``.
GHOSTS: Final = ("orders-ghost", "ghost")
#: bob's grants in each case.
CASES: Final = {
    "granted by name": [Grant("orders", READ), Grant("orders-eu", READ | WRITE)],
    "granted by prefix": [Grant("orders*", READ | WRITE)],
    "granted on every stream": [Grant("*", READ | WRITE)],
    "not granted": [],
    "granted another stream": [Grant("invoices", READ | WRITE)],
    "write only": [Grant("orders*", WRITE)],
}


@dataclass
class Tenancy:
    server: EventServer
    users: dict[str, UserId]

    async def set_grants(self, user: str, grants: list[Grant]) -> None:
        """``user``'s grants become ``grants`` alone, in use when this returns."""
        store, user_id = self.server.store, self.users[user]
        for row in await store.list_grants():
            if row.user_id == user_id:
                await store.revoke(user_id, row.pattern, int(ALL_RIGHTS))
        for grant in grants:
            await store.grant(user_id, grant.pattern, int(grant.rights))
        await self.server.access.changed_here()

    async def head(self, stream: str, number: int = 0) -> int:
        info = self.server.streams.get(stream)
        assert info is not None
        return await self.server.store.partition_log(info.partitions[number]).newest_event_id()


async def tenancy_of(server: EventServer) -> Tenancy:
    """The streams with an event in each partition (two in payroll), alice's grants, and
    none yet for bob."""
    store = server.store
    for name, count in STREAMS.items():
        if server.streams.get(name) is None:
            await store.add_stream(name, count)
    await server.streams.refresh()
    for name, count in STREAMS.items():
        info = server.streams.get(name)
        assert info is not None
        for partition in info.partitions[:count]:
            await store.partition_log(partition).append("PLACED", f'{{"in":"{partition}"}}')
    payroll = server.streams.get("payroll")
    assert payroll is not None
    await store.partition_log(payroll.partitions[0]).append("SALARY", '{"to":"alice","eur":9}')
    users = {}
    for name in ("alice", "bob"):
        user = await store.get_user(name)
        assert user is not None
        users[name] = user.id
    tenancy = Tenancy(server, users)
    await tenancy.set_grants(
        "alice", [Grant("payroll", READ | WRITE), Grant("orders*", READ | WRITE)]
    )
    await tenancy.set_grants("bob", [])
    return tenancy


def expected(grants: list[Grant], name: str, right: Right) -> int:
    """The status a call needing ``right`` on the stream ``name`` gets."""
    held = Rights(grants).on(name)
    if not held:
        return 403  # the same whether the stream exists or not
    if name not in STREAMS:
        return 404
    return 200 if held & right else 403


def refusal(right: Right, name: str) -> str:
    return f"The {rights_text(right)} right on stream {name} is needed."


def http_base(server: EventServer) -> str:
    return server.url.replace("ws", "http", 1).rstrip("/")


# -- the feed and DCB over HTTP ------------------------------------------------------------------


async def check_feed(http: httpx.AsyncClient, grants: list[Grant], name: str) -> None:
    """Discovery, each partition's events (FeedAPI) and ZeroEventHub, as bob."""
    url = f"/feeds/{name}" if name != "events" else "/feed"
    status = expected(grants, name, READ)
    count = STREAMS.get(name, 1)
    discovery = await http.get(url)
    assert discovery.status_code == status, (name, discovery.text)
    token = discovery.json()["token"] if status == 200 else "not-known"
    for number in range(count):
        params = {"token": token, "partition": str(number), "cursor": "_first"}
        events = await http.get(url + "/events", params=params)
        assert events.status_code == status, (name, number, events.text)
        if status == 200:
            lines = events.text.splitlines()
            assert f'"in":"{name}/{number}"' in lines[0]
    cursors = {f"cursor{n}": "_first" for n in range(count)}
    zeh = await http.get(url, params={"n": str(count), **cursors})
    assert zeh.status_code == status, (name, zeh.text)
    if status == 403:
        for reply in (discovery, events, zeh):
            assert reply.text == refusal(READ, name) + "\n"
    if status == 404:
        assert discovery.text == f"No stream '{name}'.\n"


async def check_dcb(
    http: httpx.AsyncClient, tenancy: Tenancy, grants: list[Grant], name: str
) -> None:
    """A read and an append, as bob; a refused append stores nothing."""
    path = f"/dcb/v1/streams/{name}" if name != "events" else "/dcb/v1"
    partitioned = STREAMS.get(name, 1) > 1
    before = await tenancy.head(name) if name in STREAMS else None
    for action, right in (("read", READ), ("append", WRITE)):
        status = expected(grants, name, right)
        body: dict[str, Any] = {}
        if action == "append":
            body = {"events": [{"type": "Forged", "data": {"forged_salary": 1}, "tags": []}]}
        reply = await http.post(f"{path}/{action}", json=body)
        if status == 403:
            assert (reply.status_code, reply.json()) == (
                403,
                {"error": "AccessDenied", "message": refusal(right, name)},
            ), (name, action)
        elif status == 404:
            assert (reply.status_code, reply.json()["error"]) == (404, "UnknownStream")
        elif partitioned:  # allowed, but DCB serves streams of one partition only
            assert (reply.status_code, reply.json()["error"]) == (400, "PartitionedStream")
        else:
            assert reply.status_code == 200, (name, action, reply.text)
            if action == "read":
                types = [event["type"] for event in reply.json()["events"]]
                assert types[0] == "PLACED"
    if before is not None:
        allowed = expected(grants, name, WRITE) == 200 and not partitioned
        assert await tenancy.head(name) == before + allowed, name


@pytest.mark.parametrize("case", list(CASES))
async def test_the_feed_and_dcb_serve_what_each_grant_allows(
    start_server: ServerFactory, store_db: str, case: str
) -> None:
    server = await start_server(db=store_db)
    tenancy = await tenancy_of(server)
    grants = CASES[case]
    await tenancy.set_grants("bob", grants)
    async with httpx.AsyncClient(base_url=http_base(server), auth=BOB, timeout=30) as http:
        for name in [*STREAMS, *GHOSTS]:
            await check_feed(http, grants, name)
            await check_dcb(http, tenancy, grants, name)
        # what bob may not read never reached him: alice's salaries are where she left them
        async with httpx.AsyncClient(base_url=http_base(server), auth=ALICE) as alice:
            read = await alice.post("/dcb/v1/streams/payroll/read", json={})
            assert [e["type"] for e in read.json()["events"]] == ["PLACED", "SALARY"] + [
                "Forged"
            ] * (expected(grants, "payroll", WRITE) == 200)
        # a revoke is in use for the next request
        await tenancy.set_grants("bob", [])
        for name in ("orders", "payroll"):
            reply = await http.get(f"/feeds/{name}")
            assert (reply.status_code, reply.text) == (403, refusal(READ, name) + "\n")


async def test_a_feed_request_that_ran_when_the_right_was_revoked_ends_short(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A long poll that waits for events stops with the right it needed: the 200 went out,
    so the response is cut short rather than finished with another's events. A refusal,
    not a failure of the server: nothing is logged as an error."""
    server = await start_server()
    tenancy = await tenancy_of(server)
    await tenancy.set_grants("bob", [Grant("payroll", READ)])
    async with httpx.AsyncClient(base_url=http_base(server), auth=BOB, timeout=30) as http:
        token = (await http.get("/feeds/payroll")).json()["token"]
        params = {"token": token, "partition": "0", "cursor": "_last", "wait": "30"}
        async with http.stream("GET", "/feeds/payroll/events", params=params) as response:
            assert response.status_code == 200
            await tenancy.set_grants("bob", [])
            await tenancy.server.store.partition_log(
                tenancy.server.streams.get("payroll").partitions[0]  # type: ignore[union-attr]
            ).append("SALARY", '{"to":"alice","eur":10}')
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await response.aread()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- the console ---------------------------------------------------------------------------------


@pytest.fixture
async def console(start_server: ServerFactory) -> Tenancy:
    server = await start_server(console=ConsoleConfig(sample_seconds=0.2, refresh_seconds=0.3))
    tenancy = await tenancy_of(server)
    await tenancy.set_grants("bob", [Grant("orders*", READ | WRITE)])
    return tenancy


def console_url(tenancy: Tenancy) -> str:
    url = tenancy.server.console_url
    assert url is not None
    return url


@in_browser
@needs_chromium
async def test_bob_sees_nothing_of_payroll_in_the_console(console: Tenancy, page: Page) -> None:
    url = console_url(console)
    await log_in(page, console.server, *BOB)
    await expect(page.locator("#streams tr[data-stream=orders]")).to_have_count(2)
    await expect(page.locator("#streams tr[data-stream=orders] .head").first).to_have_text("1")
    await expect(page.locator(".count")).to_have_text("2 streams, 3 partitions shown")
    await expect(page.locator("main")).not_to_contain_text("payroll")
    await expect(page.locator("#streams tr[data-stream=events]")).to_have_count(0)
    # the Events page opens on a stream he may read; payroll's, asked for, is refused
    await page.locator("header nav").get_by_role("link", name="Events").click()
    await expect(page.get_by_label("Stream")).to_have_value("orders")
    for where in (
        "events?stream=payroll",
        "events?stream=payroll&id=1",
        "partition?stream=payroll&partition=0",
        "dcb?stream=payroll&run=1",
        "dcb?stream=payroll&run=1&tags=x",
        "tail?stream=payroll&run=1",
    ):
        await page.goto(url + where)
        await expect(page.get_by_role("alert")).to_have_text(refusal(READ, "payroll"))
        await expect(page.locator("main")).not_to_contain_text("SALARY")
    # a name no stream has is refused the same way; one under his prefix is "no such"
    await page.goto(url + "events?stream=ghost")
    await expect(page.get_by_role("alert")).to_have_text(refusal(READ, "ghost"))
    await page.goto(url + "events?stream=orders-ghost")
    await expect(page.get_by_role("alert")).to_have_text(
        "No such stream and partition: orders-ghost/0."
    )
    # the live tail's stream itself
    reply = await page.request.get(url + "tail/stream?stream=payroll&partition=0")
    assert reply.status == 403
    assert refusal(READ, "payroll") in await reply.text()


@in_browser
@needs_chromium
async def test_a_revoke_ends_alices_live_tail_and_her_open_views(
    console: Tenancy, page: Page
) -> None:
    url = console_url(console)
    await log_in(page, console.server, *ALICE)
    chart = await page.context.new_page()
    await chart.goto(url + "partition?stream=payroll&partition=0")
    await expect(chart.locator("dd.head")).to_have_text("2")
    await page.goto(url + "tail?stream=payroll&run=1")
    await expect(page.locator("#tail")).to_have_attribute("data-state", "live")
    payroll = console.server.streams.get("payroll")
    assert payroll is not None
    log = console.server.store.partition_log(payroll.partitions[0])
    await log.append("SALARY", '{"to":"alice","eur":11}')
    await expect(page.locator("#tail tbody tr")).to_have_count(1)
    await console.set_grants("alice", [Grant("orders*", READ | WRITE)])
    await expect(page.locator("#tail")).to_have_attribute("data-state", "ended")
    await expect(page.get_by_role("alert")).to_have_text(refusal(READ, "payroll"))
    await expect(chart.get_by_role("alert")).to_have_text(refusal(READ, "payroll"))
    await expect(chart.locator("dd.head")).to_have_count(0)


async def test_console_forms_need_the_right_and_consumers_show_as_rights_allow(
    console: Tenancy,
) -> None:
    server, url = console.server, console_url(console)
    orders = server.streams.partition("orders", 0)
    payroll = server.streams.partition("payroll", 0)
    assert orders is not None
    assert payroll is not None
    await server.store.partition_log(payroll).register_consumer(console.users["bob"], "PEEK")
    await server.store.partition_log(orders).register_consumer(console.users["bob"], "SHIP")
    await server.store.partition_log(orders).register_consumer(console.users["alice"], "BILL")

    async def logged_in(user: tuple[str, str]) -> tuple[httpx.AsyncClient, str]:
        http = httpx.AsyncClient(base_url=url, timeout=30)
        await console_login(http, user[0], user[1])
        token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("streams")).text)
        assert token is not None
        return http, token.group(1)

    def drop(stream: str, user: str, component: str, csrf: str) -> dict[str, str]:
        return {"csrf": csrf, "stream": stream, "partition": "0", "user": user,
                "component": component}  # fmt: skip

    async def registered() -> set[str]:
        """The components registered on orders/0 and payroll/0."""
        logs = [server.store.partition_log(partition) for partition in (orders, payroll)]
        return {row.component for log in logs for row in await log.consumers(None)}

    async def shown(http: httpx.AsyncClient) -> set[str]:
        """The components of the consumers page."""
        return set(re.findall(r'data-component="([^"]+)"', (await http.get("consumers")).text))

    bob, bob_csrf = await logged_in(BOB)
    alice, alice_csrf = await logged_in(ALICE)
    try:
        # bob registered PEEK on payroll (as the store allows); the console hides it and will
        # not drop it for him
        assert await shown(bob) == {"SHIP"}
        reply = await bob.post("consumers/drop", data=drop("payroll", "bob", "PEEK", bob_csrf))
        assert reply.status_code == 403
        assert f'role="alert">{refusal(READ, "payroll")}<' in reply.text
        # alice reads orders but does not manage it: bob's consumers there are not hers
        assert await shown(alice) == {"BILL"}
        for form in (
            drop("orders", "bob", "SHIP", alice_csrf),
            drop("orders", "bob", "NONE", alice_csrf),
        ):
            reply = await alice.post("consumers/drop", data=form)
            assert reply.status_code == 403
            assert f'role="alert">{refusal(MANAGE, "orders")}<' in reply.text
        reply = await alice.get(
            "consumers/confirm?action=seek&stream=orders&partition=0&user=bob&component=SHIP"
        )
        assert reply.status_code == 403
        assert await registered() == {"BILL", "PEEK", "SHIP"}
        # with manage on orders she sees and drops everyone's there
        await console.set_grants(
            "alice", [Grant("payroll", READ | WRITE), Grant("orders*", READ | WRITE | MANAGE)]
        )
        assert await shown(alice) == {"BILL", "SHIP"}
        assert 'class="count">2 consumers<' in (await alice.get("consumers")).text
        reply = await alice.post("consumers/drop", data=drop("orders", "bob", "SHIP", alice_csrf))
        assert reply.status_code == 303
        assert await registered() == {"BILL", "PEEK"}
    finally:
        await bob.aclose()
        await alice.aclose()


# -- /metrics with --metrics-user ----------------------------------------------------------------


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futoin_evt", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def add_users(db: Path, *names: str) -> None:
    for name in names:
        password = USERS.get(name, f"{name}-pw")
        added = run_cli(
            "user", "add", name, "--password-stdin", "--db", str(db), stdin=password + "\n"
        )
        assert added.returncode == 0, added.stderr


def refusals(text: str, door: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "futoin_evt_door_refusals_total" and sample.labels["door"] == door
    )


def test_metrics_ask_for_the_metrics_users_password(tmp_path: Path) -> None:
    db = tmp_path / "metrics.sqlite"
    add_users(db, "alice", "scraper")
    server = ServerProcess(db, 0, "--metrics", "127.0.0.1:0", "--metrics-user", "scraper")
    try:
        found = re.search(r"http://127\.0\.0\.1:[0-9]+/metrics", server.line)
        assert found is not None, server.line
        url = found.group(0)
        for auth in (None, ("scraper", "wrong"), ALICE, ("nobody", "x")):
            reply = httpx.get(url, auth=auth, timeout=30)
            assert reply.status_code == 401, auth
            assert reply.headers["www-authenticate"] == (
                'Basic realm="futoin-evt metrics", charset="UTF-8"'
            )
            assert "futoin_evt" not in reply.text
        reply = httpx.get(url, auth=("scraper", "scraper-pw"), timeout=30)
        assert reply.status_code == 200
        assert refusals(reply.text, "metrics") == 3  # the three with credentials
        # the probes stay open
        base = url.removesuffix("/metrics")
        assert httpx.get(base + "/healthz", timeout=30).status_code == 200
        assert httpx.get(base + "/readyz", timeout=30).status_code == 200
    finally:
        assert server.stop() == 0


def test_metrics_user_needs_metrics(tmp_path: Path) -> None:
    proc = run_cli("serve", "--db", str(tmp_path / "x.sqlite"), "--metrics-user", "scraper")
    assert proc.returncode == 2
    assert proc.stderr == "futoin-evt: --metrics-user needs --metrics.\n"


# -- --feed-users, deprecated --------------------------------------------------------------------


def test_feed_users_grant_read_on_every_stream_with_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "feed-users.sqlite"
    add_users(db, "alice", "bob", "carol")
    assert run_cli("grant", "bob", "read", "orders*", "--db", str(db)).returncode == 0
    server = ServerProcess(db, 0, "--feed-users", "alice,nobody")
    try:
        feed = server.url.replace("ws", "http", 1) + "feed"
        assert httpx.get(feed, auth=ALICE, timeout=30).status_code == 200
        for user in ("bob", "carol"):
            reply = httpx.get(feed, auth=(user, USERS.get(user, f"{user}-pw")), timeout=30)
            assert (reply.status_code, reply.text) == (403, refusal(READ, "events") + "\n")
    finally:
        code, logged = server.stop_and_read_log(timeout=30)
    assert code == 0
    warning = [line for line in logged.splitlines() if "--feed-users" in line]
    assert len(warning) == 1, logged
    assert "--feed-users is deprecated: rights per stream decide who reads a feed" in warning[0]
    assert "granted read on * to alice; no user nobody;" in warning[0]
    assert "these may read streams through them: bob." in warning[0]
    assert "futoin-evt grant USER read PATTERN" in warning[0]
    shown = json.loads(run_cli("user", "show", "alice", "--json", "--db", str(db)).stdout)
    assert shown["grants"] == [{"pattern": "*", "rights": ["read"]}]
    # once granted, a restart grants nothing again
    again = ServerProcess(db, 0, "--feed-users", "alice")
    code, logged = again.stop_and_read_log(timeout=30)
    assert "granted read on" not in logged
    assert "--feed-users is deprecated" in logged


# -- files ---------------------------------------------------------------------------------------


async def test_the_archive_file_is_readable_by_its_owner_only(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    archive = tmp_path / "archive.sqlite"
    umask = os.umask(0o022)
    try:
        server = await start_server(archive_path=archive)
        await server.store.append("E", "{}")
        assert server.archiver is not None
        await server.archiver.archived_to.wait_beyond(0)
    finally:
        os.umask(umask)
    for path in (archive, Path(f"{archive}-wal"), Path(f"{archive}-shm")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
