"""The ops calls on the caller's own consumer (what a range reader such as the Spark source
makes) act on the partition of the path they are made on, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from futoin_evt.client.aio import RemoteError
from futoin_evt.client.sync import BlockingClient
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from .conftest import USERS

pytestmark = pytest.mark.functional

ALICE = f"alice:{USERS['alice']}"


@pytest.fixture
async def server(store_db: str, password_hashes: dict[str, str]) -> AsyncIterator[EventServer]:
    config = ServerConfig(
        db=store_db, transport=TransportConfig(port=0), retention=RetentionConfig(interval=3600)
    )
    async with await EventServer.start(config) as started:
        await started.store.add_user("alice", password_hashes["alice"])
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
