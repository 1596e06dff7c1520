"""The ops calls on consumers (the range reader's, such as the Spark source's, and the
administration's) act on the partition of the path they are made on, on both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from futoin_evt.client.aio import OPS, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.management import CONSUMER_DROPPED, CONSUMER_REGISTERED
from futoin_evt.domain.rights import Right
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage import open_store

from .support.cli import run
from .support.servers import USERS, ServerProcess, add_user

pytestmark = pytest.mark.functional

ALICE = f"alice:{USERS['alice']}"
EPOCH = "2000-01-01T00:00:00Z"


@pytest.fixture
async def server(store_db: str, password_hashes: dict[str, str]) -> AsyncIterator[EventServer]:
    config = ServerConfig(
        db=store_db, transport=TransportConfig(port=0), retention=RetentionConfig(interval=3600)
    )
    async with await EventServer.start(config) as started:
        await add_user(started.store, "alice", password_hashes["alice"])
        await started.access.changed_here()
        await started.store.add_stream("orders", 2)
        await started.streams.refresh()
        yield started


def range_reader(base: str) -> None:
    with BlockingClient(base + "orders/1", credentials=ALICE) as one:
        one.register_consumer("RANGE")
        ids = [one.add_event("ORDER", {"n": n}) for n in range(3)]
        with BlockingClient(base + "orders/0", credentials=ALICE) as zero:
            for n in range(5):
                zero.add_event("OTHER", {"n": n})
            assert one.consumer_state("RANGE") == (0, 3)
            events = one.read_events("RANGE", 0)
            assert [(int(e["id"]), e["data"]) for e in events] == [(i, {"n": i - 1}) for i in ids]
            assert one.acknowledge("RANGE", 2) == 2
            assert one.consumer_state("RANGE") == (2, 3)
            # registered on partition 1 only: unknown on partition 0 and on events/0
            with pytest.raises(RemoteError, match="UnknownConsumer"):
                zero.consumer_state("RANGE")
    with (
        BlockingClient(base, credentials=ALICE) as default,
        pytest.raises(RemoteError, match="UnknownConsumer"),
    ):
        default.consumer_state("RANGE")
    # /orders takes addEvent only: the consumer calls name the partitions' paths
    with (
        BlockingClient(base + "orders", credentials=ALICE) as pinned,
        pytest.raises(RemoteError, match="/orders/0 to /orders/1"),
    ):
        pinned.consumer_state("RANGE")


async def test_consumer_ops_act_on_the_partition_of_the_path(server: EventServer) -> None:
    await asyncio.to_thread(range_reader, server.url)


async def test_consumer_administration_acts_on_the_partition_of_the_path(
    server: EventServer,
) -> None:
    """streamInfo, listConsumers, seekConsumer and dropConsumer on ``/orders/1`` see and move
    the consumers of that partition only; the same component elsewhere is untouched."""
    base = server.url
    notifications: list[dict[str, Any]] = []
    async with (
        await EventStreamClient.connect(base + "orders/1", credentials=ALICE) as one,
        await EventStreamClient.connect(base + "orders/0", credentials=ALICE) as zero,
        await EventStreamClient.connect(base, credentials=ALICE) as default,
    ):
        watcher = Notifications(default.ftn3)
        mine = await watcher.subscribe(
            "eventType IN ('org.futoin.evt.consumerRegistered', 'org.futoin.evt.consumerDropped')",
            ["eventType", "stream", "partition", "component"],
            compact=True,
        )
        for client in (one, zero, default):
            await client.register_consumer("SAME")
        for n in range(4):
            await one.add_event("ONE", {"n": n})
        await zero.add_event("ZERO", {})
        await one.poll_events("SAME")
        await one.poll_events("SAME", last_id=4)

        info = await one.ftn3.call(OPS, "streamInfo", {})
        assert (info["stream"], info["partition"], info["events"]) == ("orders", 1, 4)
        assert (info["first_id"], info["last_id"]) == ("1", "4")
        default_info = await default.ftn3.call(OPS, "streamInfo", {})
        assert (default_info["stream"], default_info["partition"]) == ("events", 0)
        assert default_info["events"] == 0

        listed = await one.ftn3.call(OPS, "listConsumers", {})
        assert [(c["component"], c.get("position"), c["behind"]) for c in listed] == [
            ("SAME", "4", 0)
        ]
        listed_zero = await zero.ftn3.call(OPS, "listConsumers", {})
        assert [(c["component"], c.get("position"), c["behind"]) for c in listed_zero] == [
            ("SAME", None, 1)
        ]

        # seeking back to the start moves partition 1's consumer only
        assert await one.ftn3.call(OPS, "seekConsumer", {"component": "SAME", "ts": EPOCH}) is False
        state = await one.ftn3.call(OPS, "consumerState", {"component": "SAME"})
        assert state == {"position": "0", "head_id": "4"}
        assert [e.type for e in await one.poll_events("SAME")] == ["ONE"] * 4

        # dropping on partition 0 leaves the consumers of partition 1 and events/0
        assert await zero.ftn3.call(OPS, "dropConsumer", {"user": "alice", "component": "SAME"})
        with pytest.raises(RemoteError, match="UnknownConsumer"):
            await zero.ftn3.call(OPS, "dropConsumer", {"user": "alice", "component": "SAME"})
        assert [c["component"] for c in await one.ftn3.call(OPS, "listConsumers", {})] == ["SAME"]
        assert [c["component"] for c in await default.ftn3.call(OPS, "listConsumers", {})] == [
            "SAME"
        ]
        notifications = [await asyncio.wait_for(mine.get(), 30) for _ in range(4)]
    assert [m["body"] for m in notifications] == [
        [CONSUMER_REGISTERED, "orders", 1, "SAME"],
        [CONSUMER_REGISTERED, "orders", 0, "SAME"],
        [CONSUMER_REGISTERED, "events", 0, "SAME"],
        [CONSUMER_DROPPED, "orders", 0, "SAME"],
    ]


async def test_consumer_administration_on_the_partition_the_call_names(server: EventServer) -> None:
    """streamInfo, listConsumers, seekConsumer and dropConsumer with ``stream`` and
    ``partition`` act on that partition from any path; the one left out is partition 0 of
    the stream named, or the path's stream; naming neither keeps the path's partition."""
    base = server.url
    orders1 = {"stream": "orders", "partition": 1}
    async with (
        await EventStreamClient.connect(base + "orders/1", credentials=ALICE) as one,
        await EventStreamClient.connect(base, credentials=ALICE) as default,
        await EventStreamClient.connect(base + "orders", credentials=ALICE) as pinned,
    ):
        await one.register_consumer("THERE")
        for n in range(3):
            await one.add_event("ONE", {"n": n})
        await one.poll_events("THERE")
        await one.poll_events("THERE", last_id=3)

        info = await default.ftn3.call(OPS, "streamInfo", orders1)
        assert (info["stream"], info["partition"], info["events"], info["last_id"]) == (
            "orders", 1, 3, "3"
        )  # fmt: skip
        here = await default.ftn3.call(OPS, "streamInfo", {})
        assert (here["stream"], here["partition"]) == ("events", 0)
        first = await default.ftn3.call(OPS, "streamInfo", {"stream": "orders"})
        assert (first["stream"], first["partition"], first["events"]) == ("orders", 0, 0)
        # /orders serves no consumer call of its own, but takes a partition of orders
        beside = await pinned.ftn3.call(OPS, "streamInfo", {"partition": 1})
        assert (beside["stream"], beside["partition"]) == ("orders", 1)

        listed = await default.ftn3.call(OPS, "listConsumers", orders1)
        assert [(c["component"], c.get("position")) for c in listed] == [("THERE", "3")]
        assert await default.ftn3.call(OPS, "listConsumers", {}) == []
        beside_listed = await pinned.ftn3.call(OPS, "listConsumers", {"partition": 1})
        assert [(c["component"], c.get("position")) for c in beside_listed] == [("THERE", "3")]

        seek = {"component": "THERE", "ts": EPOCH}
        with pytest.raises(RemoteError, match="UnknownConsumer"):
            await default.ftn3.call(OPS, "seekConsumer", seek)  # events/0 has no THERE
        assert await default.ftn3.call(OPS, "seekConsumer", {**seek, **orders1}) is False
        state = await one.ftn3.call(OPS, "consumerState", {"component": "THERE"})
        assert state == {"position": "0", "head_id": "3"}

        drop = {"user": "alice", "component": "THERE"}
        with pytest.raises(RemoteError, match="UnknownConsumer"):
            await default.ftn3.call(OPS, "dropConsumer", {**drop, "stream": "orders"})
        assert await default.ftn3.call(OPS, "dropConsumer", {**drop, **orders1}) is True
        assert await one.ftn3.call(OPS, "listConsumers", {}) == []


async def test_a_partition_named_is_refused_as_a_path_to_it_is(
    server: EventServer, password_hashes: dict[str, str]
) -> None:
    """bob may read ``orders*`` and write ``payroll``: a stream he may not read is refused
    with the right it needs, the same whether it exists or not; within his rights, a stream
    or partition that is not there is UnknownStream."""
    bob = await server.store.add_user("bob", password_hashes["bob"])
    await server.store.grant(bob, "orders*", int(Right.READ))
    await server.store.grant(bob, "payroll", int(Right.WRITE))
    await server.access.changed_here()
    await server.store.add_stream("payroll", 1)
    await server.streams.refresh()
    calls: tuple[tuple[str, dict[str, Any]], ...] = (
        ("streamInfo", {}),
        ("listConsumers", {}),
        ("seekConsumer", {"component": "C", "ts": EPOCH}),
        ("dropConsumer", {"user": "bob", "component": "C"}),
    )
    async with await FTN3Client.connect(server.url, credentials=f"bob:{USERS['bob']}") as client:
        for func, params in calls:
            for name in ("payroll", "secret"):
                with pytest.raises(RemoteError) as refused:
                    await client.call(OPS, func, {**params, "stream": name})
                assert (refused.value.name, refused.value.desc) == (
                    "SecurityError", f"the read right on stream {name} is needed"
                ), func  # fmt: skip
            for named, says in (
                ({"stream": "orders-old"}, "There is no stream orders-old."),
                ({"stream": "orders", "partition": 2}, "partitions 0 to 1, not 2."),
            ):
                with pytest.raises(RemoteError) as unknown:
                    await client.call(OPS, func, {**params, **named})
                assert unknown.value.name == "UnknownStream", func
                assert unknown.value.desc.endswith(says), func
        # within his rights, the call is served
        info = await client.call(OPS, "streamInfo", {"stream": "orders", "partition": 1})
        assert (info["stream"], info["partition"]) == ("orders", 1)


def test_the_commands_act_on_the_partition_they_name(
    store_db: str, password_hashes: dict[str, str]
) -> None:
    """``info``, ``consumer list``, ``consumer seek`` and ``consumer drop`` take ``--stream``
    and ``--partition`` on ``--url`` (without them, the URL's partition); ``stream info``
    takes ``--partition`` on ``--db`` and ``--url``. Bad ones exit 2, an unknown stream 1."""

    async def prepare() -> None:
        async with await open_store(store_db) as store:
            await add_user(store, "alice", password_hashes["alice"])
            await add_user(store, "bob", password_hashes["bob"], is_admin=True)
            await store.add_stream("orders", 2)

    asyncio.run(prepare())
    server = ServerProcess(store_db, 0, "--discard-interval", "3600")
    env = {"FUTOIN_EVT_USER": "alice", "FUTOIN_EVT_PASSWORD": USERS["alice"]}

    def ok(*args: str) -> str:
        result = run(*args, env=env)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    try:
        base = server.url
        orders1 = ["--url", base, "--stream", "orders", "--partition", "1"]
        for n in range(3):
            ok("add", "ORDER", str(n), "--url", base + "orders/1")
        assert len(ok("poll", "SLOW", "--url", base + "orders/1").splitlines()) == 3
        ok("add", "ORDER", "3", "--url", base + "orders/1")

        shown = json.loads(ok("info", "--json", *orders1))
        assert (shown["stream"]["stream"], shown["stream"]["partition"]) == ("orders", 1)
        assert [(c["component"], c["behind"]) for c in shown["consumers"]] == [("SLOW", 1)]
        assert ok("info", *orders1).startswith("orders/1: events 4: ids 1 .. 4")
        here = json.loads(ok("info", "--json", "--url", base))
        assert (here["stream"]["stream"], here["consumers"]) == ("events", [])
        listed = json.loads(ok("consumer", "list", "--json", *orders1))
        assert [(c["component"], c.get("position")) for c in listed] == [("SLOW", "3")]
        on_path = json.loads(ok("consumer", "list", "--json", "--url", base + "orders/1"))
        assert [(c["component"], c.get("position")) for c in on_path] == [("SLOW", "3")]

        assert ok("consumer", "seek", "SLOW", EPOCH, *orders1) == (
            "consumer SLOW reads on from the first event\n"
        )
        for where in (["--db", store_db], ["--url", base]):
            described = json.loads(
                ok("stream", "info", "orders", "--partition", "1", "--json", *where)
            )
            (partition,) = described["partitions"]
            assert (partition["number"], partition["events"]) == (1, 4), where
            assert partition["consumers"][0]["position"] == 0, where
        # bob (an admin, logged in as $FUTOIN_EVT_USER) drops alice's consumer: the USER
        # argument names the consumer's user, not who logs in
        as_bob = {"FUTOIN_EVT_USER": "bob", "FUTOIN_EVT_PASSWORD": USERS["bob"]}
        dropped = run("consumer", "drop", "alice", "SLOW", *orders1, env=as_bob)
        assert (dropped.returncode, dropped.stdout) == (0, "dropped consumer SLOW of user alice\n")
        assert json.loads(ok("consumer", "list", "--json", *orders1)) == []

        for args, status, says in (
            (["info", *orders1[:2], "--partition", "1024"], 2, "--partition must be 0 to 1023"),
            (["consumer", "list", *orders1[:2], "--stream", "Orders"], 2, "invalid stream name"),
            (["consumer", "seek", "SLOW", "yesterday", *orders1], 2, "YYYY-MM-DDTHH:MM:SSZ"),
            (["stream", "info", "orders", "--partition", "2", "--url", base], 2, "not 2"),
            (["consumer", "list", *orders1[:2], "--stream", "gone"], 1, "UnknownStream"),
            (["consumer", "drop", "alice", "SLOW", *orders1], 1, "UnknownConsumer"),
        ):
            result = run(*args, env=env)
            assert result.returncode == status, (args, result.stderr)
            assert says in result.stderr, args
            assert len(result.stderr.strip().splitlines()) == 1, args
    finally:
        assert server.stop() == 0
