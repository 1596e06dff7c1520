"""Aggregated streams (FTN18 2.3.3) on SQLite and PostgreSQL: every event of every partition of
the source once, with new ids, each partition's order kept; partitions grown later followed;
one serving process copying, another taking over after a SIGKILL in the middle of a copy;
retention held back by what is not copied; bad input to the command."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.dcb import NewEvent
from futoin_evt.domain.partition import Partition, StreamInfo
from futoin_evt.log.aggregate import AggregateConfig
from futoin_evt.log.retention import RetentionConfig, discard_bound
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION, EventRow, Store
from futoin_evt.storage.errors import NotWritable

from .support import waiting
from .support.cli import on_server, run
from .support.servers import ServerProcess, Serving
from .support.sql import execute_sql, pg_schema_at

pytestmark = pytest.mark.functional

DATA = Path(__file__).parent / "data"
#: Seconds a condition is waited for (the copying itself takes far less).
DEADLINE = 60.0

#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=DEADLINE)


async def fill(store: Store, info: StreamInfo, per_partition: int, tag: str) -> None:
    """``per_partition`` events in each partition, numbered in it, all in flight at once."""
    await asyncio.gather(
        *(
            store.partition_log(p).append("T", json.dumps({"p": p.number, "n": n, "tag": tag}))
            for n in range(per_partition)
            for p in info.partitions
        )
    )


def check_aggregate(
    rows: list[EventRow],
    sources: dict[int, list[EventRow]],
) -> None:
    """Every source event once, in increasing ids, each source partition's events in their
    order, with type, data, time, content type and attributes as they were stored (every
    event here differs). Ids may have gaps: on PostgreSQL a copy rolled back by a kill used
    some."""
    ids = [r[0] for r in rows]
    assert ids == sorted(set(ids))
    copied = [r[1:] for r in rows]
    owner = {r[1:]: number for number, events in sources.items() for r in events}
    assert len(owner) == sum(len(events) for events in sources.values())
    assert len(copied) == len(owner)
    assert set(copied) == owner.keys()
    for number, events in sources.items():
        assert [r for r in copied if owner[r] == number] == [r[1:] for r in events]


async def source_rows(store: Store, info: StreamInfo) -> dict[int, list[EventRow]]:
    return {
        p.number: await store.partition_log(p).read_rows(0, limit=10**9) for p in info.partitions
    }


def stream(db: str, *args: str) -> str:
    result = run("stream", *args, "--db", db)
    assert result.returncode == 0, result.stderr
    return result.stdout


def serving(db: str, aggregate: AggregateConfig) -> ServerConfig:
    return ServerConfig(
        db=db,
        transport=TransportConfig(port=0),
        retention=RetentionConfig(interval=3600),
        streams_poll_seconds=0.1,
        aggregate=aggregate,
    )


async def test_an_aggregate_holds_every_event_of_every_partition_once_in_order(
    store_db: str,
) -> None:
    async with await EventServer.start(serving(store_db, AggregateConfig(batch=50))) as server:
        store = server.store
        source = await store.add_stream("orders", 4)
        await fill(store, source, 30, "before")
        # one with a content type (an AMQP data section) keeps it, one with attributes them
        await store.partition_log(source.partitions[2]).submit_append("AMQP", '"x"', "text/plain")
        await store.partition_log(source.partitions[1]).submit_append(
            "KEYED", "1", None, None, '{"k":"order-7"}'
        )
        info = await store.add_stream("all", 1, aggregate_of="orders")
        aggregate = store.partition_log(info.partitions[0])
        async with asyncio.timeout(DEADLINE):
            await aggregate.head.wait_beyond(4 * 30 + 2 - 1)
        await fill(store, source, 20, "after")
        async with asyncio.timeout(DEADLINE):
            await aggregate.head.wait_beyond(4 * 50 + 2 - 1)
        # a partition the source grows later is followed
        source = await store.grow_stream("orders", 5)
        await store.partition_log(source.partitions[4]).append("T", '{"p":4}')
        async with asyncio.timeout(DEADLINE):
            await aggregate.head.wait_beyond(4 * 50 + 2)
        rows = await aggregate.read_rows(0, limit=10**9)
        check_aggregate(rows, await source_rows(store, source))
        assert ("AMQP", '"x"', "text/plain") in [(r[1], r[2], r[4]) for r in rows]
        assert ("KEYED", "1", '{"k":"order-7"}') in [(r[1], r[2], r[5]) for r in rows]
        assert server.aggregator is not None
        assert server.aggregator.copying == [info.partitions[0]]
        positions = await store.aggregate_sources(info.partitions[0])
        assert [pos for _, pos in positions] == [50, 51, 51, 50, 1]


async def test_clients_cannot_add_to_an_aggregate(store_db: str) -> None:
    async with await open_store(store_db) as store:
        info = await store.add_stream("all", 1, aggregate_of="events")
        log = store.partition_log(info.partitions[0])
        with pytest.raises(NotWritable, match="the stream all is an aggregate of events"):
            log.submit_append("T", "1")
        with pytest.raises(NotWritable):
            await log.dcb_append([NewEvent("T", "1")], None)
    async with await open_store(store_db) as store:  # another process learns it from the registry
        known = await store.stream("all")
        assert known is not None
        with pytest.raises(NotWritable):
            store.partition_log(known.partitions[0]).submit_append("T", "1")
        assert await store.partition_log(known.partitions[0]).newest_event_id() == 0


async def test_retention_keeps_what_an_aggregate_has_not_copied(store_db: str) -> None:
    async with await open_store(store_db) as store:
        source = await store.add_stream("orders", 2)
        await fill(store, source, 10, "x")
        info = await store.add_stream("all", 1, aggregate_of="orders")
        log = store.partition_log(source.partitions[0])
        user = await store.add_user("alice", "h")
        await log.register_consumer(user, "C")
        await log.acknowledge(user, "C", 10)
        config = RetentionConfig(keep_events=0)
        assert discard_bound(await log.discard_limits(None), config) == 0
        if store_db.startswith("postgresql"):  # where the store checks the bound itself too
            assert await log.delete_events(10, 100) == 0
        assert await store.copy_into_aggregate(info.partitions[0], "me", 30, 15) is not None
        limits = await log.discard_limits(None)
        assert (limits.lowest_position, limits.copied_up_to) == (10, 10)
        assert discard_bound(limits, config) == 10
        other = store.partition_log(source.partitions[1])
        assert discard_bound(await other.discard_limits(None), config) == 5
        await store.drop_stream("all")
        assert (await other.discard_limits(None)).copied_up_to is None


async def test_one_process_holds_the_lease_until_it_expires_or_is_given_up(store_db: str) -> None:
    async with await open_store(store_db) as store:
        await fill(store, await store.add_stream("orders", 2), 5, "x")
        aggregate = (await store.add_stream("all", 1, aggregate_of="orders")).partitions[0]
        first = await store.copy_into_aggregate(aggregate, "one", 30, 4)
        assert first is not None
        assert (first.copied, first.head) == (4, 4)
        assert await store.copy_into_aggregate(aggregate, "two", 30, 100) is None
        await store.release_aggregate(aggregate, "one")
        second = await store.copy_into_aggregate(aggregate, "two", 0.2, 100)
        assert second is not None
        assert (second.copied, second.head) == (6, 10)
        assert await store.copy_into_aggregate(aggregate, "one", 30, 100) is None
        await until(lambda: _taken(store, aggregate, "one"), "the lease of two expires", seconds=10)


async def _taken(store: Store, aggregate: Partition, holder: str) -> bool:
    return await store.copy_into_aggregate(aggregate, holder, 30, 100) is not None


def aggregate_count(db: str, name: str) -> int:
    """Events in the partition of an aggregate, read outside any store."""
    ((key,),) = execute_sql(db, "SELECT key FROM partitions WHERE stream = ?", (name,))
    ((count,),) = execute_sql(db, f"SELECT COUNT(*) FROM events_{int(key)}")
    return int(count)


def lease_holder(db: str) -> str | None:
    rows = execute_sql(db, "SELECT holder FROM aggregate_leases")
    return str(rows[0][0]) if rows else None


def copied_here(server: Serving) -> bool:
    """The process has logged that it copies (read up to now)."""
    lines = []
    while not server.lines.empty():
        lines.append(server.lines.get_nowait())
    return any("copying into the aggregate" in line for line in lines)


def kill(server: Serving) -> None:
    """SIGKILL to the server and its workers at once."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    for reader, pipe in zip(server.readers, server.pipes, strict=True):
        reader.join(timeout=30)
        assert pipe is not None
        pipe.close()


#: Events per source partition in the copy that is killed: enough that a copy in batches
#: of 2000 takes many transactions.
MANY = 20_000


async def test_serving_processes_copy_once_and_take_over_after_a_sigkill_mid_copy(
    store_db: str,
) -> None:
    """Two ``futoin-evt serve`` processes: one copies (holds the lease), the other does not;
    the one copying is killed when the aggregate has some but not all of a large source;
    the other takes over, and every source event is there exactly once in the end."""
    async with await open_store(store_db) as store:
        source = await store.add_stream("orders", 4)
        for start in range(0, MANY, 5000):
            await fill(store, source, 5000, str(start))
    total = 4 * MANY
    lease = ("--aggregate-lease", "2")
    servers = [Serving(store_db, *lease), Serving(store_db, *lease)]
    try:
        assert stream(store_db, "add", "all", "--aggregate", "orders")
        counts: list[int] = []

        def copying_began() -> bool:
            counts.append(aggregate_count(store_db, "all"))
            return counts[-1] > 0

        # as often as it can be read: the kill must come while the copy goes on
        waiting.until_blocking(copying_began, "something copied", DEADLINE, interval=0)
        copied = counts[-1]
        holder = lease_holder(store_db)
        copying = next(s for s in servers if s.holds(holder))
        kill(copying)
        killed_at = aggregate_count(store_db, "all")
        assert copied <= killed_at < total, "the kill came after the copy had ended"
        other = next(s for s in servers if s is not copying)
        assert not copied_here(other), "both processes copied"

        async def all_copied() -> bool:
            return aggregate_count(store_db, "all") == total

        await until(all_copied, "the other process takes over and copies the rest")
        other.wait_for_line(re.compile(r"copying into the aggregate all"), 5)
        assert other.holds(lease_holder(store_db))
        async with await open_store(store_db) as store:
            info = await store.stream("orders")
            aggregate = await store.stream("all")
            assert info is not None
            assert aggregate is not None
            rows = await store.partition_log(aggregate.partitions[0]).read_rows(0, limit=10**9)
            check_aggregate(rows, await source_rows(store, info))
            # and the copying goes on with new events
            await store.partition_log(info.partitions[1]).append("T", '{"late":1}')

        async def late_copied() -> bool:
            return aggregate_count(store_db, "all") == total + 1

        await until(late_copied, "a new event is copied")
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()


async def test_a_graceful_stop_hands_the_copying_over(store_db: str) -> None:
    """Of two serving processes only one copies; when it stops, the other goes on."""
    async with await open_store(store_db) as store:
        source = await store.add_stream("orders", 2)
        await store.add_stream("all", 1, aggregate_of="orders")
    lease = ("--aggregate-lease", "2")
    servers = [Serving(store_db, *lease), Serving(store_db, *lease)]
    try:
        holder = None

        async def held() -> bool:
            nonlocal holder
            holder = lease_holder(store_db)
            return holder is not None

        await until(held, "one process takes the lease")
        copying = next(s for s in servers if s.holds(holder))
        other = next(s for s in servers if s is not copying)
        assert not copied_here(other), "both processes copied"
        copying.stop()
        async with await open_store(store_db) as store:
            await fill(store, source, 3, "x")

        async def copied() -> bool:
            return aggregate_count(store_db, "all") == 6

        await until(copied, "the other process copies")
        assert other.holds(lease_holder(store_db))
        other.wait_for_line(re.compile(r"copying into the aggregate all"), 5)
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()


BAD_INPUT = [
    (["add", "all", "--aggregate", "nope"], "no stream nope to aggregate"),
    (["add", "all", "--aggregate", "orders", "--partitions", "2"], "one partition, not 2"),
    (["add", "self", "--aggregate", "self"], "cannot aggregate itself"),
    (["add", "kept", "--aggregate", "orders"], "the stream kept exists already"),
    (["add", "Bad", "--aggregate", "orders"], "invalid stream name"),
    (["add", "plain"], "--partitions P"),
    (["grow", "kept", "--partitions", "2"], "the stream kept aggregates orders"),
    (["drop", "orders", "--yes"], "the stream kept aggregates orders: drop kept first"),
]


def test_bad_input_to_the_command_exits_2_with_one_line(store_db: str) -> None:
    stream(store_db, "add", "orders", "--partitions", "3")
    assert stream(store_db, "add", "kept", "--aggregate", "orders") == (
        "added stream kept aggregating orders\n"
    )
    before = stream(store_db, "list", "--json")
    version = execute_sql(store_db, "SELECT value FROM meta WHERE key = 'streams_version'")
    for args, says in BAD_INPUT:
        result = run("stream", *args, "--db", store_db)
        assert result.returncode == 2, args
        assert says in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, args
        assert result.stdout == "", args
    assert stream(store_db, "list", "--json") == before
    assert execute_sql(store_db, "SELECT value FROM meta WHERE key = 'streams_version'") == version
    assert [s["name"] for s in json.loads(before)] == ["events", "kept", "orders"]
    copied = execute_sql(store_db, "SELECT position FROM aggregate_sources ORDER BY source_key")
    assert copied == [(0,), (0,), (0,)]  # no server runs: nothing is copied
    # dropping the aggregate first lets the source go
    stream(store_db, "drop", "kept", "--yes")
    stream(store_db, "drop", "orders", "--yes")
    assert execute_sql(store_db, "SELECT COUNT(*) FROM aggregate_sources") == [(0,)]


async def test_an_admin_adds_an_aggregate_to_a_running_server(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    """``stream add --aggregate`` over ``--url``: the server starts copying into it at once,
    and refuses what the database refuses, with the same lines."""
    server, root = admin_server
    on_server(server, root, "add", "orders", "--partitions", "3")
    assert on_server(server, root, "add", "kept", "--aggregate", "orders") == (
        "added stream kept aggregating orders\n"
    )
    with BlockingClient(server.url + "orders/2", credentials="root:pw") as producer:
        producer.add_event("ORDER", {"n": 1})

    async def copied() -> bool:
        info = json.loads(on_server(server, root, "info", "kept", "--json"))
        return bool(info["partitions"][0]["head"] == 1)

    await until(copied, "the server copies into the aggregate")
    before = on_server(server, root, "list", "--json")
    assert [(s["name"], s.get("aggregate_of")) for s in json.loads(before)] == [
        ("events", None), ("kept", "orders"), ("orders", None),
    ]  # fmt: skip
    for args, says in BAD_INPUT:
        result = run("stream", *args, "--url", server.url, env=root)
        assert result.returncode == 2, args
        assert says in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, args
        assert result.stdout == "", args
    assert on_server(server, root, "list", "--json") == before


def test_a_user_adds_an_aggregate_with_manage_on_its_name_and_read_on_its_source(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    """carol, no admin, may manage ``orders-all`` and read ``orders*``: she adds an aggregate
    of ``orders`` over ``--url``; of ``payroll`` (no right) or of a stream that does not exist
    and she holds no right on, she is refused alike (names cannot be probed); without manage
    on the new name she is refused too, and nothing is added."""
    server, root = admin_server
    carol = {"FUTOIN_EVT_USER": "carol", "FUTOIN_EVT_PASSWORD": "pw"}
    on_server(server, root, "add", "orders", "--partitions", "2")
    on_server(server, root, "add", "payroll", "--partitions", "1")
    for rights, pattern in (("manage", "orders-all"), ("read", "orders*")):
        granted = run("grant", "carol", rights, pattern, "--url", server.url, env=root)
        assert granted.returncode == 0, granted.stderr
    before = on_server(server, root, "list", "--json")
    for name, source, needs in (
        ("orders-all", "payroll", "the read right on stream payroll is needed"),
        ("orders-all", "nowhere", "the read right on stream nowhere is needed"),
        ("orders-mine", "orders", "the manage right on stream orders-mine is needed"),
    ):
        refused = run("stream", "add", name, "--aggregate", source, "--url", server.url, env=carol)
        assert refused.returncode == 1, (name, source)
        assert refused.stderr.strip().splitlines() == [
            f"futoin-evt: the server refused: SecurityError: {needs}"
        ], (name, source)
    missing = run(
        "stream", "add", "orders-all", "--aggregate", "orders-x", "--url", server.url, env=carol
    )
    assert (missing.returncode, missing.stderr.strip()) == (
        2, "futoin-evt: no stream orders-x to aggregate."
    )  # fmt: skip
    assert on_server(server, root, "list", "--json") == before
    assert on_server(server, carol, "add", "orders-all", "--aggregate", "orders") == (
        "added stream orders-all aggregating orders\n"
    )
    listed = json.loads(on_server(server, carol, "list", "--json"))
    assert [(s["name"], s.get("aggregate_of")) for s in listed] == [
        ("orders", None), ("orders-all", "orders"),
    ]  # fmt: skip


def test_serve_refuses_a_lease_that_is_not_above_0(tmp_path: Path) -> None:
    result = run("serve", "--db", str(tmp_path / "x.sqlite"), "--aggregate-lease", "0")
    assert result.returncode == 2
    assert "--aggregate-lease must be above 0" in result.stderr


async def test_a_database_of_schema_version_5_gets_aggregates(tmp_path: Path) -> None:
    """schema-v5.sqlite was written by the release before aggregates
    (tests/data/make_schema_v5.py)."""
    db = str(tmp_path / "v5.sqlite")
    shutil.copy(DATA / "schema-v5.sqlite", db)
    async with await open_store(db) as store:
        orders = await store.stream("orders")
        assert orders is not None
        assert orders.aggregate_of is None
        user = await store.get_user("olduser")
        assert user is not None
        assert await store.partition_log(orders.partitions[1]).position(user.id, "OLDC") == 1
        info = await store.add_stream("all", 1, aggregate_of="orders")
        done = await store.copy_into_aggregate(info.partitions[0], "me", 30, 100)
        assert done is not None
        assert done.copied == 5
        rows = await store.partition_log(info.partitions[0]).read_rows(0, limit=100)
        check_aggregate(rows, await source_rows(store, orders))
        assert [r[4] for r in rows].count("application/json") == 1
    assert execute_sql(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


@pytest.mark.postgres
async def test_a_postgres_database_of_schema_version_5_gets_aggregates(pg_url: str) -> None:
    """A database made by the migration steps up to version 5 (which stay in the code)."""
    pg_schema_at(pg_url, 5)
    execute_sql(
        pg_url, "INSERT INTO events (type, data, ts) VALUES ('OLD', '1', 't'), ('OLD', '2', 't')"
    )
    async with await open_store(pg_url) as store:
        info = await store.add_stream("all", 1, aggregate_of="events")
        done = await store.copy_into_aggregate(info.partitions[0], "me", 30, 100)
        assert done is not None
        assert done.copied == 2
        rows = await store.partition_log(info.partitions[0]).read_rows(0, limit=100)
        assert [r[:4] for r in rows] == [(1, "OLD", "1", "t"), (2, "OLD", "2", "t")]
    assert execute_sql(pg_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
