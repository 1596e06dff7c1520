"""Push delivery: readyToReceive/onEvents with the official JS receivers and our own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.receiver import LiveReceiver, ReliableReceiver
from futoin_evt.ftn18.push import PushStream
from futoin_evt.server.app import EventServer

from .support.push import Collector, JsReceiver, add_many, running, stop
from .support.servers import ALICE, ClientFactory, ServerProcess, add_user, free_port

pytestmark = pytest.mark.functional


def stream_of(server: EventServer, component: str) -> PushStream:
    (stream,) = [s for s in server.push.streams if s.component == component]
    return stream


# -- the official JavaScript receivers -----------------------------------------------------------


@pytest.mark.interop
async def test_official_reliable_receiver_gets_history_then_10000_live_events(
    js_peer: Path, server: EventServer, alice: EventStreamClient
) -> None:
    history = await add_many(alice, 100, "HISTORY")
    total = 10_100
    receiver = await JsReceiver.start(js_peer, {
        "endpoint": "secure+" + server.url, "credentials": ALICE,
        "component": "JSREL", "count": total,
    })  # fmt: skip
    live = await add_many(alice, 10_000, "LIVE_EVENT")
    assert live[-1] == total
    got = await receiver.received()
    assert [int(e["id"]) for e in got] == history + live


@pytest.mark.interop
async def test_official_live_receiver_gets_only_wanted_types(
    js_peer: Path, server: EventServer, alice: EventStreamClient
) -> None:
    await alice.add_event("WANTED", "before the receiver: not live")
    receiver = await JsReceiver.start(js_peer, {
        "endpoint": "secure+" + server.url, "credentials": ALICE, "live": True,
        "component": "LIVE", "want": ["WANTED"], "count": 100,
    })  # fmt: skip
    wanted = []
    for i in range(300):
        if i % 3 == 0:
            wanted.append(await alice.add_event("WANTED", i))
        else:
            await alice.add_event("OTHER", i)
    got = await receiver.received()
    assert {e["type"] for e in got} == {"WANTED"}
    assert [int(e["id"]) for e in got] == wanted


# -- our receivers -----------------------------------------------------------------------------


async def test_reliable_receiver_gets_history_and_new_events_once_in_order(
    server: EventServer, alice: EventStreamClient
) -> None:
    history = await add_many(alice, 50)
    app = Collector()
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="R", on_events=app)
    task = await running(receiver)
    live = await add_many(alice, 3000)
    await app.wait_for(live[-1])
    stream = stream_of(server, "R")
    async with asyncio.timeout(30):
        await stream.durable.wait_beyond(live[-1] - 1)  # the last group's ack is stored
    await stop(receiver, task)
    assert app.ids == history + live
    user = await server.store.get_user("alice")
    assert user is not None
    assert await server.store.position(user.id, "R") == live[-1]


async def test_callback_failures_are_retried_with_backoff_and_lose_nothing(
    server: EventServer, alice: EventStreamClient
) -> None:
    app = Collector()
    app.fail_times = 3
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="FLAKY", on_events=app)
    task = await running(receiver)
    ids = await add_many(alice, 500)
    await app.wait_for(ids[-1])
    stats = stream_of(server, "FLAKY").stats
    await stop(receiver, task)
    assert app.ids == ids
    assert stats.groups_failed == 3
    assert stats.retrying == 0


async def test_dropped_connection_with_groups_in_flight(
    server: EventServer, alice: EventStreamClient
) -> None:
    ids = await add_many(alice, 2500)  # more groups than fit the window
    app = Collector()
    app.gate = asyncio.Event()
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="DROP", on_events=app)
    task = asyncio.create_task(receiver.run())
    async with asyncio.timeout(30):
        await app.arrived.wait()  # the first group is in the callback, more are in flight
    stream = stream_of(server, "DROP")
    assert stream.in_flight >= 1
    sessions = receiver.sessions
    stream.link.abort()  # the server drops the connection
    app.gate.set()
    more = await add_many(alice, 100)
    await app.wait_for(more[-1])
    await stop(receiver, task)
    assert receiver.sessions > sessions
    assert app.ids == ids + more


async def test_new_receiver_takes_over_the_component(
    server: EventServer, alice: EventStreamClient
) -> None:
    first_app, second_app = Collector(), Collector()
    first = ReliableReceiver(server.url, credentials=ALICE, component="ONE", on_events=first_app)
    first_task = await running(first)
    before = await add_many(alice, 10)
    await first_app.wait_for(before[-1])
    second = ReliableReceiver(server.url, credentials=ALICE, component="ONE", on_events=second_app)
    second_task = await running(second)
    after = await add_many(alice, 200)
    await second_app.wait_for(after[-1])
    assert first_app.ids == before
    assert second_app.ids == after
    assert first.sessions == 1  # the first keeps its connection, it just gets nothing more
    await stop(first, first_task)
    await stop(second, second_task)


async def test_unregistered_and_not_bidirectional(server: EventServer) -> None:
    async with await FTN3Client.connect(server.url, credentials=ALICE) as client:
        with pytest.raises(RemoteError) as info:
            await client.call("futoin.evt.push:1.1", "readyToReceive", {"component": "NOPE"})
        assert info.value.name == "NotRegistered"
        assert await client.call("futoin.evt.push:1.0", "readyToReceive", {"component": "LIVE"})


async def test_live_receiver_gets_new_events_with_want(
    server: EventServer, alice: EventStreamClient
) -> None:
    await alice.add_event("A", "old")
    app = Collector()
    receiver = LiveReceiver(server.url, credentials=ALICE, on_events=app, want=["A"])
    task = await running(receiver)
    a_ids = []
    for i in range(20):
        a_ids.append(await alice.add_event("A", i))
        await alice.add_event("B", i)
    await app.wait_for(a_ids[-1])
    await stop(receiver, task)
    assert app.ids == a_ids


async def test_a_live_consumer_that_stops_reading_is_bounded_and_harms_nobody(
    server: EventServer, connect: ClientFactory
) -> None:
    producer = await connect("alice")
    app = Collector()
    reliable = ReliableReceiver(server.url, credentials=ALICE, component="STEADY", on_events=app)
    reliable_task = await running(reliable)
    stalled = await FTN3Client.connect(server.url, credentials="bob:bob-pw")
    assert await stalled.call("futoin.evt.push:1.1", "readyToReceive", {"component": "LIVE"})
    stalled._io.pause_reading()
    padding = "x" * 2000
    ids = await add_many(producer, 10_000, pad=padding)  # far more than socket buffers hold
    await app.wait_for(ids[-1])
    (live,) = [s for s in server.push.streams if s.component == "LIVE"]
    assert live.queued <= server.push.config.live_queue_groups
    assert live.stats.groups_dropped > 0
    assert app.ids == ids
    await stop(reliable, reliable_task)
    stalled._io.abort()


async def test_events_iterator(server: EventServer, alice: EventStreamClient) -> None:
    ids = await add_many(alice, 30)
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="ITER")
    seen: list[int] = []
    async with asyncio.timeout(30):
        async for event in receiver.events():
            seen.append(event.id)
            if event.id == ids[-1]:
                break
    assert seen == ids


# -- crash and restart ---------------------------------------------------------------------------


@pytest.fixture
async def server_process(
    tmp_path: Path, password_hashes: dict[str, str], serve_workers: int
) -> AsyncIterator[list[ServerProcess]]:
    """A server in its own process (to SIGKILL), with alice as a user; one worker, then
    two."""
    from futoin_evt.storage.sqlite import SqliteStore

    db = tmp_path / "crash.sqlite"
    async with await SqliteStore.open(db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    processes = [ServerProcess(db, free_port(), workers=serve_workers)]
    yield processes
    for proc in processes:
        if proc.proc.poll() is None:
            proc.kill()


async def test_reliable_receiver_survives_a_server_crash(
    server_process: list[ServerProcess], tmp_path: Path, serve_workers: int
) -> None:
    first = server_process[0]
    app = Collector()
    receiver = ReliableReceiver(first.url, credentials=ALICE, component="CRASH", on_events=app)
    task = await running(receiver)
    async with await EventStreamClient.connect(first.url, credentials=ALICE) as producer:
        before = await add_many(producer, 1500)
    await app.wait_for(before[-1])
    first.kill()
    second = ServerProcess(tmp_path / "crash.sqlite", first.port, workers=serve_workers)
    server_process.append(second)
    async with await EventStreamClient.connect(second.url, credentials=ALICE) as producer:
        after = await add_many(producer, 1500)
    await app.wait_for(after[-1])
    await stop(receiver, task)
    assert receiver.sessions >= 2
    assert app.ids == before + after


async def test_a_user_cannot_receive_another_users_consumer(
    server: EventServer, alice: EventStreamClient
) -> None:
    await alice.register_consumer("PRIVATE")
    async with await FTN3Client.connect(server.url, credentials="bob:bob-pw") as bob:
        with pytest.raises(RemoteError) as info:
            await bob.call("futoin.evt.push:1.1", "readyToReceive", {"component": "PRIVATE"})
        assert info.value.name == "NotRegistered"
    assert server.push.streams == []


async def test_events_another_process_commits_reach_receivers_and_readers(
    db_path: Path, server: EventServer, alice: EventStreamClient
) -> None:
    """The native API from another connection (an application's own transaction)."""
    import sqlite3

    from futoin_evt.storage.sqlite.native import add_event

    first = await alice.add_event("OURS", 1)
    app = Collector()
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="NATIVE", on_events=app)
    task = await running(receiver)
    with sqlite3.connect(server.db) as conn:  # commits on leaving the block
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders DEFAULT VALUES")
        theirs = add_event(conn, "THEIRS", {"order": 1})
    await app.wait_for(theirs)  # noticed within the watcher's interval, with no new write of ours
    ours_again = await alice.add_event("OURS", 2)
    await app.wait_for(ours_again)
    await stop(receiver, task)
    assert app.ids == [first, theirs, ours_again]
    # the recent-events ring never hides the other process's event from a reader
    assert [e.id for e in await alice.poll_events("LIVE", last_id=first)] == [theirs, ours_again]
