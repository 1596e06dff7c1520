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

import pytest

from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.storage import open_store

from .support import console
from .support.console import Connect, consoled
from .support.push import Collector, running, stop
from .support.servers import USERS, ServerProcess, add_user
from .support.sql import execute_sql
from .support.waiting import Deadline
from .support.workers import WITHIN_SECONDS, until

#: The database of the console behind a group of workers.
db = console.db

pytestmark = pytest.mark.functional


async def ended(tail: http.client.HTTPResponse) -> str:
    """What the ``ended`` event of a live tail says (heartbeats and data before it skipped)."""
    deadline = Deadline(WITHIN_SECONDS)
    while True:
        deadline.check("the tail ends")
        line = await asyncio.to_thread(tail.readline)
        assert line, "the tail was closed without an ended event"
        if line == b"event: ended\n":
            data = await asyncio.to_thread(tail.readline)
            return data.decode().removeprefix("data: ").strip()


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
