"""The FTN18 door per partition: ``ws://HOST:PORT/NAME/P`` serves gen, poll and push for one
partition of a stream, ``/NAME`` pins each producer connection to one partition of a
partitioned stream, ``/`` stays ``events``/0; other paths are refused at the upgrade. On
both backends, with our client and the official JS one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.client.aio import CommError, EventStreamClient, RemoteError
from futoin_evt.client.receiver import LiveReceiver, ReliableReceiver
from futoin_evt.domain.partition import DEFAULT_PARTITION, Partition
from futoin_evt.domain.stream import STREAM_NAME_RULE, UserId
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from .support.cli import stream_command
from .support.js import run_js
from .support.push import Collector, JsReceiver, running, stop
from .support.servers import USERS, add_user
from .support.waiting import until

pytestmark = pytest.mark.functional

ALICE = "alice:alice-pw"
PUSH = "futoin.evt.push:1.1"
PARTITIONS = 4


@pytest.fixture
async def server(store_db: str, password_hashes: dict[str, str]) -> AsyncIterator[EventServer]:
    """A server on either backend with alice and bob, and the stream ``orders`` of 4
    partitions (known to the server before the test starts)."""
    config = ServerConfig(
        db=store_db,
        transport=TransportConfig(port=0),
        check_results=True,
        retention=RetentionConfig(interval=3600),
    )
    async with await EventServer.start(config) as started:
        for name, password_hash in password_hashes.items():
            await add_user(started.store, name, password_hash)
        await started.access.changed_here()
        await started.store.add_stream("orders", PARTITIONS)
        await started.streams.refresh()
        yield started


Connect = Callable[..., Awaitable[EventStreamClient]]


@pytest.fixture
async def connect(server: EventServer) -> AsyncIterator[Connect]:
    """Open clients to a path of ``server`` (closed at the end)."""
    clients: list[EventStreamClient] = []

    async def open_client(path: str, user: str = "alice") -> EventStreamClient:
        client = await EventStreamClient.connect(
            server.url + path, credentials=f"{user}:{USERS[user]}"
        )
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()


def partition(server: EventServer, number: int, name: str = "orders") -> Partition:
    found = server.streams.partition(name, number)
    assert found is not None
    return found


async def user_id(server: EventServer, name: str) -> UserId:
    user = await server.store.get_user(name)
    assert user is not None
    return user.id


async def stored(server: EventServer, where: Partition) -> list[dict[str, Any]]:
    """Every event stored in a partition, read from the store."""
    log = server.store.partition_log(where)
    page = await log.read_events(0, max_bytes=1 << 20)
    events: list[dict[str, Any]] = json.loads(page.json)
    return events


async def everything_stored(server: EventServer) -> list[list[dict[str, Any]]]:
    """Every partition's events, ``events``/0 first."""
    partitions = [p for info in server.streams for p in info.partitions]
    return [await stored(server, p) for p in partitions]


async def upgrade(server: EventServer, path: str) -> tuple[int, str]:
    """A WebSocket upgrade to ``path``: the response's status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        body = b"" if status == 101 else await reader.read()
    writer.close()
    return status, body.decode()


# -- one log per partition ----------------------------------------------------------------------


async def test_each_partition_has_its_own_ids_and_consumers(
    server: EventServer, connect: Connect
) -> None:
    clients = [await connect(f"orders/{n}") for n in range(PARTITIONS)]
    for n, client in enumerate(clients):
        ids = [await client.add_event("ORDER", {"partition": n, "i": i}) for i in range(n + 1)]
        assert ids == list(range(1, n + 2))  # ids from 1 in every partition
    events0 = await connect("")
    assert await events0.add_event("OTHER", 0) == 1  # events/0 is a log of its own too
    for n, client in enumerate(clients):
        assert await client.register_consumer("C")
        page = await client.poll_events("C")
        assert [(e.id, e.data) for e in page] == [
            (i + 1, {"partition": n, "i": i}) for i in range(n + 1)
        ]
        await client.poll_events("C", last_id=page[-1].id)
    # consumers are per user, stream and partition
    on_2 = server.store.partition_log(partition(server, 2))
    assert await on_2.position(await user_id(server, "alice"), "C") == 3
    await clients[0].register_consumer("ONLY0")
    with pytest.raises(RemoteError) as refused:
        await clients[1].poll_events("ONLY0")
    assert refused.value.name == "NotRegistered"
    with pytest.raises(RemoteError):
        await events0.poll_events("C")
    bob = await connect("orders/2", "bob")
    with pytest.raises(RemoteError) as refused:
        await bob.poll_events("C")
    assert refused.value.name == "NotRegistered"


async def test_the_paths_of_events_0(server: EventServer, connect: Connect) -> None:
    ids = [
        await (await connect(path)).add_event("E", path)
        for path in ("", "events", "events/0", "events/", "?x=1")
    ]
    assert ids == [1, 2, 3, 4, 5]
    assert [e["data"] for e in await stored(server, DEFAULT_PARTITION)] == [
        "", "events", "events/0", "events/", "?x=1"
    ]  # fmt: skip


async def test_push_on_a_partition(server: EventServer, connect: Connect) -> None:
    producer = await connect("orders/2")
    other = await connect("orders/1")
    await producer.register_consumer("PUSHED", iface=PUSH)
    history = [await producer.add_event("ORDER", i) for i in range(3)]
    collector = Collector()
    receiver = ReliableReceiver(
        server.url + "orders/2", credentials=ALICE, component="PUSHED", on_events=collector
    )
    live_collector = Collector()
    live = LiveReceiver(server.url + "orders/2", credentials=ALICE, on_events=live_collector)
    task = await running(receiver)
    live_task = await running(live)
    alice = await user_id(server, "alice")
    assert server.push.connected_consumers(partition(server, 2)) == [(alice, "PUSHED")]
    assert server.push.connected_consumers(partition(server, 1)) == []
    assert server.push.connected_consumers(DEFAULT_PARTITION) == []
    assert server.push.streams == []  # the ops calls and metrics show events/0's
    await other.add_event("ELSEWHERE", 0)
    new = [await producer.add_event("ORDER", i) for i in range(3, 6)]
    await collector.wait_for(new[-1])
    await live_collector.wait_for(new[-1])
    assert collector.ids == history + new
    assert [e.data for e in collector.events] == list(range(6))
    assert live_collector.ids == new  # LIVE starts at this partition's head
    position = await server.store.partition_log(partition(server, 2)).position(alice, "PUSHED")
    assert position is not None
    await stop(receiver, task)
    await stop(live, live_task)


async def test_a_push_takeover_on_one_partition_leaves_the_others(
    server: EventServer, connect: Connect
) -> None:
    producers = [await connect(f"orders/{n}") for n in (0, 1)]
    receivers = []
    for n, producer in enumerate(producers):
        await producer.register_consumer("SAME", iface=PUSH)
        collector = Collector()
        receiver = ReliableReceiver(
            server.url + f"orders/{n}", credentials=ALICE, component="SAME", on_events=collector
        )
        receivers.append((receiver, await running(receiver), collector))
    assert len(server.push.connected_consumers(partition(server, 0))) == 1
    assert len(server.push.connected_consumers(partition(server, 1))) == 1
    # a second receiver of SAME on partition 1 takes over there only
    again = Collector()
    second = ReliableReceiver(
        server.url + "orders/1", credentials=ALICE, component="SAME", on_events=again
    )
    second_task = await running(second)
    for n, producer in enumerate(producers):
        await producer.add_event("ORDER", n)
    await receivers[0][2].wait_for(1)
    await again.wait_for(1)
    assert [e.data for e in receivers[0][2].events] == [0]
    assert [e.data for e in again.events] == [1]
    for receiver, task, _collector in receivers:
        await stop(receiver, task)
    await stop(second, second_task)


# -- /NAME: pinned producers, refused consumers -------------------------------------------------


async def test_a_partitioned_stream_by_name_pins_each_connection(
    server: EventServer, connect: Connect
) -> None:
    producers = [await connect("orders") for _ in range(PARTITIONS)]
    await asyncio.gather(*(
        asyncio.gather(*(p.add_event("ORDER", {"conn": c, "i": i}) for i in range(20)))
        for c, p in enumerate(producers)
    ))  # fmt: skip
    found: list[int] = []
    for n in range(PARTITIONS):
        events = await stored(server, partition(server, n))
        connections = {e["data"]["conn"] for e in events}
        assert len(connections) == 1, f"partition {n} holds events of {connections}"
        # one connection's events in the order its calls came, ids from 1
        assert [e["data"]["i"] for e in events] == list(range(20))
        assert [int(e["id"]) for e in events] == list(range(1, 21))
        found.extend(connections)
    assert sorted(found) == list(range(PARTITIONS))  # spread over the partitions
    assert await stored(server, DEFAULT_PARTITION) == []


async def test_consumer_calls_on_a_partitioned_stream_by_name_are_refused(
    server: EventServer, connect: Connect
) -> None:
    client = await connect("orders")
    calls = [
        client.register_consumer("C"),
        client.poll_events("C"),
        client.ftn3.call(PUSH, "readyToReceive", {"component": "C"}),
        client.ftn3.call(PUSH, "registerConsumer", {"component": "C"}),
    ]
    for call in calls:
        with pytest.raises(RemoteError) as refused:
            await call
        assert refused.value.name == "InvalidRequest"
        assert "/orders/0" in refused.value.desc
        assert "/orders/3" in refused.value.desc
    assert await client.ping(7) == 7
    for n in range(PARTITIONS):
        log = server.store.partition_log(partition(server, n))
        assert await log.consumers() == []


async def test_a_one_partition_stream_by_name_is_its_partition_0(
    server: EventServer, connect: Connect
) -> None:
    await server.store.add_stream("single", 1)
    await server.streams.refresh()
    by_name = await connect("single")
    assert await by_name.add_event("E", 1) == 1
    assert await by_name.register_consumer("C")
    by_number = await connect("single/0")
    assert [e.data for e in await by_number.poll_events("C")] == [1]


# -- refusals ----------------------------------------------------------------------------------


BAD_PATHS = [
    ("/orders/x", "Not a partition number: 'x' (use /NAME/P, P from 0)."),
    ("/orders/-1", "Not a partition number: '-1' (use /NAME/P, P from 0)."),
    ("/orders/99999", "Not a partition number: '99999' (use /NAME/P, P from 0)."),
    ("/orders/01", "Not a partition number: '01' (use /NAME/P, P from 0)."),
    ("/orders/%31", "Not a partition number: '%31' (use /NAME/P, P from 0)."),
    ("/nope/x", "Not a partition number: 'x' (use /NAME/P, P from 0)."),
    ("/orders/0/1", "Not an event stream path: '/orders/0/1' (use /NAME or /NAME/P)."),
    ("/Orders", f"No stream is named 'Orders': {STREAM_NAME_RULE}."),
    ("//", f"No stream is named '': {STREAM_NAME_RULE}."),
    ("/" + "o" * 3000, None),
    ("/orders/" + "9" * 3000, None),
]


@pytest.mark.parametrize(("path", "sentence"), BAD_PATHS, ids=lambda v: str(v)[:20])
async def test_a_path_that_is_not_a_partition_path_is_refused(
    server: EventServer, path: str, sentence: str | None
) -> None:
    status, body = await upgrade(server, path)
    assert status == 404
    assert body.count("\n") == 1
    assert body.endswith(".\n")
    assert len(body) < 200
    if sentence is not None:
        assert body == sentence + "\n"
    with pytest.raises(CommError, match="404"):
        await EventStreamClient.connect(server.url + path[1:], credentials=ALICE)
    assert await everything_stored(server) == [[]] * (1 + PARTITIONS)


MISSING = [
    ("/nope", "There is no stream nope."),
    ("/nope/0", "There is no stream nope."),
    ("/feed", "There is no stream feed."),
    ("/orders/4", "The stream orders has partitions 0 to 3, not 4."),
    ("/orders/1023", "The stream orders has partitions 0 to 3, not 1023."),
]


@pytest.mark.parametrize(("path", "sentence"), MISSING, ids=lambda v: str(v)[:20])
async def test_a_path_to_no_stream_or_partition_is_answered_at_each_call(
    server: EventServer, connect: Connect, path: str, sentence: str
) -> None:
    """The upgrade is not authenticated: a well-formed path is accepted, and each call says
    what is missing to a caller with rights on the name (see test_rights_ftn3 for others)."""
    assert (await upgrade(server, path))[0] == 101
    client = await connect(path[1:])
    for call in (
        client.add_event("E", 1),
        client.poll_events("LIVE"),
        client.register_consumer("C"),
        client.ftn3.call(PUSH, "readyToReceive", {"component": "LIVE"}),
        client.ftn3.call("futoinevt.ops:1.0", "streamInfo", {}),
    ):
        with pytest.raises(RemoteError) as refused:
            await call
        assert (refused.value.name, refused.value.desc) == ("InvalidRequest", sentence)
    assert await client.ping(5) == 5
    assert await everything_stored(server) == [[]] * (1 + PARTITIONS)


async def test_an_overlong_request_line_is_refused(server: EventServer) -> None:
    status, _body = await upgrade(server, "/" + "o" * 20_000)
    assert 400 <= status < 500
    assert await everything_stored(server) == [[]] * (1 + PARTITIONS)


# -- streams changing while served ------------------------------------------------------------


async def test_a_stream_added_while_serving_is_served(
    server: EventServer, store_db: str, connect: Connect
) -> None:
    """Even on a connection opened before it was there."""
    early = await connect("fresh/2")
    with pytest.raises(RemoteError, match="There is no stream fresh"):
        await early.add_event("E", 0)
    await stream_command(store_db, "add", "fresh", "--partitions", "3")
    await until(lambda: server.streams.get("fresh") is not None, "the new stream served", 5)
    assert await early.add_event("E", 1) == 1
    async with await EventStreamClient.connect(server.url + "fresh/2", credentials=ALICE) as c:
        assert await c.add_event("E", 2) == 2
    assert [e["data"] for e in await stored(server, partition(server, 2, "fresh"))] == [1, 2]


async def test_connections_to_a_dropped_stream_get_errors(
    server: EventServer, connect: Connect
) -> None:
    on_partition = await connect("orders/1")
    by_name = await connect("orders")
    await on_partition.register_consumer("C", iface=PUSH)
    receiver = ReliableReceiver(
        server.url + "orders/1",
        credentials=ALICE,
        component="C",
        on_events=Collector(),
        reconnect_max=0.05,
    )
    task = await running(receiver)
    sessions = receiver.sessions
    dropped = partition(server, 1)
    assert await server.store.drop_stream("orders")
    await server.streams.refresh()
    for client in (on_partition, by_name):
        with pytest.raises(RemoteError) as refused:
            await client.add_event("E", 1)
        assert (refused.value.name, refused.value.desc) == (
            "InvalidRequest", "The stream orders was dropped"
        )  # fmt: skip
        assert await client.ping(3) == 3
    with pytest.raises(RemoteError, match="dropped"):
        await on_partition.poll_events("C")
    assert server.push.connected_consumers(dropped) == []
    with pytest.raises(RemoteError, match="There is no stream orders"):
        await (await connect("orders/1")).add_event("E", 1)
    await stop(receiver, task)
    assert receiver.sessions == sessions  # it could not start again


# -- the official JS client -------------------------------------------------------------------


def call(face: str, method: str, *args: Any) -> dict[str, Any]:
    return {"face": face, "version": "1.1", "method": method, "args": list(args)}


@pytest.mark.interop
async def test_the_official_js_client_on_a_partition(
    js_peer: Path, server: EventServer, connect: Connect
) -> None:
    endpoint = "secure+" + server.url + "orders/3"
    await (await connect("orders/2")).add_event("ELSEWHERE", 0)
    out = await run_js(js_peer, "calls.js", {
        "endpoint": endpoint,
        "credentials": ALICE,
        "calls": [
            call("gen", "addEvent", "JS", {"n": 1}),
            call("gen", "addEvent", "JS", {"n": 2}),
            call("poll", "registerConsumer", "JSC"),
            call("poll", "pollEvents", "JSC", None, None),
            call("push", "registerConsumer", "JSPUSH"),
        ],
    })  # fmt: skip
    assert out[:3] == [{"ok": "1"}, {"ok": "2"}, {"ok": True}]
    assert [(e["id"], e["data"]) for e in out[3]["ok"]] == [("1", {"n": 1}), ("2", {"n": 2})]
    assert out[4] == {"ok": True}
    receiver = await JsReceiver.start(js_peer, {
        "endpoint": endpoint, "credentials": ALICE, "component": "JSPUSH", "count": 4,
    })  # fmt: skip
    producer = await connect("orders/3")
    await producer.add_event("LIVE_EVENT", 3)
    await producer.add_event("LIVE_EVENT", 4)
    got = await receiver.received()
    assert [(e["id"], e["type"]) for e in got] == [
        ("1", "JS"), ("2", "JS"), ("3", "LIVE_EVENT"), ("4", "LIVE_EVENT")
    ]  # fmt: skip
    # the refusal on a partitioned stream by name reaches the official client as an FTN3 error
    out = await run_js(js_peer, "calls.js", {
        "endpoint": "secure+" + server.url + "orders",
        "credentials": ALICE,
        "calls": [call("gen", "addEvent", "JS", 5), call("poll", "registerConsumer", "X")],
    })  # fmt: skip
    assert out[0] == {"ok": "1"}
    assert out[1]["error"] == "InvalidRequest"
    assert "/orders/0" in out[1]["desc"]


async def test_a_takeover_through_another_server_stops_only_that_partition(
    pg_url: str, password_hashes: dict[str, str]
) -> None:
    """Two servers on one PostgreSQL database: the claim goes out naming its partition."""
    config = ServerConfig(
        db=pg_url, transport=TransportConfig(port=0), retention=RetentionConfig(interval=3600)
    )
    async with await EventServer.start(config) as first:
        for name, password_hash in password_hashes.items():
            await add_user(first.store, name, password_hash)
        await first.access.changed_here()
        await first.store.add_stream("orders", PARTITIONS)
        await first.streams.refresh()
        async with await EventServer.start(config) as second:
            receivers = []
            for n in (0, 1):
                async with await EventStreamClient.connect(
                    first.url + f"orders/{n}", credentials=ALICE
                ) as client:
                    await client.register_consumer("SAME", iface=PUSH)
                receiver = ReliableReceiver(
                    first.url + f"orders/{n}", credentials=ALICE, component="SAME"
                )
                receivers.append((receiver, await running(receiver)))
            alice = await user_id(first, "alice")
            on_0, on_1 = partition(first, 0), partition(first, 1)
            assert first.push.connected_consumers(on_1) == [(alice, "SAME")]
            newer = ReliableReceiver(second.url + "orders/1", credentials=ALICE, component="SAME")
            newer_task = await running(newer)
            assert second.push.connected_consumers(on_1) == [(alice, "SAME")]
            # the claim travels by NOTIFY
            await until(lambda: not first.push.connected_consumers(on_1), "the older stream stops")
            assert first.push.connected_consumers(on_0) == [(alice, "SAME")]
            await stop(newer, newer_task)
            for receiver, task in receivers:
                await stop(receiver, task)


async def test_an_aggregate_refuses_add_event_and_serves_its_copies(
    server: EventServer, connect: Connect
) -> None:
    """Only the copying adds events to an aggregated stream; consumers read them there."""
    await server.store.add_stream("all", 1, aggregate_of="orders")
    await server.streams.refresh()
    producer = await connect("orders/2")
    await producer.add_event("ORDER", {"n": 1})
    client = await connect("all")
    with pytest.raises(RemoteError) as refused:
        await client.add_event("ORDER", {"n": 2})
    assert refused.value.name == "InvalidRequest"
    assert "the stream all is an aggregate of orders" in str(refused.value)
    assert await client.register_consumer("C")
    events: list[object] = []

    async def copied() -> bool:
        """The copying is woken by the source's head: soon."""
        events.extend(await client.poll_events("C"))
        return bool(events)

    await until(copied, "the event copied", 60)
    assert [(e.id, e.type, e.data) for e in events] == [(1, "ORDER", {"n": 1})]  # type: ignore[attr-defined]
