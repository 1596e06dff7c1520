"""Push delivery: readyToReceive/onEvents with the official JS receivers and our own."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.client.aio import Event, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.receiver import LiveReceiver, Receiver, ReliableReceiver
from futoin_evt.ftn18.push import PushStream
from futoin_evt.server.app import EventServer

from .conftest import ClientFactory, ServerProcess, add_user, free_port

pytestmark = pytest.mark.functional

ALICE = "alice:alice-pw"


async def add_many(
    client: EventStreamClient, count: int, event_type: str = "E", **data: Any
) -> list[int]:
    """Add ``count`` events with 32 in flight; return their ids in order."""
    ids: list[int] = []
    for start in range(0, count, 32):
        batch = range(start, min(start + 32, count))
        ids.extend(
            await asyncio.gather(*(client.add_event(event_type, {"i": i, **data}) for i in batch))
        )
    return sorted(ids)


class Collector:
    """An application callback that records what it got and can fail or block on purpose."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.fail_times = 0
        self.gate: asyncio.Event | None = None
        self.arrived = asyncio.Event()
        self.changed = asyncio.Event()

    async def __call__(self, events: list[Event]) -> None:
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("the application failed on purpose")
        self.events.extend(events)
        self.changed.set()

    @property
    def ids(self) -> list[int]:
        return [e.id for e in self.events]

    async def wait_for(self, last_id: int) -> None:
        async with asyncio.timeout(60):
            while not self.events or self.events[-1].id < last_id:
                self.changed.clear()
                await self.changed.wait()


async def running(receiver: Receiver) -> asyncio.Task[None]:
    task = asyncio.create_task(receiver.run())
    async with asyncio.timeout(30):
        await receiver.ready.wait()
    return task


async def stop(receiver: Receiver, task: asyncio.Task[None]) -> None:
    receiver.stop()
    async with asyncio.timeout(30):
        await task


def stream_of(server: EventServer, component: str) -> PushStream:
    (stream,) = [s for s in server.push.streams if s.component == component]
    return stream


# -- the official JavaScript receivers -----------------------------------------------------------


class JsReceiver:
    """receive.js: the official receiver, printing what it gets."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        #: Events pushed before the readyToReceive reply (FTN18 allows that).
        self.early: list[dict[str, str]] = []

    @classmethod
    async def start(cls, js_peer: Path, options: dict[str, Any]) -> JsReceiver:
        proc = await asyncio.create_subprocess_exec(
            "node", "receive.js", json.dumps(options), cwd=js_peer,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )  # fmt: skip
        receiver = cls(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while (line := json.loads(await proc.stdout.readline())) != {"ready": True}:
                receiver.early.append(line)
        return receiver

    async def received(self) -> list[dict[str, str]]:
        async with asyncio.timeout(120):
            out, err = await self.proc.communicate()
        assert self.proc.returncode == 0, err.decode()
        return self.early + [json.loads(line) for line in out.decode().splitlines()]


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

    from futoin_evt.storage.native import add_event

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
