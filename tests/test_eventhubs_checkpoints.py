"""The Event Hubs checkpoint store kept in the server (futoin_evt.eventhubs): its calls as the
SDK makes them, and consumer processes as users run them, sharing a group's partitions through
it: two processes split 4 partitions; one is killed and the other takes its partitions over
from their checkpoints; both restart and resume. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.exceptions import EventHubError

from futoin_evt.amqp.streams.addressing import key_partition
from futoin_evt.eventhubs import FutoinCheckpointStore
from futoin_evt.eventhubs.aio import FutoinCheckpointStore as AsyncCheckpointStore
from futoin_evt.server.app import EventServer

from .support import eventhubs, waiting
from .support.eventhubs import HUB, PARTITIONS, connection_string, key_of

pytestmark = pytest.mark.functional

hub = eventhubs.hub

CONSUMER = Path(__file__).parent / "data" / "eventhubs_consumer.py"
ROOT = Path(__file__).parent.parent
#: A bound for what must happen (claims expire after 4 s in the consumer processes).
WITHIN_SECONDS = 60.0

#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=WITHIN_SECONDS)

NAMESPACE = "127.0.0.1"


def ownership(partition: str, owner: str, etag: str | None = None) -> dict[str, Any]:
    return {
        "fully_qualified_namespace": NAMESPACE,
        "eventhub_name": HUB,
        "consumer_group": "$Default",
        "partition_id": partition,
        "owner_id": owner,
        "etag": etag,
    }


async def test_ownership_claims_with_etags_and_checkpoints(hub: EventServer) -> None:
    alice = connection_string(hub, "alice", await key_of(hub, "alice"), HUB)
    bob = connection_string(hub, "bob", await key_of(hub, "bob"), HUB)

    def scenario() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        with (
            FutoinCheckpointStore.from_connection_string(alice) as store,
            FutoinCheckpointStore.from_connection_string(bob) as other_user,
            FutoinCheckpointStore.from_connection_string(alice, retry_total=0) as no_retries,
        ):
            first = list(store.claim_ownership([ownership("0", "a"), ownership("1", "a")]))
            outcome["first"] = first
            # a claim without the current etag loses; with it, wins
            outcome["stale"] = list(store.claim_ownership([ownership("0", "b")]))
            taken = list(store.claim_ownership([ownership("0", "b", first[0]["etag"])]))
            outcome["taken"] = taken
            outcome["old etag"] = list(
                store.claim_ownership([ownership("0", "c", first[0]["etag"])])
            )
            outcome["listed"] = list(store.list_ownership(NAMESPACE, HUB, "$Default"))
            store.update_checkpoint(
                {
                    **ownership("2", ""),
                    "offset": "00000000000000000007",
                    "sequence_number": 7,
                }
            )
            store.update_checkpoint(
                {**ownership("2", ""), "offset": "00000000000000000009", "sequence_number": 9}
            )
            outcome["checkpoints"] = list(store.list_checkpoints(NAMESPACE, HUB, "$Default"))
            outcome["other group"] = list(store.list_checkpoints(NAMESPACE, HUB, "other"))
            outcome["other user"] = (
                list(other_user.list_ownership(NAMESPACE, HUB, "$Default")),
                list(other_user.list_checkpoints(NAMESPACE, HUB, "$Default")),
            )
            for name, claim in (
                ("no such partition", ownership("4", "a")),
                ("another hub", {**ownership("0", "a"), "eventhub_name": "nothing"}),
            ):
                try:
                    no_retries.claim_ownership([claim])
                except EventHubError as exc:
                    outcome[name] = str(exc)
        return outcome

    before = time.time()
    outcome = await asyncio.to_thread(scenario)
    first = outcome["first"]
    assert [(o["partition_id"], o["owner_id"]) for o in first] == [("0", "a"), ("1", "a")]
    assert all(o["eventhub_name"] == HUB and o["consumer_group"] == "$Default" for o in first)
    assert all(before - 1 <= o["last_modified_time"] <= time.time() + 1 for o in first)
    assert outcome["stale"] == []
    assert [(o["owner_id"], o["etag"] != first[0]["etag"]) for o in outcome["taken"]] == [
        ("b", True)
    ]
    assert outcome["old etag"] == []
    assert {o["partition_id"]: o["owner_id"] for o in outcome["listed"]} == {"0": "b", "1": "a"}
    assert [
        (c["partition_id"], c["offset"], c["sequence_number"]) for c in outcome["checkpoints"]
    ] == [("2", "00000000000000000009", 9)]
    assert outcome["other group"] == []
    assert outcome["other user"] == ([], [])
    assert "no such partition" in outcome["no such partition"]
    # another hub than the connection string's is outside its token's scope
    assert "covers 'nothing/$management'" in outcome["another hub"]

    async with AsyncCheckpointStore.from_connection_string(alice) as aio_store:
        listed = await aio_store.list_ownership(NAMESPACE, HUB, "$Default")
        assert {o["partition_id"]: o["owner_id"] for o in listed} == {"0": "b", "1": "a"}


async def test_the_store_keeps_one_connection_and_opens_another_when_it_is_lost(
    hub: EventServer,
) -> None:
    """Its requests share one AMQP connection (the SDK's own open one each); one aborted
    by the server is opened again by the next request, which is answered."""
    assert hub.amqp is not None
    listener = hub.amqp
    alice = connection_string(hub, "alice", await key_of(hub, "alice"), HUB)
    checkpoint = {**ownership("1", ""), "offset": "00000000000000000003", "sequence_number": 3}
    with FutoinCheckpointStore.from_connection_string(alice) as store:
        for _ in range(5):
            await asyncio.to_thread(store.update_checkpoint, checkpoint)
            await asyncio.to_thread(store.list_checkpoints, NAMESPACE, HUB, "$Default")
        assert len(listener.slots) == 1
        [connection] = list(listener.slots)
        connection.abort()
        await connection.closed
        listed = await asyncio.to_thread(store.list_checkpoints, NAMESPACE, HUB, "$Default")
        assert [(c["partition_id"], c["sequence_number"]) for c in listed] == [("1", 3)]
        assert len(listener.slots) == 1
        assert connection not in list(listener.slots)
    async with AsyncCheckpointStore.from_connection_string(alice) as aio_store:
        for _ in range(5):
            await aio_store.list_checkpoints(NAMESPACE, HUB, "$Default")
        assert len(listener.slots) == 1
        [connection] = list(listener.slots)
        connection.abort()
        await connection.closed
        listed = list(await aio_store.list_checkpoints(NAMESPACE, HUB, "$Default"))
        assert [(c["partition_id"], c["sequence_number"]) for c in listed] == [("1", 3)]


class ConsumerProcess:
    """tests/data/eventhubs_consumer.py in a process of its own; its lines as they come."""

    def __init__(self, conn_str: str, mode: str, name: str) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, str(CONSUMER), conn_str, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for text in self.process.stdout:
            self.lines.append(json.loads(text))

    @property
    def owned(self) -> set[str]:
        owned: set[str] = set()
        for line in list(self.lines):
            if line["kind"] == "owned":
                owned.add(line["partition"])
            elif line["kind"] == "released":
                owned.discard(line["partition"])
        return owned

    def events(self, kind: str = "event") -> list[tuple[str, int, str, int]]:
        return [
            (line["partition"], line["sequence"], line["body"]["key"], line["body"]["n"])
            for line in list(self.lines)
            if line["kind"] == kind
        ]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WITHIN_SECONDS)
        self._reader.join(timeout=WITHIN_SECONDS)
        assert self.process.stdout is not None
        self.process.stdout.close()


KEYS = [f"customer-{n}" for n in range(8)]


def send_phase(conn_str: str, phase: int) -> set[tuple[str, int]]:
    """Five events for each key, as keyed batches; their (key, n)."""
    sent = set()
    with EventHubProducerClient.from_connection_string(conn_str) as producer:
        for key in KEYS:
            batch = producer.create_batch(partition_key=key)
            for n in range(phase * 5, phase * 5 + 5):
                batch.add(EventData(json.dumps({"key": key, "n": n})))
                sent.add((key, n))
            producer.send_batch(batch)
    return sent


def received(*consumers: ConsumerProcess, kind: str = "event") -> set[tuple[str, int]]:
    return {(key, n) for c in consumers for _p, _s, key, n in c.events(kind)}


def check_order(consumer: ConsumerProcess) -> None:
    """Each partition's events in order in a process, each key's in its partition."""
    last: dict[str, int] = {}
    for partition, sequence, key, _n in consumer.events():
        assert partition == str(key_partition(key, PARTITIONS))
        assert sequence > last.get(partition, 0), (consumer.name, partition, sequence)
        last[partition] = sequence


async def consumers_share_the_partitions(server: EventServer, mode: str) -> None:
    conn_str = connection_string(server, "alice", await key_of(server, "alice"), HUB)
    everything = set[tuple[str, int]]()
    first = ConsumerProcess(conn_str, mode, "first")
    second = ConsumerProcess(conn_str, mode, "second")
    restarted: list[ConsumerProcess] = []
    try:

        def split(a: ConsumerProcess, b: ConsumerProcess) -> bool:
            return len(a.owned) == len(b.owned) == 2 and not a.owned & b.owned

        await until(lambda: split(first, second), "two processes split 4 partitions")
        everything |= await asyncio.to_thread(send_phase, conn_str, 0)
        await until(lambda: received(first, second) >= everything, "phase 0 received")
        assert not received(first) & received(second)  # each event once

        first.kill()
        everything |= await asyncio.to_thread(send_phase, conn_str, 1)
        await until(lambda: len(second.owned) == PARTITIONS, "the survivor owns every partition")
        await until(lambda: received(first, second) >= everything, "phase 1 received")
        # what the killed process had not checkpointed is all that is received again
        unchecked = set(first.events()) - set(first.events("checkpoint"))
        again = Counter(first.events() + second.events())
        assert {event for event, times in again.items() if times > 1} <= unchecked, (
            first.lines,
            second.lines,
        )
        assert all(times <= 2 for times in again.values())

        await until(
            lambda: received(second, kind="checkpoint") >= everything - received(first),
            "the survivor's checkpoints stored",
        )
        second.kill()
        restarted = [ConsumerProcess(conn_str, mode, name) for name in ("third", "fourth")]
        await until(lambda: split(*restarted), "restarted processes split the partitions")
        everything |= await asyncio.to_thread(send_phase, conn_str, 2)
        await until(lambda: received(*restarted) >= everything - received(first, second), "resumed")
        # resumed from the checkpoints: nothing before them comes again
        phase_2 = {(key, n) for key in KEYS for n in range(10, 15)}
        assert received(*restarted) == phase_2
        assert len(restarted[0].events()) + len(restarted[1].events()) == len(phase_2)
        for consumer in (first, second, *restarted):
            check_order(consumer)
    finally:
        for consumer in (first, second, *restarted):
            consumer.kill()


async def test_two_consumer_processes_share_partitions_through_the_store(
    hub: EventServer,
) -> None:
    await consumers_share_the_partitions(hub, "sync")


@pytest.mark.parametrize("store_db", ["sqlite"], indirect=True)
async def test_the_async_client_with_the_aio_store(hub: EventServer) -> None:
    await consumers_share_the_partitions(hub, "aio")
