"""Discarding read events, retention policies, consumer expiry, seeking, and who sees what."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.notification import Notification
from futoin_evt.domain.partition import DEFAULT_PARTITION, Partition
from futoin_evt.domain.stream import UserId
from futoin_evt.log.retention import Discarder, RetentionConfig
from futoin_evt.server.app import EventServer

from .support.servers import ClientFactory, ServerFactory, ServerProcess
from .support.sql import execute_sql

pytestmark = pytest.mark.functional

OPS = "futoinevt.ops:1.0"


async def ops(client: EventStreamClient, func: str, **params: Any) -> Any:
    return await client.ftn3.call(OPS, func, params)


def set_ts(db: str | Path, up_to_id: int, ts: str) -> None:
    """Backdate events (as if they had been added at ``ts``, before events had checksums)."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE events SET ts = ?, checksum = NULL WHERE id <= ?", (ts, up_to_id))


async def policy(server: EventServer, **config: Any) -> Discarder:
    """The server's discarder, run by hand with another retention config."""
    return server.discarder.with_config(RetentionConfig(interval=3600, **config))


@pytest.fixture
async def admin(server: EventServer) -> EventStreamClient:
    await server.store.add_user("root", hash_password("root-pw"), is_admin=True)
    return await EventStreamClient.connect(server.url, credentials="root:root-pw")


async def test_discards_only_what_every_consumer_read(
    server: EventServer, alice: EventStreamClient, bob: EventStreamClient
) -> None:
    ids = [await alice.add_event("E", i) for i in range(100)]
    await alice.register_consumer("A")
    await bob.register_consumer("B")
    await alice.poll_events("A", last_id=ids[-1])
    await bob.poll_events("B", last_id=ids[39])
    assert await server.discarder.discard() == 40
    info = await ops(alice, "streamInfo")
    assert (info["first_id"], info["last_id"], info["events"]) == ("41", "100", 60)
    assert info["discarded_total"] == 40
    assert "held_back_by" not in info  # bob's consumer: not alice's to see
    assert (await ops(bob, "streamInfo"))["held_back_by"] == {"user": "bob", "component": "B"}
    # bob still reads everything he has not acknowledged
    assert [e.id for e in await bob.poll_events("B")] == ids[40:]
    await bob.poll_events("B", last_id=ids[-1])
    assert await server.discarder.discard() == 60
    assert await alice.add_event("E", "after") == 101  # ids are never reused


async def test_without_consumers_or_policy_nothing_is_discarded(
    server: EventServer, alice: EventStreamClient
) -> None:
    for i in range(20):
        await alice.add_event("E", i)
    assert await server.discarder.discard() == 0
    keep_five = await policy(server, keep_events=5)
    assert await keep_five.discard() == 15
    assert [e.id for e in await alice.poll_events("LIVE")] == [16, 17, 18, 19, 20]


async def test_time_policy_keeps_young_events_even_when_read(
    db_path: Path, server: EventServer, alice: EventStreamClient
) -> None:
    ids = [await alice.add_event("E", i) for i in range(10)]
    set_ts(server.db, ids[3], "2001-01-01T00:00:00Z")
    await alice.register_consumer("ALL_READ")
    await alice.poll_events("ALL_READ", last_id=ids[-1])
    keep_an_hour = await policy(server, keep_seconds=3600)
    assert await keep_an_hour.discard() == 4
    assert [e.id for e in await alice.poll_events("LIVE")] == ids[4:]


async def test_discarding_in_chunks_while_producers_run(
    server: EventServer, connect: ClientFactory
) -> None:
    producer = await connect("alice")
    await producer.register_consumer("FAST")
    first = [await producer.add_event("E", i) for i in range(3000)]
    await producer.poll_events("FAST", last_id=first[-1])
    small_chunks = await policy(server, chunk=100)

    async def produce() -> list[int]:
        ids: list[int] = []
        for start in range(0, 1000, 50):
            ids.extend(
                await asyncio.gather(
                    *(producer.add_event("N", i) for i in range(start, start + 50))
                )
            )
        return ids

    deleted, added = await asyncio.gather(small_chunks.discard(), produce())
    assert deleted == 3000
    assert sorted(added) == list(range(3001, 4001))
    assert [e.id for e in await producer.poll_events("FAST")][:3] == [3001, 3002, 3003]


async def test_consumer_information_and_who_sees_it(
    db_path: Path,
    server: EventServer,
    alice: EventStreamClient,
    bob: EventStreamClient,
    admin: EventStreamClient,
) -> None:
    ids = [await alice.add_event("E", i) for i in range(10)]
    await alice.register_consumer("MINE")
    await alice.poll_events("MINE", last_id=ids[3])
    await bob.register_consumer("HIS")
    set_ts(server.db, ids[4], "2001-01-01T00:00:00Z")
    (mine,) = await ops(alice, "listConsumers")
    assert (mine["user"], mine["component"], mine["position"], mine["behind"]) == (
        "alice", "MINE", str(ids[3]), 6,
    )  # fmt: skip
    assert mine["oldest_unread_age"] > 3600 * 24 * 365  # event 5 was backdated
    assert mine["push_connected"] is False
    assert [c["component"] for c in await ops(bob, "listConsumers")] == ["HIS"]
    assert [c["component"] for c in await ops(admin, "listConsumers")] == ["MINE", "HIS"]
    assert (await ops(admin, "streamInfo"))["held_back_by"] == {"user": "bob", "component": "HIS"}


async def test_dropping_consumers(
    server: EventServer, alice: EventStreamClient, bob: EventStreamClient, admin: EventStreamClient
) -> None:
    await alice.register_consumer("A1")
    await alice.register_consumer("A2")
    for caller, target in ((bob, "A1"), (alice, "NOPE")):
        with pytest.raises(RemoteError) as info:
            await ops(caller, "dropConsumer", user="alice", component=target)
        assert info.value.name == "UnknownConsumer"
    assert await ops(alice, "dropConsumer", user="alice", component="A1") is True
    assert await ops(admin, "dropConsumer", user="alice", component="A2") is True
    assert await ops(alice, "listConsumers") == []


async def test_wrong_credentials_never_reach_a_service(
    server: EventServer, alice: EventStreamClient
) -> None:
    await alice.register_consumer("KEEP")
    async with await FTN3Client.connect(server.url, credentials="alice:wrong") as intruder:
        with pytest.raises(RemoteError) as info:
            await intruder.call(OPS, "dropConsumer", {"user": "alice", "component": "KEEP"})
        assert info.value.name == "SecurityError"
    async with await FTN3Client.connect(server.url) as anonymous:
        with pytest.raises(RemoteError) as info:
            await anonymous.call(OPS, "listConsumers", {})
        assert info.value.name == "SecurityError"
    assert [c["component"] for c in await ops(alice, "listConsumers")] == ["KEEP"]


async def test_dead_consumers_expire_and_are_listed(
    db_path: Path, server: EventServer, alice: EventStreamClient
) -> None:
    await alice.register_consumer("DEAD")
    await alice.register_consumer("ALIVE")
    pushed = ReliableReceiver(server.url, credentials="alice:alice-pw", component="PUSHED")
    receiver_task = asyncio.create_task(pushed.run())
    await asyncio.wait_for(pushed.ready.wait(), 30)
    with sqlite3.connect(server.db) as conn:  # neither polled nor acknowledged since
        conn.execute(
            "UPDATE consumers SET last_seen_at = '2001-01-01T00:00:00Z'"
            " WHERE component IN ('DEAD', 'PUSHED')"
        )
    expiring = await policy(server, expire_consumers_after=60)
    await expiring.expire_consumers()
    # a connected push stream counts as seen
    assert [c["component"] for c in await ops(alice, "listConsumers")] == ["ALIVE", "PUSHED"]
    assert expiring.expired_in(DEFAULT_PARTITION) == [("alice", "DEAD")]
    pushed.stop()
    await asyncio.wait_for(receiver_task, 30)


async def test_start_from_a_point_in_time(
    db_path: Path, server: EventServer, alice: EventStreamClient
) -> None:
    ids = [await alice.add_event("E", i) for i in range(6)]
    set_ts(server.db, ids[1], "2020-01-01T00:00:00Z")
    with sqlite3.connect(server.db) as conn:
        conn.execute(
            "UPDATE events SET ts = '2021-06-01T00:00:00Z', checksum = NULL WHERE id IN (3, 4)"
        )
    await alice.register_consumer("REPLAY")
    await alice.poll_events("REPLAY", last_id=ids[-1])  # everything read already
    assert await ops(alice, "seekConsumer", component="REPLAY", ts="2021-01-01T00:00:00Z") == "2"
    assert [e.id for e in await alice.poll_events("REPLAY")] == ids[2:]
    assert await ops(alice, "seekConsumer", component="REPLAY", ts="2000-01-01T00:00:00Z") is False
    assert [e.id for e in await alice.poll_events("REPLAY")] == ids
    live_from = await ops(alice, "idBefore", ts="2021-06-01T00:00:00Z")
    assert [e.id for e in await alice.poll_events("LIVE", last_id=int(live_from))] == ids[2:]
    with pytest.raises(RemoteError) as info:
        await ops(alice, "seekConsumer", component="NOPE", ts="2021-01-01T00:00:00Z")
    assert info.value.name == "UnknownConsumer"


def test_info_command_shows_lag_on_a_running_server(tmp_path: Path) -> None:
    from .support.cli import run

    db = tmp_path / "info.sqlite"
    assert (
        run(
            "user", "add", "ops", "--password-stdin", "--admin", "--db", str(db), stdin="pw\n"
        ).returncode
        == 0
    )
    server = ServerProcess(db)
    try:
        env = {"FUTOIN_EVT_URL": server.url, "FUTOIN_EVT_USER": "ops", "FUTOIN_EVT_PASSWORD": "pw"}
        for i in range(5):
            assert run("add", "ORDER", str(i), env=env).returncode == 0
        with_lag = run("poll", "SLOW", env=env)  # registers and reads all 5 ...
        assert len(with_lag.stdout.splitlines()) == 5
        for i in range(3):
            assert run("add", "ORDER", str(i), env=env).returncode == 0  # ... then 3 more come
        table = run("info", env=env)
        assert table.returncode == 0, table.stderr
        (row,) = [line.split() for line in table.stdout.splitlines() if line.startswith("ops ")]
        assert row[:4] == ["ops", "SLOW", "5", "3"]
        data = json.loads(run("info", "--json", env=env).stdout)
        assert data["stream"]["last_id"] == "8"
        assert data["consumers"][0]["behind"] == 3
        listed = json.loads(run("consumer", "list", "--json", env=env).stdout)
        assert [c["component"] for c in listed] == ["SLOW"]
        assert run("consumer", "drop", "ops", "SLOW", env=env).returncode == 0
        gone = run("consumer", "drop", "ops", "SLOW", env=env)
        assert gone.returncode == 1
        assert "UnknownConsumer" in gone.stderr
    finally:
        assert server.stop() == 0


async def test_acknowledging_without_reading(
    server: EventServer, alice: EventStreamClient, bob: EventStreamClient
) -> None:
    ids = [await alice.add_event("E", i) for i in range(10)]
    await alice.register_consumer("BULK")
    # a bulk reader takes ranges with LIVE polls (no position moves) ...
    assert [e.id for e in await alice.poll_events("LIVE", last_id=ids[2])][:2] == ids[3:5]
    # ... and acknowledges once what it read is durable on its side
    assert await ops(alice, "acknowledge", component="BULK", last_id=str(ids[5])) == str(ids[5])
    assert await ops(alice, "acknowledge", component="BULK", last_id=str(ids[1])) == str(ids[5])
    assert [e.id for e in await alice.poll_events("BULK")] == ids[6:]
    with pytest.raises(RemoteError) as info:
        await ops(bob, "acknowledge", component="BULK", last_id=str(ids[9]))
    assert info.value.name == "UnknownConsumer"


# -- every partition of every stream -------------------------------------------------------------


@pytest.fixture
async def any_server(start_server: ServerFactory, store_db: str) -> EventServer:
    """A server on each backend, with the stream ``orders`` of 3 partitions besides ``events``."""
    server = await start_server(db=store_db)
    await server.store.add_stream("orders", 3)
    await server.streams.refresh()
    return server


async def fill(server: EventServer, count: int = 10) -> list[Partition]:
    """``count`` events in each partition; its partitions by key."""
    partitions = server.discarder.partitions()
    for partition in partitions:
        log = server.store.partition_log(partition)
        for i in range(count):
            await log.append("E", str(i))
    return partitions


async def kept(server: EventServer, partition: Partition) -> list[int]:
    rows = await server.store.partition_log(partition).read_rows(0, limit=1000)
    return [row[0] for row in rows]


async def user_id(server: EventServer, name: str) -> UserId:
    user = await server.store.get_user(name)
    assert user is not None
    return user.id


async def test_each_partition_keeps_what_its_own_consumers_have_not_read(
    any_server: EventServer,
) -> None:
    server = any_server
    events0, orders0, orders1, orders2 = await fill(server)
    alice = await user_id(server, "alice")
    for partition, component, read in (
        (events0, "ALL", 10), (orders0, "NONE", 0), (orders1, "A", 7), (orders1, "B", 4),
    ):  # fmt: skip
        log = server.store.partition_log(partition)
        await log.register_consumer(alice, component)
        await log.acknowledge(alice, component, read)
    heard: list[Notification] = []
    server.notices.listen(heard.append)
    assert await server.discarder.turn() == 10 + 4
    assert await kept(server, events0) == []
    assert await kept(server, orders0) == list(range(1, 11))
    assert await kept(server, orders1) == list(range(5, 11))
    assert await kept(server, orders2) == list(range(1, 11))  # no consumer, no policy
    assert sorted((n.stream, n.partition, n.data["count"]) for n in heard) == [
        ("events", 0, 10), ("orders", 1, 4),
    ]  # fmt: skip
    await server.store.partition_log(orders1).acknowledge(alice, "B", 10)
    assert await server.discarder.turn() == 3
    assert await kept(server, orders1) == [8, 9, 10]
    assert server.discarder.discarded_in(orders1) == 7
    assert server.discarder.discarded_in(orders0) == 0
    # ids are per partition and never reused
    assert await server.store.partition_log(orders1).append("E", "next") == 11
    assert await server.store.partition_log(events0).append("E", "next") == 11


async def test_a_policy_applies_to_each_partition_within_the_bounds_of_a_turn(
    any_server: EventServer,
) -> None:
    server = any_server
    partitions = await fill(server)
    keep_three = server.discarder.with_config(
        RetentionConfig(keep_events=3, chunk=2, partitions_per_turn=2, chunks_per_turn=6)
    )
    # a turn: two partitions, six chunks of two: the first partition loses 7 (4 chunks), the
    # second the 4 the budget leaves
    assert await keep_three.turn() == 7 + 4
    assert [len(await kept(server, p)) for p in partitions] == [3, 6, 10, 10]
    assert await keep_three.turn() == 7 + 4  # the next turn goes on with the others
    assert [len(await kept(server, p)) for p in partitions] == [3, 6, 3, 6]
    assert await keep_three.turn() == 3  # round again: whatever is left
    assert await keep_three.turn() == 3
    assert [await kept(server, p) for p in partitions] == [[8, 9, 10]] * 4


async def test_partitions_added_and_streams_dropped_are_followed(any_server: EventServer) -> None:
    server = any_server
    await fill(server)
    keep_one = server.discarder.with_config(RetentionConfig(keep_events=1))
    assert await keep_one.turn() == 4 * 9
    await server.store.grow_stream("orders", 4)
    await server.store.add_stream("later", 1)
    await server.streams.refresh()
    added = [p for p in server.discarder.partitions() if p.key > 3]
    assert [str(p) for p in added] == ["orders/3", "later/0"]
    for partition in added:
        for i in range(5):
            await server.store.partition_log(partition).append("E", str(i))
    assert await keep_one.turn() == 2 * 4
    assert keep_one.discarded_in(added[0]) == 4
    assert await server.store.drop_stream("orders")
    await server.streams.refresh()
    assert [str(p) for p in keep_one.partitions()] == ["events/0", "later/0"]
    assert await keep_one.turn() == 0
    assert {str(p) for p in keep_one.discarded} == {"events/0", "later/0"}


async def test_consumers_expire_per_partition(any_server: EventServer) -> None:
    server = any_server
    alice = await user_id(server, "alice")
    orders1 = server.discarder.partitions()[2]
    for partition in (DEFAULT_PARTITION, orders1):
        for component in ("DEAD", "ALIVE"):
            await server.store.partition_log(partition).register_consumer(alice, component)
    execute_sql(
        str(server.db),
        "UPDATE consumers SET last_seen_at = '2001-01-01T00:00:00Z'"
        " WHERE component = 'DEAD' AND partition_key = ?",
        (orders1.key,),
    )
    heard: list[Notification] = []
    server.notices.listen(heard.append)
    expiring = server.discarder.with_config(RetentionConfig(expire_consumers_after=60))
    await expiring.turn()
    assert expiring.expired_in(orders1) == [("alice", "DEAD")]
    assert expiring.expired_in(DEFAULT_PARTITION) == []
    assert [c.component for c in await server.store.partition_log(orders1).consumers()] == ["ALIVE"]
    assert len(await server.store.consumers()) == 2
    assert [(n.type, n.stream, n.partition) for n in heard] == [
        ("org.futoin.evt.consumerExpired", "orders", 1)
    ]


async def test_two_processes_never_delete_what_a_consumer_has_not_read(
    start_server: ServerFactory, store_db: str
) -> None:
    """Two servers on one database discard one partition at once: every event goes once, and
    a deletion bounded by a position read before the consumer moved back keeps the events
    the consumer now wants."""
    first = await start_server(db=store_db)
    await first.store.add_stream("orders", 2)
    second = await start_server(db=store_db)
    await first.streams.refresh()
    partition = first.discarder.partitions()[-1]
    log = first.store.partition_log(partition)
    for start in range(0, 1000, 100):
        await asyncio.gather(*(log.append("E", str(i)) for i in range(start, start + 100)))
    alice = await user_id(first, "alice")
    await log.register_consumer(alice, "C")
    await log.acknowledge(alice, "C", 900)
    small_chunks = RetentionConfig(chunk=10, duty=0.9)
    one, other = (
        first.discarder.with_config(small_chunks),
        second.discarder.with_config(small_chunks),
    )
    counts = await asyncio.gather(one.discard(partition), other.discard(partition))
    assert sum(counts) == 900
    assert await kept(first, partition) == list(range(901, 1001))
    # a bound read before the consumer was set back (a seek) deletes only up to where it is
    await log.set_position(alice, "C", 950)
    stale = await second.discarder.bound(partition)
    await log.set_position(alice, "C", 920)
    assert await second.store.partition_log(partition).delete_events(stale, 1000) == 20
    assert await kept(first, partition) == list(range(921, 1001))
