"""Event Hubs clients: the official azure-eventhub SDK, unchanged, with a connection string; and
the ``$cbs`` token exchange it relies on, driven by proton's own client."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.exceptions import EventHubError
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.amqp import AmqpConfig, AmqpLimits
from futoin_evt.auth.sas import sign
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.server.app import EventServer

from .support.eventhubs import (
    SECRET,
    anonymous,
    connection_string,
    key_of,
    put_token,
    receive_from,
)
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

EARLIEST = Filter(
    {symbol("f"): Described(ulong(0x200), {symbol("event-streams-offset"): symbol("@earliest")})}
)


@pytest.fixture
async def hub(start_server: ServerFactory) -> EventServer:
    return await start_server(amqp=AmqpConfig(port=0, sas_secret=SECRET))


def receive(conn_str: str, count: int, **options: Any) -> list[Any]:
    """``count`` events from partition 0 with EventHubConsumerClient (closed once they came)."""
    return [
        event for _partition, event in receive_from(conn_str, count, partition_id="0", **options)
    ]


async def test_producer_and_consumer_clients(hub: EventServer) -> None:
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"))

    def produce() -> tuple[dict[str, Any], dict[str, Any]]:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            hub_properties = producer.get_eventhub_properties()
            batch = producer.create_batch()
            for n in range(100):
                batch.add(EventData(f'{{"n": {n}}}'))
            producer.send_batch(batch)
            producer.send_event(EventData("single"))
            return hub_properties, producer.get_partition_properties("0")

    hub_properties, partition = await asyncio.to_thread(produce)
    assert hub_properties["eventhub_name"] == "events"
    assert hub_properties["partition_ids"] == ["0"]
    assert partition["last_enqueued_sequence_number"] == 101
    assert not partition["is_empty"]

    everything = await asyncio.to_thread(receive, conn_str, 101, starting_position="-1")
    assert [e.sequence_number for e in everything] == list(range(1, 102))
    assert [e.body_as_str() for e in everything] == [f'{{"n": {n}}}' for n in range(100)] + [
        "single"
    ]
    assert everything[0].offset == "00000000000000000001"

    # From a sequence number, and from an offset (both exclusive, as the SDK asks).
    later = await asyncio.to_thread(receive, conn_str, 2, starting_position=99)
    assert [e.sequence_number for e in later] == [100, 101]
    after_offset = await asyncio.to_thread(
        receive, conn_str, 1, starting_position="00000000000000000100"
    )
    assert [e.sequence_number for e in after_offset] == [101]
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    since = await asyncio.to_thread(receive, conn_str, 101, starting_position=an_hour_ago)
    assert len(since) == 101


async def test_events_from_the_sdk_are_the_log_seen_over_ftn3(
    hub: EventServer, alice: EventStreamClient
) -> None:
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"))

    def produce() -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            batch = producer.create_batch()
            batch.add(EventData(b"\x00\x01raw"))
            batch.add(EventData('{"json": true}'))
            producer.send_batch(batch)

    await alice.register_consumer("c1")
    await asyncio.to_thread(produce)
    await alice.add_event("ORDER", {"from": "ftn3"})
    events = await alice.poll_events("c1")
    assert [(e.type, e.id) for e in events] == [("EVENT", 1), ("EVENT", 2), ("ORDER", 3)]
    assert events[1].data == {"$binary": "eyJqc29uIjogdHJ1ZX0="}  # a data section, as sent
    received = await asyncio.to_thread(receive, conn_str, 3, starting_position="-1")
    assert [b"".join(e.body) for e in received][:2] == [b"\x00\x01raw", b'{"json": true}']
    assert received[2].body_as_json() == {"from": "ftn3"}


JSON_DATA = {"k": 0, "nested": {"a": [1, 2.5, None, True]}, "s": "caf\u00e9 \u2028"}
OPAQUE = bytes(range(256))  # not UTF-8


async def test_what_the_sdk_sends_comes_back_as_it_was_sent(
    hub: EventServer, alice: EventStreamClient
) -> None:
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"))
    text = json.dumps(JSON_DATA)

    def event(body: str | bytes, content_type: str | None) -> EventData:
        sent = EventData(body)
        if content_type is not None:
            sent.content_type = content_type
        return sent

    def produce() -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            producer.send_event(event(text, "application/json"))
            batch = producer.create_batch()
            batch.add(event(text, "application/json; charset=utf-8"))
            batch.add(event(OPAQUE, None))
            batch.add(event(OPAQUE, "application/octet-stream"))
            producer.send_batch(batch)

    await alice.register_consumer("c1")
    await asyncio.to_thread(produce)
    await alice.add_event("ORDER", {"from": "ftn3", "n": [1, 2]})
    over_ftn3 = await alice.poll_events("c1")
    assert [e.data for e in over_ftn3[:2]] == [JSON_DATA, JSON_DATA]  # JSON, as sent

    received = await asyncio.to_thread(receive, conn_str, 5, starting_position="-1")
    json_events, opaque_events, ftn3_event = received[:2], received[2:4], received[4]
    for got, content_type in zip(
        json_events, ["application/json", "application/json; charset=utf-8"], strict=True
    ):
        assert got.body_as_json() == JSON_DATA
        assert got.body_as_str() == text
        assert got.content_type == content_type
    for got, opaque_type in zip(opaque_events, [None, "application/octet-stream"], strict=True):
        assert b"".join(got.body) == OPAQUE
        assert got.content_type == opaque_type
    assert ftn3_event.body_as_json() == {"from": "ftn3", "n": [1, 2]}
    assert ftn3_event.content_type == "application/json"


async def test_a_partition_key_and_properties_come_back_as_the_sdk_sent_them(
    hub: EventServer, alice: EventStreamClient
) -> None:
    """EventData.partition_key and .properties, sent alone and in a batch, come back to the
    SDK's consumer; an event added through FTN18 goes out with neither, as it always did."""
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"))
    properties: dict[str | bytes, Any] = {"tenant": "acme", "n": 7, "ok": True, "raw": b"\x00\xff"}

    def produce() -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            single = EventData('{"n": 1}')
            single.properties = properties
            producer.send_event(single, partition_key="order-7")
            batch = producer.create_batch(partition_key="order-8")
            for n in (2, 3):
                batched = EventData(f'{{"n": {n}}}')
                batched.properties = {"n": n}
                batch.add(batched)
            producer.send_batch(batch)

    await alice.register_consumer("c1")
    await asyncio.to_thread(produce)
    await alice.add_event("ORDER", {"from": "ftn3"})
    assert [e.type for e in await alice.poll_events("c1")] == ["EVENT"] * 3 + ["ORDER"]

    received = await asyncio.to_thread(receive, conn_str, 4, starting_position="-1")
    # the SDK's AMQP layer gives strings as bytes
    assert [e.partition_key for e in received] == [b"order-7", b"order-8", b"order-8", None]
    assert [e.properties for e in received] == [
        {b"tenant": b"acme", b"n": 7, b"ok": True, b"raw": b"\x00\xff"},
        {b"n": 2},
        {b"n": 3},
        {},
    ]
    assert received[3].body_as_json() == {"from": "ftn3"}


async def test_the_plain_node_keeps_amqp_value_for_json_of_other_doors(
    hub: EventServer, alice: EventStreamClient
) -> None:
    """A proton client on the OASIS node gets JSON data added elsewhere as an amqp-value, and
    a JSON data section as the data section it came as."""
    conn_str = connection_string(hub, "alice", await key_of(hub, "alice"))
    text = json.dumps(JSON_DATA)

    def produce() -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            sent = EventData(text)
            sent.content_type = "application/json"
            producer.send_event(sent)

    await asyncio.to_thread(produce)
    await alice.add_event("ORDER", {"from": "ftn3"})
    assert hub.amqp_url is not None

    def consume() -> list[Message]:
        conn = BlockingConnection(
            hub.amqp_url or "", user="alice", password=USERS["alice"], allowed_mechs="PLAIN"
        )
        try:
            receiver = conn.create_receiver("events", credit=2, options=EARLIEST)
            messages = [receiver.receive(timeout=30) for _ in range(2)]
            receiver.accept()
            return messages
        finally:
            conn.close()

    from_sdk, from_ftn3 = await asyncio.to_thread(consume)
    assert (from_sdk.inferred, from_sdk.body, from_sdk.content_type) == (
        True,
        text.encode(),
        "application/json",
    )
    assert (from_ftn3.inferred, from_ftn3.body) == (False, {"from": "ftn3"})


async def test_a_wrong_key_is_refused_and_not_logged(
    hub: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "d3JvbmcgYnV0IHdlbGwtZm9ybWVkIGtleSBmb3IgdGVzdHM="
    conn_str = connection_string(hub, "alice", wrong)

    def properties() -> None:
        with EventHubProducerClient.from_connection_string(conn_str, retry_total=0) as client:
            client.get_eventhub_properties()

    with caplog.at_level(logging.INFO), pytest.raises(EventHubError):
        await asyncio.to_thread(properties)
    refusals = [r.getMessage() for r in caplog.records if "token refused" in r.getMessage()]
    assert refusals
    assert "signature does not match" in refusals[0]
    assert not any(wrong in r.getMessage() for r in caplog.records)


AUDIENCE = "sb://127.0.0.1/events"


async def test_links_need_a_token_first(hub: EventServer) -> None:
    key = await key_of(hub, "alice")

    def scenario() -> None:
        with anonymous(hub) as conn, pytest.raises(LinkDetached, match="unauthorized-access"):
            conn.create_sender("events")
        with anonymous(hub) as conn:
            token = sign(AUDIENCE, "alice", key, int(time.time()) + 600)
            assert put_token(conn, token, AUDIENCE) == (200, "OK")
            conn.create_sender("events").send(Message(subject="CBS", body=1))

    await asyncio.to_thread(scenario)
    assert (await hub.store.read_rows(0, limit=10))[0][1:3] == ("CBS", "1")


@pytest.mark.parametrize(
    ("name", "expiry", "audience", "reason"),
    [
        ("alice", -10, AUDIENCE, "has expired"),
        ("nobody", 600, AUDIENCE, "signature does not match"),  # not "no such user"
        ("bob", 600, AUDIENCE, "signature does not match"),  # alice's key, bob's name
        ("alice", 600, "sb://127.0.0.1/elsewhere", "does not cover"),
    ],
)
async def test_bad_tokens_are_refused(
    hub: EventServer, name: str, expiry: int, audience: str, reason: str
) -> None:
    key = await key_of(hub, "alice")
    token = sign(AUDIENCE, name, key, int(time.time()) + expiry)

    def scenario() -> tuple[int, str]:
        with anonymous(hub) as conn:
            status = put_token(conn, token, audience)
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                conn.create_sender("events")
            return status

    code, description = await asyncio.to_thread(scenario)
    assert code == 401
    assert reason in description


async def test_a_new_password_gives_a_new_key(hub: EventServer) -> None:
    old = await key_of(hub, "alice")
    await hub.store.set_password("alice", "scrypt$changed")
    assert await key_of(hub, "alice") != old

    def scenario() -> int:
        with anonymous(hub) as conn:
            token = sign(AUDIENCE, "alice", old, int(time.time()) + 600)
            return put_token(conn, token, AUDIENCE)[0]

    assert await asyncio.to_thread(scenario) == 401


async def test_an_expired_token_closes_the_connection(hub: EventServer) -> None:
    key = await key_of(hub, "alice")

    def scenario() -> str:
        with anonymous(hub) as conn:
            token = sign(AUDIENCE, "alice", key, int(time.time()) + 2)
            assert put_token(conn, token, AUDIENCE)[0] == 200
            receiver = conn.create_receiver("events", credit=1)
            with pytest.raises(Exception) as closed:  # noqa: PT011 (proton's own types)
                receiver.receive(timeout=30)
            return str(closed.value)

    assert "token put to $cbs has expired" in await asyncio.to_thread(scenario)


async def test_a_connection_acts_as_one_user(hub: EventServer) -> None:
    alice_key, bob_key = await key_of(hub, "alice"), await key_of(hub, "bob")

    def scenario() -> tuple[int, str]:
        with anonymous(hub) as conn:
            expiry = int(time.time()) + 600
            assert put_token(conn, sign(AUDIENCE, "alice", alice_key, expiry), AUDIENCE)[0] == 200
            return put_token(conn, sign(AUDIENCE, "bob", bob_key, expiry), AUDIENCE)

    assert await asyncio.to_thread(scenario) == (403, "this connection acts as user alice already")


async def test_a_token_past_the_connection_limit_is_refused_with_503(
    start_server: ServerFactory,
) -> None:
    """A connection without a user holds a handshake slot only: it is let in at the limit,
    and a token that would make it one connection too many gets 503 (the client may put it
    again later)."""
    limits = AmqpLimits(max_connections=1)
    server = await start_server(amqp=AmqpConfig(port=0, sas_secret=SECRET, limits=limits))
    key = await key_of(server, "alice")
    token = sign(AUDIENCE, "alice", key, int(time.time()) + 600)

    def scenario() -> tuple[int, str]:
        with anonymous(server) as first, anonymous(server) as second:
            assert put_token(first, token, AUDIENCE) == (200, "OK")
            refused = put_token(second, token, AUDIENCE)
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                second.create_sender("events")
            first.create_sender("events").send(Message(subject="FIRST", body=1))
            return refused

    assert await asyncio.to_thread(scenario) == (503, "too many connections")
    assert (await server.store.read_rows(0, limit=10))[0][1:3] == ("FIRST", "1")
