"""Streams with partitions at the AMQP door: the Event Hubs SDKs (Python, and JavaScript's
@azure/event-hubs) unchanged against a stream of 4 partitions (partition ids, keyed and
partition batches, receiving over every partition with both load-balancing strategies, and
from a sequence number), and the event streams draft's partition-bound and partition-agnostic
links, driven by proton's own client. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from proton import Delivery, Message, symbol
from proton.utils import LinkDetached, SendException

from futoin_evt.amqp.streams.addressing import key_partition
from futoin_evt.domain.partition import Partition
from futoin_evt.server.app import EventServer

from .support import eventhubs
from .support.amqp import LinkProperties, annotations_filter, connected
from .support.eventhubs import HUB, PARTITIONS, connection_string, key_of, receive_from
from .support.js import run_js
from .support.waiting import until

pytestmark = pytest.mark.functional

SOURCE = symbol("event-streams-source-partition")
TARGET = symbol("event-streams-target-partition")
PARTITION = symbol("event-streams-partition")


hub = eventhubs.hub


def receive(conn_str: str, count: int, **options: Any) -> list[tuple[str, Any]]:
    """(partition id, event) over every partition (or ``partition_id``), greedily unless
    ``load_balancing_strategy`` says otherwise, with the SDK's own pacing shortened: its one
    thread serves the partitions in turn, one event each, and each with nothing to give waits
    ``socket_timeout`` (0.2 s by default) on its socket; the balanced strategy claims one
    partition per load balancing. Claims last 6 s, so a slow turn does not lose one."""
    options.setdefault("load_balancing_interval", 0.25)
    options.setdefault("partition_ownership_expiration_interval", 6)
    options.setdefault("load_balancing_strategy", "greedy")
    options.setdefault("socket_timeout", 0.05)
    return receive_from(conn_str, count, **options)


def send_keyed(conn_str: str, keys: list[str], rounds: int, per_batch: int) -> None:
    with EventHubProducerClient.from_connection_string(conn_str) as producer:
        for round_ in range(rounds):
            for key in keys:
                batch = producer.create_batch(partition_key=key)
                for n in range(per_batch):
                    batch.add(EventData(f'{{"key": "{key}", "n": {round_ * per_batch + n}}}'))
                producer.send_batch(batch)


def check_every_event_once_in_key_order(
    received: list[tuple[str, Any]], keys: list[str], count: int
) -> None:
    by_key: dict[str, list[int]] = defaultdict(list)
    seen = set()
    for partition, event in received:
        body = event.body_as_json()
        assert partition == str(key_partition(body["key"], PARTITIONS))
        seen.add((body["key"], body["n"]))
        by_key[body["key"]].append(body["n"])
    assert len(received) == len(seen) == len(keys) * count
    for key in keys:
        assert by_key[key] == list(range(count)), key


async def test_the_sdk_sees_partitions_and_keys_pick_them(hub: EventServer) -> None:
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"), HUB)

    def properties() -> tuple[list[str], dict[str, Any], list[dict[str, Any]]]:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            ids = producer.get_partition_ids()
            return (
                ids,
                producer.get_eventhub_properties(),
                [producer.get_partition_properties(p) for p in ids],
            )

    keys = [f"customer-{n}" for n in range(8)]
    await asyncio.to_thread(send_keyed, conn_str, keys, 5, 3)
    ids, hub_properties, partitions = await asyncio.to_thread(properties)
    assert ids == ["0", "1", "2", "3"]
    assert hub_properties["eventhub_name"] == HUB
    assert hub_properties["partition_ids"] == ids
    expected: defaultdict[str, int] = defaultdict(int)
    for key in keys:
        expected[str(key_partition(key, PARTITIONS))] += 15
    assert len(expected) > 1  # the keys are spread over partitions
    for partition in partitions:
        # sequence numbers are per partition: each counts its own events from 1
        assert partition["last_enqueued_sequence_number"] == expected[partition["id"]]
        assert partition["is_empty"] == (expected[partition["id"]] == 0)

    for strategy in ("greedy", "balanced"):
        received = await asyncio.to_thread(
            receive, conn_str, 120, starting_position="-1", load_balancing_strategy=strategy
        )
        check_every_event_once_in_key_order(received, keys, 15)
        for partition_id in ids:
            numbers = [e.sequence_number for p, e in received if p == partition_id]
            assert numbers == list(range(1, expected[partition_id] + 1))
            assert [e.offset for p, e in received if p == partition_id][:1] == (
                ["00000000000000000001"] if numbers else []
            )


async def test_partition_batches_and_reading_one_partition_from_a_sequence_number(
    hub: EventServer,
) -> None:
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"), HUB)

    def produce() -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            batch = producer.create_batch(partition_id="2")
            for n in range(10):
                batch.add(EventData(f'{{"n": {n}}}'))
            producer.send_batch(batch)
            producer.send_event(EventData('{"n": 10}'), partition_id="2")
            # without a key or a partition: spread over the partitions
            for n in range(8):
                producer.send_event(EventData(f'{{"spread": {n}}}'))

    await asyncio.to_thread(produce)
    later = await asyncio.to_thread(receive, conn_str, 3, partition_id="2", starting_position=8)
    assert [(p, e.sequence_number) for p, e in later] == [("2", 9), ("2", 10), ("2", 11)]
    assert [e.body_as_json()["n"] for _, e in later] == [8, 9, 10]
    spread = await asyncio.to_thread(
        lambda: receive(conn_str, 19, starting_position="-1", load_balancing_interval=1)
    )
    partitions_of_spread = {p for p, e in spread if "spread" in e.body_as_json()}
    assert len(partitions_of_spread) == PARTITIONS


async def test_partition_bound_and_agnostic_links(hub: EventServer) -> None:
    url = hub.amqp_url or ""

    def scenario() -> dict[Any, Any]:
        outcome: dict[Any, Any] = {}
        with connected(url) as conn:
            bound = conn.create_sender(
                HUB, name="bound", options=LinkProperties(event_streams_partition="3")
            )
            outcome["bound"] = bound.link.remote_properties[PARTITION]
            bound.send(Message(subject="T", body={"to": 3}))
            bound.send(Message(subject="T", body={"to": 3}, instructions={TARGET: symbol("3")}))
            try:
                bound.send(Message(subject="T", body={"to": 1}, instructions={TARGET: symbol("1")}))
            except SendException as exc:
                outcome["other target"] = exc.state
            by_address = conn.create_sender(f"{HUB}/Partitions/1")
            outcome["by address"] = by_address.link.remote_properties[PARTITION]
            agnostic = conn.create_sender(HUB, name="agnostic")
            outcome["agnostic"] = (agnostic.link.remote_properties or {}).get(PARTITION)
            agnostic.send(Message(subject="T", body={"to": 0}, instructions={TARGET: symbol("0")}))
            group_key = {symbol("event-streams-group-key"): "k"}
            agnostic.send(Message(subject="T", body={"key": "k"}, annotations=group_key))
            for n, (address, properties) in enumerate(
                (
                    (f"{HUB}/Partitions/4", {}),
                    (f"{HUB}/Partitions/01", {}),
                    (f"{HUB}/Partitions/1", {"event_streams_partition": "2"}),
                )
            ):
                try:
                    conn.create_sender(
                        address, name=f"refused-{n}", options=LinkProperties(**properties)
                    )
                except LinkDetached as exc:
                    outcome[address, str(properties)] = exc.condition

            receiver = conn.create_receiver(
                HUB, credit=10, options=annotations_filter(offset="@earliest")
            )
            outcome["agnostic consumer"] = (receiver.link.remote_properties or {}).get(PARTITION)
            received = []
            for _ in range(4):
                message = receiver.receive()
                annotations: Any = message.instructions
                received.append((annotations[SOURCE], message.body))
                receiver.accept()
            outcome["received"] = sorted(received, key=str)
            info: Any = conn.create_receiver(f"{HUB}/$info", credit=1).receive().body
            outcome["info"] = info[symbol("partitions")]
        return outcome

    outcome = await asyncio.to_thread(scenario)
    assert outcome["bound"] == outcome["agnostic consumer"] or outcome["bound"] == "3"
    assert outcome["bound"] == "3"
    assert outcome["other target"] is not None
    assert outcome["by address"] == "1"
    assert outcome["agnostic"] is None
    assert outcome["agnostic consumer"] is None
    assert outcome[f"{HUB}/Partitions/4", "{}"] == "amqp:not-found"
    assert outcome[f"{HUB}/Partitions/01", "{}"] == "amqp:not-found"
    assert outcome[f"{HUB}/Partitions/1", "{'event_streams_partition': '2'}"] == (
        "amqp:invalid-field"
    )
    keyed = str(key_partition("k", PARTITIONS))
    assert outcome["received"] == sorted(
        [("3", {"to": 3}), ("3", {"to": 3}), ("0", {"to": 0}), (keyed, {"key": "k"})], key=str
    )
    assert [p[symbol("partition")] for p in outcome["info"]] == ["0", "1", "2", "3"]
    counts = {"0": 1, "3": 2}
    counts[keyed] = counts.get(keyed, 0) + 1
    for partition in outcome["info"]:
        latest = partition[symbol("latest-offset")]
        number = counts.get(partition[symbol("partition")], 0)
        assert latest == (f"{number:020d}" if number else None)


async def test_group_links_get_free_partitions_and_ftn18_groups_bind_per_partition(
    hub: EventServer,
) -> None:
    url = hub.amqp_url or ""

    def scenario() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        with connected(url) as conn:
            sender = conn.create_sender(HUB)
            for n in range(PARTITIONS):
                sender.send(Message(subject="T", body=n, instructions={TARGET: symbol(str(n))}))
            group = LinkProperties(event_streams_consumer_group="ftn18:billing")
            links: list[Any] = [
                conn.create_receiver(HUB, name=f"member-{n}", credit=1, options=group)
                for n in range(PARTITIONS)
            ]
            outcome["assigned"] = sorted(r.link.remote_properties[PARTITION] for r in links)
            for receiver in links:
                message = receiver.receive()
                outcome[receiver.link.remote_properties[PARTITION]] = message.body
                receiver.accept()
            try:
                conn.create_receiver(HUB, name="one too many", credit=1, options=group)
            except LinkDetached as exc:
                outcome["fifth"] = exc.condition
            links[1].close()
            again: Any = conn.create_receiver(HUB, name="again", credit=1, options=group)
            outcome["again"] = again.link.remote_properties[PARTITION]
            for receiver in (again, *links[:1], *links[2:]):
                receiver.close()
        return outcome

    outcome = await asyncio.to_thread(scenario)
    assert outcome["assigned"] == ["0", "1", "2", "3"]
    assert all(outcome[str(n)] == n for n in range(PARTITIONS))
    assert outcome["fifth"] == "amqp:link:detach-forced"
    assert outcome["again"] == outcome["assigned"][1]
    # the registered consumer billing has a position in each partition
    alice = await hub.store.get_user("alice")
    assert alice is not None
    info = hub.streams.get(HUB)
    assert info is not None
    user_id = alice.id

    async def accepted(partition: Partition) -> bool:
        """The position is written once the accept arrives."""
        return await hub.store.partition_log(partition).position(user_id, "billing") == 1

    for partition in info.partitions:
        await until(partial(accepted, partition), f"the position on {partition}", interval=0.05)


async def test_the_javascript_sdk(hub: EventServer, js_peer: Path) -> None:
    """@azure/event-hubs, unchanged: partition ids, keyed and partition batches, receiving
    over every partition and one partition from a sequence number."""
    keys = [f"js-{n}" for n in range(6)]
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"), HUB)
    lines = await run_js(
        js_peer, "eventhubs.js", {"connectionString": conn_str, "keys": keys, "perKey": 4}
    )
    assert lines[0] == {"ids": ["0", "1", "2", "3"]}
    everything = lines[1]["all"]
    assert len(everything) == len(keys) * 4 + 5
    by_key: dict[str, list[int]] = defaultdict(list)
    for event in everything:
        body = event["body"]
        if "key" in body:
            assert event["partition"] == str(key_partition(body["key"], PARTITIONS))
            by_key[body["key"]].append(body["n"])
        else:
            assert event["partition"] == "1"
    assert by_key == {key: [0, 1, 2, 3] for key in keys}
    for partition in ("0", "1", "2", "3"):
        numbers = [e["sequence"] for e in everything if e["partition"] == partition]
        assert numbers == list(range(1, len(numbers) + 1))
    one = lines[2]["one"]
    assert [e["sequence"] for e in one] == list(range(3, 3 + len(one)))
    assert {e["partition"] for e in one} == {"1"}


async def test_a_dropped_stream_refuses_its_messages_and_links(hub: EventServer) -> None:
    url = hub.amqp_url or ""
    await hub.store.add_stream("brief", 2)
    await hub.streams.refresh()
    loop = asyncio.get_running_loop()

    async def drop() -> None:
        await hub.store.drop_stream("brief")
        await hub.streams.refresh()

    def scenario() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        with connected(url) as conn:
            sender = conn.create_sender("brief", name="to-brief")
            sender.send(Message(subject="T", body=1))
            asyncio.run_coroutine_threadsafe(drop(), loop).result()
            try:
                sender.send(Message(subject="T", body=2))
            except SendException as exc:
                outcome["send"] = exc.state
            try:
                conn.create_sender("brief", name="again")
            except LinkDetached as exc:
                outcome["attach"] = exc.condition
            # the connection and the other streams are served on
            conn.create_sender(HUB, name="other").send(Message(subject="T", body=3))
        return outcome

    outcome = await asyncio.to_thread(scenario)
    assert outcome == {"send": Delivery.REJECTED, "attach": "amqp:not-found"}


async def test_messages_to_an_aggregated_stream_are_rejected(hub: EventServer) -> None:
    url = hub.amqp_url or ""
    info = await hub.store.add_stream("all", 1, aggregate_of=HUB)
    await hub.streams.refresh()

    def scenario() -> Any:
        with connected(url) as conn:
            try:
                conn.create_sender("all", name="to-all").send(Message(subject="T", body=1))
            except SendException as exc:
                return exc.state
        return None

    assert await asyncio.to_thread(scenario) == Delivery.REJECTED
    assert await hub.store.partition_log(info.partitions[0]).newest_event_id() == 0


async def test_a_partition_agnostic_consumer_follows_a_grown_stream(hub: EventServer) -> None:
    url = hub.amqp_url or ""
    loop = asyncio.get_running_loop()

    async def grow() -> None:
        await hub.store.grow_stream(HUB, PARTITIONS + 2)
        await hub.streams.refresh()

    def scenario() -> list[tuple[str, Any]]:
        received = []
        with connected(url) as conn:
            receiver = conn.create_receiver(HUB, credit=10)
            sender = conn.create_sender(HUB, name="to-all")
            sender.send(Message(subject="T", body=0, instructions={TARGET: symbol("0")}))
            received.append(receiver.receive())
            asyncio.run_coroutine_threadsafe(grow(), loop).result()
            for partition in (str(PARTITIONS + 1), str(PARTITIONS), "0"):
                sender.send(
                    Message(subject="T", body=partition, instructions={TARGET: symbol(partition)})
                )
            for _ in range(3):
                received.append(receiver.receive())
                receiver.accept()
        return [(cast(Any, m.instructions)[SOURCE], m.body) for m in received]

    received = await asyncio.to_thread(scenario)
    assert sorted(received, key=str) == sorted(
        [("0", 0), ("0", "0"), ("4", "4"), ("5", "5")], key=str
    )
