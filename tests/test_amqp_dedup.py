"""Idempotent producers at the AMQP door: the application property ``futoin-evt-key`` is
the producer's key of an event (python-qpid-proton, rhea and the Event Hubs SDK, over real
sockets, on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from proton import Delivery, Message
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.amqp.codec import KEY_PROPERTY
from futoin_evt.server.app import EventServer

from .support.amqp import connected, send_outcome
from .support.eventhubs import SECRET, connection_string, key_of
from .support.js import run_js
from .support.servers import USERS, ServerFactory
from .support.sql import stored

pytestmark = pytest.mark.functional


@pytest.fixture
async def keyed_amqp(start_server: ServerFactory, store_db: str) -> EventServer:
    return await start_server(db=store_db, amqp=AmqpConfig(port=0, sas_secret=SECRET))


def keyed(n: int, key: Any, **fields: Any) -> Message:
    return Message(subject="T", body={"n": n}, properties={KEY_PROPERTY: key}, **fields)


async def test_a_message_sent_again_with_its_key_is_stored_once(
    keyed_amqp: EventServer, store_db: str
) -> None:
    """A producer that lost its connection before the outcomes came sends everything again
    on a new one: each keyed message is accepted again and stored once; a message without
    a key is stored each time."""
    url = keyed_amqp.amqp_url or ""

    def lose_outcomes() -> None:
        conn = BlockingConnection(
            url, user="alice", password=USERS["alice"], allowed_mechs="PLAIN", timeout=30
        )
        sender = conn.create_sender("events")
        for n in range(200):
            sender.link.send(keyed(n, f"order-{n}"))  # unsettled, outcome not waited for
        conn.close()  # the outcomes are lost (whatever the server did)

    def send_again() -> list[tuple[int, str | None]]:
        with connected(url) as conn:
            sender = conn.create_sender("events")
            outcomes = [send_outcome(sender, keyed(n, f"order-{n}")) for n in range(200)]
            outcomes.append(send_outcome(sender, Message(subject="T", body={"n": "plain"})))
            outcomes.append(send_outcome(sender, Message(subject="T", body={"n": "plain"})))
            return outcomes

    await asyncio.to_thread(lose_outcomes)
    outcomes = await asyncio.to_thread(send_again)
    assert outcomes == [(Delivery.ACCEPTED, None)] * 202
    data = [event["n"] for _id, event in stored(store_db)]
    assert sorted(n for n in data if n != "plain") == list(range(200))
    assert data.count("plain") == 2


@pytest.mark.parametrize("key", ["a b", "", "x" * 65, 17])
async def test_a_bad_key_rejects_the_message_and_stores_nothing(
    keyed_amqp: EventServer, store_db: str, key: Any
) -> None:
    def send() -> tuple[tuple[int, str | None], tuple[int, str | None]]:
        with connected(keyed_amqp.amqp_url or "") as conn:
            sender = conn.create_sender("events")
            return send_outcome(sender, keyed(1, key)), send_outcome(sender, keyed(2, "ok"))

    refused, accepted = await asyncio.to_thread(send)
    assert refused == (Delivery.REJECTED, "amqp:invalid-field")
    assert accepted == (Delivery.ACCEPTED, None)
    assert [event for _id, event in stored(store_db)] == [{"n": 2}]


async def test_rhea_sends_each_keyed_message_twice_and_it_is_stored_once(
    js_peer: Path, keyed_amqp: EventServer, store_db: str
) -> None:
    assert keyed_amqp.amqp is not None
    scenario = {"port": keyed_amqp.amqp.port, "user": "alice", "password": USERS["alice"]}
    lines = await run_js(js_peer, "amqp_rhea_keys.js", {**scenario, "count": 300})
    assert lines == [{"accepted": 600}]
    assert sorted(event["n"] for _id, event in stored(store_db)) == list(range(300))


async def test_the_event_hubs_sdk_sends_keyed_batches_again(
    keyed_amqp: EventServer, store_db: str
) -> None:
    """A batch (one message of Event Hubs' batch format) sent again stores only its events
    whose keys are new; within a batch a key that repeats is stored once."""
    conn_str = connection_string(keyed_amqp, "alice", await key_of(keyed_amqp, "alice"))

    def send(keys: list[str]) -> None:
        with EventHubProducerClient.from_connection_string(conn_str) as producer:
            batch = producer.create_batch(partition_id="0")
            for key in keys:
                event = EventData(json.dumps({"key": key}))
                event.content_type = "application/json"
                event.properties = {KEY_PROPERTY: key}
                batch.add(event)
            producer.send_batch(batch)

    await asyncio.to_thread(send, ["a", "b", "a", "c"])
    await asyncio.to_thread(send, ["a", "b", "c", "d"])
    assert [event["key"] for _id, event in stored(store_db)] == ["a", "b", "c", "d"]
