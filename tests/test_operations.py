"""Operations: the archiver, connection limits, abuse, and crashes."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from futoin_evt.client.aio import CommError, Event, EventStreamClient
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.ftn3.errors import FTN3Error
from futoin_evt.log.archive import RemoteArchiver
from futoin_evt.server.app import EventServer
from futoin_evt.server.websocket import Limits

from .support.servers import ServerFactory, ServerProcess, add_user, free_port

pytestmark = pytest.mark.functional

ALICE = "alice:alice-pw"


def archived(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return [(int(i), t) for i, t in conn.execute("SELECT id, type FROM events ORDER BY id")]


# -- the archiver --------------------------------------------------------------------------------


async def test_in_process_archive_exactly_once_across_restarts(
    db_path: Path, start_server: ServerFactory, tmp_path: Path
) -> None:
    archive = tmp_path / "archive.sqlite"
    server = await start_server(archive_path=archive)
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        first = [await client.add_event("A", i) for i in range(300)]
    assert server.archiver is not None
    await asyncio.wait_for(server.archiver.archived_to.wait_beyond(first[-1] - 1), 30)
    await server.close()
    # as after a crash between archiving and acknowledging: the position is behind the archive
    with sqlite3.connect(server.db) as conn:
        conn.execute("UPDATE consumers SET position = 100 WHERE component = 'ARCHIVE'")
    server = await start_server(archive_path=archive)
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        second = [await client.add_event("B", i) for i in range(200)]
    assert server.archiver is not None
    await asyncio.wait_for(server.archiver.archived_to.wait_beyond(second[-1] - 1), 30)
    assert [i for i, _ in archived(archive)] == first + second
    # the archive is a reliable consumer: what it archived may be discarded
    await server.discarder.discard()
    assert (await server.store.stream_bounds()).events == 0


async def test_remote_archiver(
    server: EventServer, alice: EventStreamClient, tmp_path: Path
) -> None:
    archive = tmp_path / "remote-archive.sqlite"

    async def archive_up_to(last_id: int) -> None:
        """Run the archiver (a process of its own, in life) until it has ``last_id``."""
        archiver = RemoteArchiver(server.url, ALICE, archive, "ARCHIVE")
        task = asyncio.create_task(archiver.run())
        await asyncio.wait_for(archiver.receiver.progress.wait_beyond(last_id - 1), 30)
        archiver.stop()
        await asyncio.wait_for(task, 30)

    ids = [await alice.add_event("R", i) for i in range(100)]
    await archive_up_to(ids[-1])
    more = [await alice.add_event("R", i) for i in range(50)]
    await archive_up_to(more[-1])  # resumes: nothing archived twice
    assert [i for i, _ in archived(archive)] == ids + more


# -- limits and abuse ----------------------------------------------------------------------------


async def test_connections_over_the_limit_are_refused(start_server: ServerFactory) -> None:
    server = await start_server(limits=Limits(max_connections=3))
    clients = [await EventStreamClient.connect(server.url, credentials=ALICE) for _ in range(3)]
    assert [await c.ping(i) for i, c in enumerate(clients)] == [0, 1, 2]
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as one_too_many:
        with pytest.raises(FTN3Error, match="DefenseRejected"):
            await one_too_many.ping(3)
    assert [await c.ping(i) for i, c in enumerate(clients)] == [0, 1, 2]
    for client in clients:
        await client.close()


async def test_many_idle_connections_and_a_peer_that_never_reads(
    start_server: ServerFactory,
) -> None:
    server = await start_server(limits=Limits(max_unread_bytes=256 * 1024))
    idle = [await connect(server.url) for _ in range(200)]
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        await asyncio.gather(*(client.add_event("BIG", "x" * 60_000) for _ in range(20)))
        greedy = await connect(server.url, max_size=None)
        greedy.transport.pause_reading()  # asks, never reads the answers
        request = {"f": "futoin.evt.poll:1.1:pollEvents", "p": {"component": "LIVE"},
                   "sec": ALICE}  # fmt: skip
        for i in range(40):
            await greedy.send(json.dumps({**request, "rid": f"C{i + 1}"}))
        # the server keeps serving everyone else ...
        assert await client.ping(7) == 7
        # ... and dropped the greedy peer: reading again, it finds the connection gone
        greedy.transport.resume_reading()
        replies, closed = await read_until_closed(greedy)
        assert closed
        assert replies < 40
        assert len(await client.poll_events("LIVE")) == 20
    for ws in idle:
        await ws.close()


async def read_until_closed(ws: Any) -> tuple[int, bool]:
    """Frames read before the connection closed, and whether it did (within 30 s)."""
    replies = 0
    try:
        async with asyncio.timeout(30):
            async for _frame in ws:
                replies += 1
    except ConnectionClosed:
        return replies, True
    return replies, ws.close_code is not None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FUNCTIONS = st.sampled_from([
    "futoin.evt.gen:1.1:addEvent", "futoin.evt.poll:1.0:pollEvents",
    "futoin.evt.push:1.1:readyToReceive", "futoinevt.ops:1.0:dropConsumer",
    "a:1.0:b", "bad", "",
])  # fmt: skip
SECS = st.sampled_from([ALICE, "alice:x", "", "-hmac:a:b:c"]) | JSON_VALUES
MESSAGES = st.one_of(
    st.binary(max_size=200),
    JSON_VALUES.map(json.dumps),
    st.fixed_dictionaries(
        {"rid": st.sampled_from(["C1", "C2", "S1", "X", 1]), "f": FUNCTIONS | st.text(max_size=30)},
        optional={"p": JSON_VALUES, "sec": SECS, "x": JSON_VALUES},
    ).map(json.dumps),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=st.lists(MESSAGES, min_size=1, max_size=5))
def test_fuzzed_messages_never_hurt_the_server(
    fuzz_server: tuple[asyncio.AbstractEventLoop, EventServer, EventStreamClient],
    messages: list[Any],
) -> None:
    loop, server, bystander = fuzz_server

    async def attack() -> None:
        async with connect(server.url, max_size=None) as ws:
            for message in messages:
                await ws.send(message)
            await ws.send(json.dumps({"rid": "C99", "f": "futoin.evt.gen:1.1:ping",
                                      "p": {"echo": 5}, "sec": ALICE}))  # fmt: skip
            replies: list[dict[str, Any]] = []
            try:
                async with asyncio.timeout(10):
                    async for frame in ws:
                        replies.append(json.loads(frame))
                        if replies[-1].get("rid") == "C99":
                            break
            except ConnectionClosed:
                pass
            for reply in replies:  # only FTN3 replies, with an error name or a result
                if str(reply.get("rid", "")).startswith("S"):
                    continue  # a request of the server's own (a push it was asked for)
                assert set(reply) <= {"r", "e", "edesc", "rid"}
                assert isinstance(reply.get("e", ""), str)
            answered = bool(replies) and replies[-1].get("rid") == "C99"
            # the ping got its answer, or the connection was closed for an unanswerable frame
            assert answered or ws.close_code in (1008, 1009)
        assert await bystander.ping(3) == 3  # everyone else is served throughout

    loop.run_until_complete(attack())


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, password_hashes: dict[str, str]) -> Any:
    """One server for all fuzzed examples (hypothesis runs the test many times)."""
    from futoin_evt.log.retention import RetentionConfig
    from futoin_evt.server.app import ServerConfig
    from futoin_evt.server.websocket import TransportConfig

    loop = asyncio.new_event_loop()

    async def start() -> tuple[EventServer, EventStreamClient]:
        config = ServerConfig(
            db=tmp_path_factory.mktemp("fuzz") / "fuzz.sqlite",
            transport=TransportConfig(port=0),
            retention=RetentionConfig(interval=3600),
        )
        server = await EventServer.start(config)
        await add_user(server.store, "alice", password_hashes["alice"])
        await server.access.changed_here()
        client = await EventStreamClient.connect(server.url, credentials=ALICE)
        return server, client

    server, client = loop.run_until_complete(start())
    yield loop, server, client
    loop.run_until_complete(client.close())
    loop.run_until_complete(server.close())
    loop.close()


# -- crashes -------------------------------------------------------------------------------------


async def test_sigkill_at_random_points_loses_nothing_acknowledged(
    tmp_path: Path, password_hashes: dict[str, str], serve_workers: int
) -> None:
    """Producers at full speed and a reliable receiver that keeps its position with its
    effects; the server (all its workers) is killed (SIGKILL) at random points and started
    again."""
    from futoin_evt.storage.sqlite import SqliteStore

    db = tmp_path / "crash.sqlite"
    async with await SqliteStore.open(db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    port = free_port()
    server = ServerProcess(db, port, workers=serve_workers)
    url = server.url
    app_db = sqlite3.connect(tmp_path / "app.sqlite", isolation_level=None)
    app_db.execute("CREATE TABLE seen (id INTEGER PRIMARY KEY)")  # a duplicate would fail here
    app_db.execute("CREATE TABLE position (one INTEGER PRIMARY KEY, last_id INTEGER)")

    order: list[int] = []

    async def apply(events: list[Event]) -> None:
        """The application's effect and its position in one transaction."""
        order.extend(e.id for e in events)
        app_db.execute("BEGIN")
        app_db.executemany("INSERT INTO seen (id) VALUES (?)", [(e.id,) for e in events])
        app_db.execute("INSERT OR REPLACE INTO position VALUES (1, ?)", (events[-1].id,))
        app_db.execute("COMMIT")

    receiver = ReliableReceiver(url, credentials=ALICE, component="CRASH", on_events=apply,
                                reconnect_initial=0.02, reconnect_max=0.2)  # fmt: skip
    receiver_task = asyncio.create_task(receiver.run())
    acknowledged: list[int] = []
    acknowledged_more = asyncio.Event()
    stop_producing = asyncio.Event()

    async def produce() -> None:
        while not stop_producing.is_set():
            try:
                async with await EventStreamClient.connect(url, credentials=ALICE) as client:
                    while not stop_producing.is_set():
                        ids = await asyncio.gather(
                            *(client.add_event("C", i) for i in range(32)), return_exceptions=True
                        )
                        acknowledged.extend(i for i in ids if isinstance(i, int))
                        acknowledged_more.set()
                        if any(isinstance(i, BaseException) for i in ids):
                            break
            except CommError:
                await asyncio.sleep(0.02)  # the server is down: try again shortly

    producers = [asyncio.create_task(produce()) for _ in range(2)]
    kills = 4
    rng = random.Random(20261122)
    for _ in range(kills):
        target = len(acknowledged) + rng.randint(200, 2000)
        async with asyncio.timeout(60):
            while len(acknowledged) < target:
                acknowledged_more.clear()
                await acknowledged_more.wait()
        server.kill()
        server = ServerProcess(db, port, workers=serve_workers)
    stop_producing.set()
    await asyncio.gather(*producers)
    # events stored at the last kill but never acknowledged may be newer than any that were
    newest = max(acknowledged)
    with sqlite3.connect(db) as conn:
        (stored_newest,) = conn.execute("SELECT MAX(id) FROM events").fetchone()
    await asyncio.wait_for(receiver.progress.wait_beyond(max(newest, stored_newest or 0) - 1), 60)
    receiver.stop()
    await asyncio.wait_for(receiver_task, 30)
    server.stop()

    seen = [row[0] for row in app_db.execute("SELECT id FROM seen ORDER BY id")]
    assert len(set(acknowledged)) == len(acknowledged), "an id was given out twice"
    assert set(acknowledged) <= set(seen), "an acknowledged event was lost"
    with sqlite3.connect(db) as conn:
        stored = [row[0] for row in conn.execute("SELECT id FROM events ORDER BY id")]
    # the receiver saw each stored event once (events it read may be discarded already)
    assert set(stored) <= set(seen)
    assert order == sorted(order) == seen  # in order, each once
    assert receiver.sessions >= 2  # it came back after the server died


async def test_sigkill_at_normal_keeps_every_event_acknowledged_one_at_a_time(
    tmp_path: Path, password_hashes: dict[str, str]
) -> None:
    """At ``--durability normal`` a lone addEvent commits inline on the event loop; what was
    acknowledged before a SIGKILL is there after the restart, in order, with its data."""
    from futoin_evt.storage.sqlite import SqliteStore

    db = tmp_path / "crash.sqlite"
    async with await SqliteStore.open(db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    port = free_port()
    acknowledged: list[tuple[int, int]] = []
    for run in range(3):
        server = ServerProcess(db, port, "--durability", "normal", "--workers", "1")
        async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
            for i in range(300):
                acknowledged.append((await client.add_event("ONE", run * 1000 + i), run * 1000 + i))
        server.kill()
    rows = sqlite3.connect(db).execute("SELECT id, data FROM events ORDER BY id").fetchall()
    assert [(event_id, json.loads(data)) for event_id, data in rows] == acknowledged
