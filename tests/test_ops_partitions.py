"""The ops calls on consumers (the range reader's, such as the Spark source's, and the
administration's) act on the partition of the path they are made on, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.management import CONSUMER_DROPPED, CONSUMER_REGISTERED
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from .conftest import USERS, add_user

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
