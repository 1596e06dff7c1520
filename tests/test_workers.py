"""``serve --workers 2``: two server processes on one port behave as one server. Real
processes, real sockets, SQLite and PostgreSQL. What one server promises (commit order,
takeover, notification, nothing acknowledged lost) is checked with one worker and with two."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from futoin_evt.client.aio import CommError, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.server.workers import channel_dir, remove_stale_channels
from futoin_evt.storage import is_postgres_url, open_store

from .support.amqp_wire import (
    DISPOSITION,
    FLOW,
    SASL_HEADER,
    SASL_OUTCOME,
    Peer,
    attach,
    message,
    sasl_init,
    transfer,
)
from .support.cli import run
from .support.dcb import DCB, assert_no_lost_update, race_on_one_tag
from .support.push import Collector, running, stop
from .support.servers import ALICE, USERS, ServerProcess, add_user
from .support.workers import WITHIN_SECONDS, Group, children, connect_to, on_worker, until

pytestmark = pytest.mark.functional

PUSH = "futoin.evt.push:1.1"
OPS = "futoinevt.ops:1.0"


@pytest.fixture
async def db(store_db: str, password_hashes: dict[str, str]) -> str:
    async with await open_store(store_db) as store:
        await add_user(store, "alice", password_hashes["alice"], is_admin=True)
    return store_db


@pytest.fixture
def groups() -> Iterator[list[Group]]:
    started: list[Group] = []
    yield started
    for group in started:
        if group.proc.poll() is None:
            group.kill_all()


@pytest.fixture
def group(db: str, groups: list[Group], serve_workers: int) -> Group:
    groups.append(Group(db, workers=serve_workers))
    return groups[-1]


async def not_(answer: Awaitable[bool]) -> bool:
    return not await answer


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def stored_ids(db: str) -> list[int]:
    async with await open_store(db) as store:
        rows = await store.read_rows(0, limit=1_000_000)
    return [row[0] for row in rows]


@pytest.mark.parametrize("serve_workers", [2])
@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_connections_land_on_every_worker(group: Group) -> None:
    assert group.line.startswith("futoin-evt ")
    assert " listening on ws://127.0.0.1:" in group.line
    assert len(group.workers()) == 2
    for _ in range(24):
        async with await EventStreamClient.connect(group.url, credentials=ALICE) as client:
            assert await client.ping(7) == 7
    await until(lambda: sum(group.connections().values()) == 24, "24 connections logged")
    assert sorted(group.connections()) == [0, 1]


#: ``--max-connections`` of the limit tests: small, so that both workers reach it.
LIMIT = 4
#: ``--max-handshakes`` beside it: room for every socket a test opens before it logs in.
ROOMY_HANDSHAKES = "256"
PING = '{"rid":"C1","f":"futoin.evt.gen:1.1:ping","p":{"echo":1},"sec":"' + ALICE + '"}'


async def served(client: FTN3Client) -> bool:
    """The client's first call: True when it is answered, False when it is refused (at the
    limit: ``DefenseRejected``, or the close with 1013 before it)."""
    try:
        await client.call("futoin.evt.gen:1.1", "ping", {"echo": 1})
    except (RemoteError, CommError):
        return False
    return True


async def amqp_logins(port: int, count: int) -> list[int]:
    """``count`` SASL PLAIN logins at once, kept open; their outcome codes (0 ok, 4 sys-temp)."""
    peers = [await Peer.connect(port) for _ in range(count)]
    for peer in peers:
        await peer.send(SASL_HEADER + sasl_init("PLAIN", b"\0alice\0" + USERS["alice"].encode()))
    return [(await peer.until(SASL_OUTCOME)).fields[0] for peer in peers]


@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_max_connections_holds_for_the_server(db: str, groups: list[Group]) -> None:
    """``--max-connections`` with two workers is the server's: of many logins at once, the
    limit is served (one more when the workers race for the last slot); past it, a login on
    either worker is refused, a feed request too, and an AMQP login the same way; slots freed
    on either worker serve new logins."""
    group = Group(db, "--max-connections", str(LIMIT), "--max-handshakes", ROOMY_HANDSHAKES,
                  "--amqp", "127.0.0.1:0")  # fmt: skip
    groups.append(group)
    clients = [await FTN3Client.connect(group.url, credentials=ALICE) for _ in range(3 * LIMIT)]
    answered = await asyncio.gather(*(served(client) for client in clients))
    assert LIMIT <= sum(answered) <= LIMIT + 1, answered
    kept = [client for client, ok in zip(clients, answered, strict=True) if ok]
    for client in clients:
        if client not in kept:
            await client.close()

    refused_on: set[int] = set()
    for _ in range(200):  # until each worker refused one
        client = await FTN3Client.connect(group.url, credentials=ALICE)
        worker = await group.worker_of(client)
        assert not await served(client), f"a login served past the limit on worker {worker}"
        await client.close()
        refused_on.add(worker)
        if len(refused_on) == 2:
            break
    assert refused_on == {0, 1}
    feed = group.url.replace("ws", "http", 1) + "feed"
    for _ in range(8):  # each on a new connection, whichever worker takes it
        async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
            assert (await http.get(feed)).status_code == 503

    assert group.amqp_url is not None
    outcomes = await amqp_logins(int(group.amqp_url.rsplit(":", 1)[1]), 3 * LIMIT)
    assert LIMIT <= outcomes.count(0) <= LIMIT + 1, outcomes
    assert set(outcomes) == {0, 4}
    await Peer.close_all()

    for client in kept:
        await client.close()
    renewed: list[FTN3Client] = []

    async def one_more_served() -> bool:
        """A closed socket's slot comes back once its worker saw it."""
        client = await FTN3Client.connect(group.url, credentials=ALICE)
        if await served(client):
            renewed.append(client)
            return len(renewed) == LIMIT
        await client.close()
        return False

    await until(one_more_served, f"{LIMIT} slots back", interval=0.05)
    one_more = await FTN3Client.connect(group.url, credentials=ALICE)
    assert not await served(one_more)
    for client in [*renewed, one_more]:
        await client.close()


@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_max_handshakes_holds_for_the_server(db: str, groups: list[Group]) -> None:
    """``--max-handshakes 2`` with two workers: one socket in its handshake per worker (here
    WebSockets that have made no call yet). Each newcomer closes the one before it on its
    worker, and the newest of each worker logs in and is served."""
    group = Group(db, "--max-handshakes", "2")
    groups.append(group)
    opened: dict[int, list[ClientConnection]] = {0: [], 1: []}
    for _ in range(200):  # until each worker took two
        ws = await connect(group.url)
        opened[await group.worker_at(ws.local_address[1])].append(ws)
        if min(map(len, opened.values())) >= 2:
            break
    async with asyncio.timeout(WITHIN_SECONDS):
        for ws in (ws for sockets in opened.values() for ws in sockets[:-1]):
            await ws.wait_closed()  # cut by the server
    for sockets in opened.values():
        await sockets[-1].send(PING)
        async with asyncio.timeout(WITHIN_SECONDS):
            assert json.loads(await sockets[-1].recv()) == {"r": {"echo": 1}, "rid": "C1"}
        await sockets[-1].close()


async def test_ids_in_commit_order_and_every_consumer_sees_each_once(group: Group) -> None:
    """Eight producers and four push consumers spread over both workers: ids are unique, and
    each consumer gets every acknowledged id once, in increasing order."""
    collectors = [Collector() for _ in range(4)]
    receivers = [
        ReliableReceiver(group.url, credentials=ALICE, component=f"C{i}", on_events=collector)
        for i, collector in enumerate(collectors)
    ]
    tasks = [await running(receiver) for receiver in receivers]

    async def produce(index: int) -> list[int]:
        async with await EventStreamClient.connect(group.url, credentials=ALICE) as client:
            ids: list[int] = []
            for start in range(0, 400, 16):
                batch = [client.add_event("E", {"p": index, "i": start + i}) for i in range(16)]
                ids += await asyncio.gather(*batch)
            return ids

    acked = [i for ids in await asyncio.gather(*(produce(p) for p in range(8))) for i in ids]
    assert len(set(acked)) == len(acked) == 3200
    for collector in collectors:
        await collector.wait_for(max(acked))
    for receiver, task in zip(receivers, tasks, strict=True):
        await stop(receiver, task)
    for collector in collectors:
        assert collector.ids == sorted(set(acked))
    if group.count == 2:
        assert sorted(group.connections()) == [0, 1]


async def test_conditional_appends_on_one_tag_over_the_workers_lose_no_update(
    group: Group,
) -> None:
    """32 clients over the workers append to one tag on the condition that nothing with it
    came after the newest they read: at each position read, exactly one of them wins."""
    wins = await race_on_one_tag([group.url], ALICE, "seat:s1")
    assert_no_lost_update(wins, 32 * 3)
    async with await EventStreamClient.connect(group.url, credentials=ALICE) as client:
        read = await client.ftn3.call(DCB, "read", {"query": {"items": [{"tags": ["seat:s1"]}]}})
    assert [e["position"] for e in read["events"]] == sorted(p for _, p in wins)
    if group.count == 2:
        assert sorted(group.connections()) == [0, 1]


async def test_push_takeover_across_workers(group: Group) -> None:
    async with await EventStreamClient.connect(group.url, credentials=ALICE) as producer:
        await producer.register_consumer("ONE")
        first_seen: list[int] = []
        second_seen: list[int] = []

        async def receive(seen: list[int], params: dict[str, Any]) -> bool:
            seen.extend(int(event["id"]) for event in params["events"])
            return True

        first = await connect_to(group, 0)
        first.on_request("futoin.evt.receiver", "onEvents", lambda p: receive(first_seen, p))
        await first.call(PUSH, "readyToReceive", {"component": "ONE"})
        one = await producer.add_event("E", {})
        await until(lambda: one in first_seen, "the first stream gets an event")
        second = await connect_to(group, 1)
        second.on_request("futoin.evt.receiver", "onEvents", lambda p: receive(second_seen, p))
        await second.call(PUSH, "readyToReceive", {"component": "ONE"})
        taken_at = len(first_seen)
        ids = [await producer.add_event("E", {}) for _ in range(20)]
        await until(lambda: ids[-1] in second_seen, "the second stream gets the new events")
        assert first_seen[taken_at:] == []  # the first stream stopped at the takeover
        await first.close()
        await second.close()


async def test_a_subscriber_hears_events_and_management_events_of_the_other_worker(
    group: Group,
) -> None:
    listener = await connect_to(group, 0)
    notifications = Notifications(listener)
    subscribed = await notifications.subscribe()
    writer = await connect_to(group, 1)
    added = await writer.call("futoin.evt.gen:1.1", "addEvent", {"type": "PAID", "data": {"n": 1}})
    await writer.call("futoin.evt.poll:1.1", "registerConsumer", {"component": "ELSEWHERE"})
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(WITHIN_SECONDS):
        while not any(m["properties"].get("component") == "ELSEWHERE" for m in seen):
            seen.append(await subscribed.get())
    paid = [m for m in seen if m["properties"]["eventType"] == "PAID"]
    assert [str(m["properties"]["id"]) for m in paid] == [str(added)]
    await listener.close()
    await writer.close()


async def test_subscribers_on_both_workers_each_get_their_matches_in_order(
    group: Group,
) -> None:
    """Each worker evaluates its own subscribers' selectors (a selector two subscribers
    share, on different workers, and others), for events added on either worker."""
    selectors = {
        "a": "eventType = 'A' AND n > 1",
        "b": "eventType = 'B'",
        "all": "n >= 0",
    }
    placed = [("a", 0), ("a", 1), ("b", 1), ("all", 0), ("all", 1)]
    clients = [await connect_to(group, slot) for _, slot in placed]
    subscribed = [
        await Notifications(client).subscribe(selectors[name])
        for client, (name, _) in zip(clients, placed, strict=True)
    ]
    writers = [await connect_to(group, 0), await connect_to(group, 1)]
    added: list[tuple[int, str, int]] = []
    for n in [*range(12), 100, 100]:
        event_type = "AB"[n % 2] if n < 100 else "AB"[len(added) % 2]
        params = {"type": event_type, "data": {"n": n}}
        added.append(
            (
                int(await writers[n % 2].call("futoin.evt.gen:1.1", "addEvent", params)),
                event_type,
                n,
            )
        )
    expected = {
        "a": [i for i, t, n in added if t == "A" and n > 1],
        "b": [i for i, t, _ in added if t == "B"],
        "all": [i for i, _, _ in added],
    }
    for queue, (name, slot) in zip(subscribed, placed, strict=True):
        got: list[int] = []
        async with asyncio.timeout(WITHIN_SECONDS):
            while len(got) < len(expected[name]):
                message = await queue.get()
                got.append(int(message["properties"]["id"]))
        assert got == expected[name], (name, slot)  # the last event is a match: none between
    for client in [*clients, *writers]:
        await client.close()


def worker_pid(group: Group, slot: int) -> int:
    """The process id of worker ``slot`` (from its command line)."""
    for pid in group.workers():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[argv.index(b"--worker") + 1].split(b"/", 1)[0] == str(slot).encode():
            return pid
    raise AssertionError(f"no worker {slot}")


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block: the news of what the others commit meanwhile (on the
    workers' channel, or PostgreSQL's notifications) waits for it, as for a busy worker."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


#: The descriptor of the delivery state ``accepted``.
ACCEPTED = 0x24
BASIC_ALICE = "Basic " + base64.b64encode(f"alice:{USERS['alice']}".encode()).decode()
#: A WebSocket handshake, sent after a feed request on the same connection to learn which
#: worker took it (the worker logs each WebSocket it opens, with the peer's port).
UPGRADE = (
    "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def feed_on(group: Group, slot: int, target: str) -> list[dict[str, Any]]:
    """The NDJSON lines of ``GET target`` as worker ``slot`` answers it: each try asks on a
    new connection, then makes a WebSocket of that connection, whose log line names the worker
    that answered (answers of the other worker are dropped)."""
    for _ in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", group.port)
        try:
            request = f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: {BASIC_ALICE}\r\n\r\n"
            writer.write(request.encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            chunks = await reader.readuntil(b"\r\n0\r\n\r\n")
            writer.write(UPGRADE.encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
            worker = await group.worker_at(writer.get_extra_info("sockname")[1])
        finally:
            writer.close()
        if worker == slot:
            body = b""
            while (size := int(chunks[: chunks.index(b"\r\n")], 16)) > 0:
                start = chunks.index(b"\r\n") + 2
                body, chunks = body + chunks[start : start + size], chunks[start + size + 2 :]
            return [json.loads(line) for line in body.splitlines()]
    raise AssertionError(f"no feed request reached worker {slot}")


def event_ids(raw: list[dict[str, Any]]) -> list[int]:
    return [int(event["id"]) for event in raw]


@pytest.mark.parametrize("serve_workers", [2])
async def test_what_one_worker_acknowledged_is_read_on_the_other_at_once(group: Group) -> None:
    """Events worker 0 acknowledged while worker 1 was paused (so worker 1 hears of them
    late) are in every read worker 1 starts after that: a LIVE poll from the start, a FeedAPI
    v2 read and readEvents, each on a new connection. Worker 1 had added the first event
    itself, so its recent events cover where the reads start."""
    here = EventStreamClient(await connect_to(group, 1))
    first = await here.add_event("E", {"n": 0})
    await here.register_consumer("BULK")
    await here.close()
    there = EventStreamClient(await connect_to(group, 0))
    with paused(worker_pid(group, 1)):
        acked = [await there.add_event("E", {"n": n}) for n in range(1, 4)]
    await there.close()
    expected = [first, *acked]

    reader = EventStreamClient(await connect_to(group, 1))
    assert [event.id for event in await reader.poll_events("LIVE")] == expected
    assert [event.id for event in await reader.poll_events("LIVE", first, ["E"])] == acked
    ranged = await reader.ftn3.call(OPS, "readEvents", {"component": "BULK", "after_id": "0"})
    assert event_ids(ranged) == expected
    await reader.close()
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
        discovery = await http.get(group.url.replace("ws", "http", 1) + "feed")
    token = discovery.json()["token"]
    lines = await feed_on(group, 1, f"/feed/events?token={token}&partition=0&cursor=_first")
    assert event_ids([line["data"] for line in lines if "data" in line]) == expected
    assert lines[-1] == {"cursor": str(acked[-1])}


async def test_an_event_settled_over_amqp_is_in_a_live_poll_on_the_other_worker(
    db: str, groups: list[Group]
) -> None:
    """An event sent over AMQP and settled on worker 0, while worker 1 was paused, is in the
    LIVE poll a new connection to worker 1 makes right after (it answered ``[]``: the poll
    started within worker 1's own recent events, and kept their end as the newest)."""
    group = Group(db, "--amqp", "127.0.0.1:0")
    groups.append(group)
    here = EventStreamClient(await connect_to(group, 1))
    before = [await here.add_event("E", {"n": n}) for n in range(2)]
    await here.close()
    sender = await on_worker(group, 0)
    await sender.send(attach("in", 0, "events", receiver=True))
    await sender.until(FLOW)
    with paused(worker_pid(group, 1)):
        await sender.send(transfer(0, 0, message({"n": 2})))
        settled = await sender.until(DISPOSITION)
    state: Any = settled.fields[4]
    assert (settled.fields[3], int(state.descriptor)) == (True, ACCEPTED)  # durable
    await sender.close()

    reader = EventStreamClient(await connect_to(group, 1))
    polled = await reader.poll_events("LIVE", before[0], ["EVENT"])
    assert [(event.type, event.data) for event in polled] == [("EVENT", {"n": 2})]
    await reader.close()


async def connected(client: FTN3Client, component: str) -> bool:
    consumers = await client.call(OPS, "listConsumers", {})
    return any(c["component"] == component and c["push_connected"] for c in consumers)


@pytest.mark.parametrize("serve_workers", [2])
async def test_the_push_stream_on_one_worker_is_listed_and_seeked_from_the_other(
    group: Group,
) -> None:
    """listConsumers shows a push stream connected whichever worker answers; a seek on the
    other worker ends the stream (its receiver starts again from the stored position)."""
    receiving = await connect_to(group, 0)
    asking = await connect_to(group, 1)
    await asking.call("futoin.evt.poll:1.1", "registerConsumer", {"component": "THERE"})
    received: list[int] = []

    async def receive(params: dict[str, Any]) -> bool:
        received.extend(int(event["id"]) for event in params["events"])
        return True

    receiving.on_request("futoin.evt.receiver", "onEvents", receive)
    await receiving.call(PUSH, "readyToReceive", {"component": "THERE"})
    added = await asking.call("futoin.evt.gen:1.1", "addEvent", {"type": "E", "data": {}})
    await until(lambda: int(added) in received, "the stream gets the event")
    # the news crosses the workers' channel
    await until(lambda: connected(asking, "THERE"), "connected on the other worker")
    seek = {"component": "THERE", "ts": "2000-01-01T00:00:00Z"}
    assert await asking.call(OPS, "seekConsumer", seek) is False
    async with asyncio.timeout(WITHIN_SECONDS):
        await receiving.wait_closed()
    await until(lambda: not_(connected(asking, "THERE")), "not connected on the other worker")
    await asking.close()


async def test_stream_info_is_the_servers_on_every_worker(db: str, groups: list[Group]) -> None:
    """Worker 0 discards and expires; streamInfo answered by worker 1 names the same
    discarded count and expired consumers."""
    async with await open_store(db) as store:
        await store.add_stream("orders", 2)
    group = Group(
        db, "--keep-events", "1", "--expire-consumers-after", "1", "--discard-interval", "0.1"
    )
    groups.append(group)
    async with await EventStreamClient.connect(group.url + "orders/1", credentials=ALICE) as one:
        await one.register_consumer("DEAD")  # never seen again: expires, then 2 of 3 go
        for n in range(3):
            await one.add_event("E", {"n": n})
    orders1 = {"stream": "orders", "partition": 1}
    on0 = await connect_to(group, 0)
    on1 = await connect_to(group, 1)

    async def done_on_worker_0() -> bool:
        info = await on0.call(OPS, "streamInfo", orders1)
        return bool(info["expired_consumers"]) and info["discarded_total"] == 2

    await until(done_on_worker_0, "worker 0 expired DEAD and discarded 2 events")
    for client in (on0, on1):
        info = await client.call(OPS, "streamInfo", orders1)
        assert info["expired_consumers"] == [{"user": "alice", "component": "DEAD"}]
        assert (info["discarded_total"], info["first_id"]) == (2, "3")
        default = await client.call(OPS, "streamInfo", {})
        assert (default["expired_consumers"], default["discarded_total"]) == ([], 0)
    for client in (on0, on1):
        await client.close()


async def _accept(params: dict[str, Any]) -> bool:
    return True


@pytest.mark.parametrize("serve_workers", [2])
@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_after_a_worker_restarts_its_push_streams_are_listed_as_they_are(
    group: Group,
) -> None:
    staying = await connect_to(group, 0)
    dying = await connect_to(group, 1)
    for client, component in ((staying, "ON0"), (dying, "ON1")):
        await client.call("futoin.evt.poll:1.1", "registerConsumer", {"component": component})
        client.on_request("futoin.evt.receiver", "onEvents", _accept)
        await client.call(PUSH, "readyToReceive", {"component": component})
    await until(lambda: connected(staying, "ON1"), "worker 1's stream listed on 0")
    before = group.workers()
    os.kill(before[1], signal.SIGKILL)
    await until(lambda: len(group.workers()) == 2 and group.workers() != before, "a restart")
    await until(lambda: not_(connected(staying, "ON1")), "the killed one's stream gone")
    asking = await connect_to(group, 1)  # the new worker 1
    await until(lambda: connected(asking, "ON0"), "worker 0's stream listed on the new 1")
    assert not await connected(asking, "ON1")
    for client in (staying, dying, asking):
        await client.close()


async def _load(group: Group, acked: list[int], stop_load: asyncio.Event) -> None:
    """Add events on four connections until told to stop, reconnecting when one is lost;
    the ids the server acknowledged go to ``acked``."""

    async def producer(index: int) -> None:
        while not stop_load.is_set():
            try:
                async with await EventStreamClient.connect(group.url, credentials=ALICE) as c:
                    while not stop_load.is_set():
                        batch = [c.add_event("E", {"p": index}) for _ in range(8)]
                        acked.extend(await asyncio.gather(*batch))
            except (CommError, RemoteError, OSError):
                continue  # the worker died: connect again (to the one alive, or its successor)

    await asyncio.gather(*(producer(i) for i in range(4)))


@pytest.mark.parametrize("serve_workers", [2])
async def test_a_killed_worker_loses_nothing_acknowledged_and_is_restarted(group: Group) -> None:
    acked: list[int] = []
    stop_load = asyncio.Event()
    load = asyncio.create_task(_load(group, acked, stop_load))
    await until(lambda: len(acked) > 500, "load before the kill")
    before = group.workers()
    os.kill(before[1], signal.SIGKILL)
    await until(lambda: len(group.workers()) == 2 and group.workers() != before, "a restart")
    count = len(acked)
    await until(lambda: len(acked) > count + 500, "load after the restart")
    assert "exited with status -9; starting it again" in group.logged()
    stop_load.set()
    await load
    assert set(acked) <= set(await stored_ids(str(group.db)))


async def test_sigkill_of_the_whole_group_loses_nothing_acknowledged(
    group: Group, groups: list[Group]
) -> None:
    acked: list[int] = []
    stop_load = asyncio.Event()
    load = asyncio.create_task(_load(group, acked, stop_load))
    await until(lambda: len(acked) > 500, "load before the kill")
    channel = group.channel()
    group.kill_all()
    stop_load.set()
    await load
    assert set(acked) <= set(await stored_ids(str(group.db)))
    groups.append(Group(str(group.db), workers=group.count))
    async with await EventStreamClient.connect(groups[-1].url, credentials=ALICE) as client:
        assert await client.add_event("E", {}) > max(acked)
    if channel is not None:  # left by the killed group, removed by the next one
        assert not channel.exists()
        assert groups[-1].channel() not in (None, channel)


@pytest.mark.parametrize("serve_workers", [2])
@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
def test_the_next_start_removes_the_directory_of_a_group_killed_whole(
    group: Group, groups: list[Group], tmp_path: Path
) -> None:
    """SIGKILL to a whole group (supervisor and workers) leaves its channel directory behind;
    the next group to start removes it, and leaves that of a group still running alone."""
    groups.append(Group(str(tmp_path / "other.sqlite"), workers=2))
    running = groups[-1].channel()
    killed = group.channel()
    assert running is not None
    assert killed is not None
    group.kill_all()
    assert killed.exists()  # nobody was left to tidy up
    groups.append(Group(str(group.db), workers=2))
    assert not killed.exists()
    assert running.exists()
    assert groups[-1].channel() not in (None, killed, running)


@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_sigterm_stops_every_worker_gracefully(group: Group) -> None:
    acked: list[int] = []
    stop_load = asyncio.Event()
    load = asyncio.create_task(_load(group, acked, stop_load))
    await until(lambda: len(acked) > 300, "load")
    workers = group.workers()
    status, logged = await asyncio.to_thread(group.stop_and_read_log, 90)
    assert status == 0
    stop_load.set()
    await load
    assert not [pid for pid in workers if _alive(pid)]
    assert set(acked) <= set(await stored_ids(str(group.db)))
    assert ("shutting down 2 workers" if group.count == 2 else "shutting down") in logged


@pytest.mark.parametrize(
    ("option", "env", "message"),
    [
        (["--workers", "0"], "1", "--workers must be at least 1."),
        ([], "many", "$FUTOIN_EVT_WORKERS must be a number of processes, not 'many'."),
    ],
)
def test_the_worker_count_is_checked(
    tmp_path: Path, option: list[str], env: str, message: str
) -> None:
    db = str(tmp_path / "x.sqlite")
    result = run("serve", "--port", "0", "--db", db, *option, env={"FUTOIN_EVT_WORKERS": env})
    assert (result.returncode, result.stderr) == (2, f"futoin-evt: {message}\n")


async def test_the_default_worker_count_is_what_the_backend_gains_from(
    db: str, store_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With neither ``--workers`` nor ``$FUTOIN_EVT_WORKERS``: one process on SQLite (a
    second writer is slower there), one worker per core on PostgreSQL."""
    monkeypatch.delenv("FUTOIN_EVT_WORKERS")
    server = ServerProcess(db)
    try:
        cores = os.cpu_count() or 1
        workers = cores if is_postgres_url(store_db) and cores > 1 else 0  # 0: no supervisor
        assert len(children(server.proc.pid)) == workers
        async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
            assert await client.ping(7) == 7
    finally:
        assert server.stop() == 0


def test_a_port_in_use_is_refused_once(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run("serve", "--port", port, "--db", str(tmp_path / "x.sqlite"), "--workers", "2")
    assert result.returncode == 2
    assert result.stderr.startswith(f"futoin-evt: cannot listen on 127.0.0.1:{port} (--port): ")


def test_a_channel_directory_is_removed_once_its_supervisor_is_gone(tmp_path: Path) -> None:
    alive, owner = channel_dir(tmp_path)
    stale, stale_owner = channel_dir(tmp_path)
    os.close(stale_owner)  # as when the supervisor was killed
    (stale / "w0.sock").touch()
    making = tmp_path / "futoin-evt-making"  # no lock file yet: being made
    making.mkdir()
    try:
        assert remove_stale_channels(tmp_path) == [stale]
        assert sorted(tmp_path.iterdir()) == sorted([alive, making])
    finally:
        os.close(owner)
