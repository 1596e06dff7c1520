"""One log behind every door: events added through FTN18, AMQP, DCB and Kafka to one real
``futoin-evt serve`` with every door on read back through each door (poll, push, AMQP by
offset, the feed, DCB by position, notification, the console's event page, readEvents, Kafka
by offset), on SQLite and on PostgreSQL. Each door must show the same id, type, data and
time."""

from __future__ import annotations

import asyncio
import html
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPartition
from proton import Message, symbol

from futoin_evt.client.aio import OPS, EventStreamClient
from futoin_evt.client.notify import Notifications
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.storage import open_store

from .support.amqp import annotations_filter, connected, in_thread
from .support.console import console_login
from .support.push import Collector, running, stop
from .support.servers import ALICE, USERS, ServerProcess, add_user

pytestmark = pytest.mark.functional

#: What each door adds: (door, type, data). The data has what JSON text can get wrong:
#: escapes, text beyond ASCII, numbers of each kind, null, nesting, key order.
ADDED: list[tuple[str, str, Any]] = [
    ("ftn18", "ORDER_PLACED", {"order": 17, "total": "12.50", "note": 'Grüße ☃ "q" \\ /'}),
    ("amqp", "ORDER_PAID", {"z": 1, "a": [1, -2.5, None, True, False], "m": {"n": {}}}),
    ("dcb", "ORDER_SHIPPED", {"carrier": "DHL", "weight": 0.125, "parcels": [{"id": "p1"}]}),
    ("kafka", "ORDER_BILLED", {"invoice": "I-9", "lines": [{"sum": 1e-3}], "paid": None}),
]
WITHIN = 30.0


@dataclass(frozen=True)
class Seen:
    """An event as one door shows it: data as compact JSON text, time in whole seconds."""

    id: int
    type: str
    data: str
    time: datetime


def compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def from_text(text: str) -> datetime:
    """A door's UTC time, ``2026-11-22T02:44:05Z`` (fractions, if any, cut)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert moment.utcoffset() == timedelta(0), text
    return moment.astimezone(UTC).replace(microsecond=0)


@pytest.fixture
async def served(
    store_db: str, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> ServerProcess:
    """``futoin-evt serve`` with every door: FTN18 (and notification), the feed and DCB
    (on by default), AMQP and the console; alice may read and write."""
    async with await open_store(store_db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    processes.append(
        ServerProcess(store_db, 0, "--amqp", "127.0.0.1:0", "--kafka", "127.0.0.1:0", "--console")
    )
    return processes[-1]


def http_base(server: ServerProcess) -> str:
    return server.url.replace("ws", "http", 1).rstrip("/")


def send_over_amqp(url: str, event_type: str, data: Any) -> None:
    """One message, sent once the server accepted it (so it is stored)."""
    with connected(url) as conn:
        conn.create_sender("events").send(Message(subject=event_type, body=data))


async def add_through_each_door(server: ServerProcess) -> list[int]:
    """:data:`ADDED`, one door after the other; the ids the doors answered (AMQP answers
    none: its event comes between the two others)."""
    (_, ftn18_type, ftn18_data), (_, amqp_type, amqp_data), (_, dcb_type, dcb_data), kafka = ADDED
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        first = await client.add_event(ftn18_type, ftn18_data)
    assert server.amqp_url is not None
    await in_thread(send_over_amqp, server.amqp_url, amqp_type, amqp_data)
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=WITHIN) as http:
        reply = await http.post(
            f"{http_base(server)}/dcb/v1/append",
            json={"events": [{"type": dcb_type, "data": dcb_data, "tags": ["order:17"]}]},
        )
    assert reply.status_code == 200, reply.text
    dcb_id = int(reply.json()["position"])
    assert dcb_id == first + 2
    assert server.kafka_address is not None
    kafka_id = await in_thread(produce_over_kafka, server.kafka_address, kafka[1], kafka[2])
    assert kafka_id == dcb_id + 1
    return [first, first + 1, dcb_id, kafka_id]


def _kafka_conf(address: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": address,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": USERS["alice"],
    }


def produce_over_kafka(address: str, event_type: str, data: Any) -> int:
    """One JSON record with its type header; its offset (once stored)."""
    producer = KafkaProducer(**_kafka_conf(address))
    try:
        headers = [("ce_type", event_type.encode()), ("content-type", b"application/json")]
        sent = producer.send("events", value=compact(data).encode(), headers=headers)
        return int(sent.get(WITHIN).offset)
    finally:
        producer.close()


def consumed_over_kafka(address: str, ids: list[int]) -> list[Seen]:
    """The records at the events' offsets, with their type header and log-append time."""
    consumer = KafkaConsumer(**_kafka_conf(address), consumer_timeout_ms=int(WITHIN * 1000))
    try:
        where = KafkaPartition("events", 0)
        consumer.assign([where])
        consumer.seek(where, ids[0])
        seen = []
        for record in consumer:
            headers = dict(record.headers)
            moment = datetime.fromtimestamp(record.timestamp / 1000, UTC)
            event_type = headers["ce_type"].decode()
            seen.append(Seen(record.offset, event_type, compact(json.loads(record.value)), moment))
            if record.offset == ids[-1]:
                break
        return seen
    finally:
        consumer.close()


async def read_events(client: EventStreamClient) -> list[Seen]:
    """``readEvents`` with each event's data as the server keeps it (JSON text)."""
    await client.register_consumer("RANGE")
    params = {"component": "RANGE", "after_id": "0", "data_as_text": True}
    raw = await client.ftn3.call(OPS, "readEvents", params)
    return [Seen(int(e["id"]), e["type"], e["data"], from_text(e["ts"])) for e in raw]


async def polled(client: EventStreamClient) -> list[Seen]:
    await client.register_consumer("POLLED")
    events = await client.poll_events("POLLED")
    return [Seen(e.id, e.type, compact(e.data), from_text(e.ts)) for e in events]


async def pushed(server: ServerProcess, last_id: int) -> list[Seen]:
    collector = Collector()
    receiver = ReliableReceiver(
        server.url, credentials=ALICE, component="PUSHED", on_events=collector
    )
    task = await running(receiver)
    await collector.wait_for(last_id)
    await stop(receiver, task)
    return [Seen(e.id, e.type, compact(e.data), from_text(e.ts)) for e in collector.events]


def received_by_offset(url: str, ids: list[int]) -> list[Seen]:
    """Each event from a link that starts at its offset (the one before it, as a 20-digit
    string); its id, offset and sequence number must agree."""
    seen = []
    with connected(url) as conn:
        for event_id in ids:
            start = annotations_filter(offset=symbol(f"{event_id - 1:020d}"))
            receiver = conn.create_receiver(
                "events", credit=1, name=f"from-{event_id - 1}", options=start
            )
            message = receiver.receive(timeout=WITHIN)
            receiver.accept()
            delivery = {str(k): v for k, v in (message.instructions or {}).items()}
            annotations = {str(k): v for k, v in (message.annotations or {}).items()}
            assert delivery["event-streams-offset"] == f"{event_id:020d}"
            assert annotations["x-opt-offset"] == f"{event_id:020d}"
            assert annotations["x-opt-sequence-number"] == event_id
            added_ms = delivery["event-streams-timestamp"]
            assert annotations["x-opt-enqueued-time"] == added_ms
            assert added_ms % 1000 == 0  # whole seconds
            body = message.body
            if isinstance(body, memoryview | bytes):  # JSON that came as a payload goes so
                assert message.content_type == "application/json"
                body = json.loads(bytes(body))
            seen.append(
                Seen(
                    event_id,
                    str(message.subject),
                    compact(body),
                    datetime.fromtimestamp(added_ms // 1000, UTC),
                )
            )
    return seen


async def from_feed(http: httpx.AsyncClient, server: ServerProcess) -> list[Seen]:
    url = f"{http_base(server)}/feed"
    token = (await http.get(url)).json()["token"]
    params = {"token": token, "partition": "0", "cursor": "_first"}
    reply = await http.get(url + "/events", params=params)
    assert reply.status_code == 200, reply.text
    lines = [json.loads(line) for line in reply.text.splitlines()]
    events = [line["data"] for line in lines if "data" in line]
    return [Seen(int(e["id"]), e["type"], compact(e["data"]), from_text(e["ts"])) for e in events]


async def by_position(http: httpx.AsyncClient, server: ServerProcess, ids: list[int]) -> list[Seen]:
    seen = []
    for position in ids:
        reply = await http.post(
            f"{http_base(server)}/dcb/v1/read", json={"after": position - 1, "limit": 1}
        )
        assert reply.status_code == 200, reply.text
        (event,) = reply.json()["events"]
        assert event["position"] == position
        seen.append(Seen(position, event["type"], compact(event["data"]), from_text(event["ts"])))
    return seen


async def notified(client: EventStreamClient, count: int) -> list[Seen]:
    subscription = await Notifications(client.ftn3).subscribe(after=0)
    seen = []
    for _ in range(count):
        async with asyncio.timeout(WITHIN):
            message = await subscription.get()
        attributes = message["properties"]
        assert attributes["eventType"] == message["subject"]
        assert (attributes["stream"], attributes["partition"]) == ("events", 0)
        seen.append(
            Seen(
                int(attributes["id"]),
                message["subject"],
                compact(message["body"]),
                from_text(attributes["ts"]),
            )
        )
    return seen


def fact(page: str, name: str) -> str:
    found = re.search(rf'<dd class="{name}">([^<]*)</dd>', page)
    assert found is not None, name
    return html.unescape(found.group(1))


async def on_console(server: ServerProcess, ids: list[int]) -> list[Seen]:
    """Each event's page, as alice logged in to the console."""
    base = f"{http_base(server)}/console/"
    seen = []
    async with httpx.AsyncClient(base_url=base, timeout=WITHIN) as http:
        assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
        for event_id in ids:
            reply = await http.get("event", params={"stream": "events", "id": str(event_id)})
            assert reply.status_code == 200, reply.text
            data = re.search(r'<pre class="json" id="data">([^<]*)</pre>', reply.text)
            assert data is not None
            seen.append(
                Seen(
                    int(fact(reply.text, "id")),
                    fact(reply.text, "type"),
                    compact(json.loads(html.unescape(data.group(1)))),
                    from_text(fact(reply.text, "ts")),
                )
            )
    return seen


async def test_an_event_added_at_any_door_reads_the_same_at_every_door(
    served: ServerProcess,
) -> None:
    ids = await add_through_each_door(served)
    async with await EventStreamClient.connect(served.url, credentials=ALICE) as client:
        kept = await read_events(client)
        # the log keeps what each door was given, as compact JSON text
        assert [(e.id, e.type, e.data) for e in kept] == [
            (event_id, event_type, compact(data))
            for event_id, (_door, event_type, data) in zip(ids, ADDED, strict=True)
        ]
        doors = {
            "poll": await polled(client),
            "push": await pushed(served, ids[-1]),
            "notification": await notified(client, len(ids)),
        }
    assert served.amqp_url is not None
    doors["amqp"] = await in_thread(received_by_offset, served.amqp_url, ids)
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=WITHIN) as http:
        doors["feed"] = await from_feed(http, served)
        doors["dcb"] = await by_position(http, served, ids)
    doors["console"] = await on_console(served, ids)
    assert served.kafka_address is not None
    doors["kafka"] = await in_thread(consumed_over_kafka, served.kafka_address, ids)
    for door, seen in doors.items():
        assert seen == kept, door
