"""Event data checked against its type's schema at every door that appends, each with its own
client: FTN18 (the Python FTN3 client), AMQP (python-qpid-proton, rhea, the Event Hubs SDK),
DCB over HTTP (httpx) and FTN3, the native API on SQLite and PostgreSQL; a new version on
every worker of a server and on another process of the database; soft deletes."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import httpx
import psycopg
import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.exceptions import EventDataSendError
from proton import Delivery, Message
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.sas import sas_key
from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.domain.schemas import EventDataInvalid
from futoin_evt.domain.stream import EventRejected
from futoin_evt.log.schemas import OPERATOR, Candidate, SchemaRegistry
from futoin_evt.log.streams import StreamRegistry
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store
from futoin_evt.storage import postgres as pg_native
from futoin_evt.storage.base import Store
from futoin_evt.storage.sqlite import native as sqlite_native

from .support.js import run_js
from .support.servers import USERS, ServerFactory, add_user
from .support.waiting import until

pytestmark = pytest.mark.functional

SUBJECT = "orders-ORDER_PLACED"
ALICE = ("alice", USERS["alice"])
SECRET = b"a test secret of more than thirty-two characters"
DCB_IFACE = "futoin.evt.dcb:1.0"
GEN_IFACE = "futoin.evt.gen:1.1"
#: Closed; ``total`` has a default, which a check never fills in.
V1: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order": {"type": "integer"},
        "total": {"type": "string", "default": "0.00"},
    },
    "required": ["order"],
    "additionalProperties": False,
}
#: V1 with an optional property (BACKWARD-compatible: the model is closed).
V2: dict[str, Any] = {**V1, "properties": {**V1["properties"], "note": {"type": "string"}}}
GOOD = {"order": 1}
BAD = {"order": "x"}
#: What every door says of BAD (the FTN18 type; DCB and AMQP name their own).
REFUSAL = "ORDER_PLACED event does not match version 1 of schema orders-ORDER_PLACED"
AT_ORDER = 'at /order: "x" is not of type "integer"'


async def register(schemas: SchemaRegistry, subject: str, schema: dict[str, Any]) -> int:
    return (await schemas.register(OPERATOR, subject, Candidate(json.dumps(schema)))).version


async def stored(store: Store, stream: str = "orders") -> list[tuple[str, Any]]:
    """(type, data) of every event of the stream's partition 0, in order."""
    info = await store.stream(stream)
    assert info is not None
    rows = await store.partition_log(info.partitions[0]).read_rows(0, limit=100)
    return [(row[1], json.loads(row[2])) for row in rows]


@pytest.fixture
def backend(request: pytest.FixtureRequest, db_path: Path) -> str:
    """The test's SQLite file, or (parametrized ``postgres``) an empty PostgreSQL database."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def typed(start_server: ServerFactory, backend: str) -> EventServer:
    """A server with AMQP; the stream orders (one partition) whose ORDER_PLACED has V1."""
    server = await start_server(db=backend, amqp=AmqpConfig(port=0, sas_secret=SECRET))
    await server.streams.add(OPERATOR, "orders", 1)
    assert await register(server.schemas, SUBJECT, V1) == 1
    return server


@pytest.fixture
async def orders(typed: EventServer) -> Any:
    async with await EventStreamClient.connect(
        typed.url + "orders", credentials=":".join(ALICE)
    ) as client:
        yield client


# -- FTN18 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_ftn18_add_event(typed: EventServer, orders: EventStreamClient) -> None:
    assert await orders.add_event("ORDER_PLACED", GOOD) == 1
    with pytest.raises(RemoteError) as refused:
        await orders.add_event("ORDER_PLACED", BAD)
    assert (refused.value.name, refused.value.desc) == ("InvalidRequest", f"{REFUSAL} {AT_ORDER}")
    with pytest.raises(RemoteError) as closed:
        await orders.add_event("ORDER_PLACED", {"order": 2, "extra": True})
    assert closed.value.desc.startswith(f"{REFUSAL} at /: Additional properties are not allowed")
    with pytest.raises(RemoteError) as missing:
        await orders.add_event("ORDER_PLACED", [])
    assert missing.value.desc == f'{REFUSAL} at /: [] is not of type "object"'
    assert await orders.add_event("ORDER_SHIPPED", BAD) == 2  # another type: unchecked
    async with await EventStreamClient.connect(typed.url, credentials=":".join(ALICE)) as events:
        assert await events.add_event("ORDER_PLACED", BAD) == 1  # another stream: unchecked
    # stored as sent: the schema's default is not filled in
    assert await stored(typed.store) == [("ORDER_PLACED", GOOD), ("ORDER_SHIPPED", BAD)]
    assert await stored(typed.store, "events") == [("ORDER_PLACED", BAD)]


async def test_a_refusal_says_no_more_than_a_missing_right(
    typed: EventServer, password_hashes: dict[str, str]
) -> None:
    """A user who may not write is refused for the right, whatever the data."""
    await typed.store.add_user("carol", password_hashes["bob"])
    user = await typed.store.get_user("carol")
    assert user is not None
    await typed.store.grant(user.id, "orders", 1)  # read only
    await typed.access.changed_here()
    async with await EventStreamClient.connect(
        typed.url + "orders", credentials=f"carol:{USERS['bob']}"
    ) as carol:
        with pytest.raises(RemoteError) as refused:
            await carol.add_event("ORDER_PLACED", BAD)
    assert refused.value.name == "SecurityError"
    assert "schema" not in refused.value.desc


# -- AMQP --------------------------------------------------------------------------------------


@contextmanager
def amqp(server: EventServer) -> Iterator[BlockingConnection]:
    conn = BlockingConnection(
        server.amqp_url or "", user="alice", password=USERS["alice"], allowed_mechs="PLAIN"
    )
    try:
        yield conn
    finally:
        conn.close()


def outcomes(server: EventServer, messages: list[Message]) -> list[tuple[int, Any, Any]]:
    """Each message sent as its own delivery, then the server's outcomes: (state, error
    condition, description)."""
    with amqp(server) as conn:
        link: Any = conn.create_sender("orders").link
        deliveries = [link.send(message) for message in messages]
        conn.wait(lambda: all(d.remote_state for d in deliveries))
        found = []
        for delivery in deliveries:
            condition = delivery.remote.condition
            found.append(
                (
                    delivery.remote_state,
                    condition and condition.name,
                    condition and condition.description,
                )
            )
        return found


async def test_amqp_with_proton(typed: EventServer) -> None:
    messages = [
        Message(subject="ORDER_PLACED", body=GOOD),
        Message(subject="ORDER_PLACED", body=BAD),
        # a JSON data section is checked as its JSON
        Message(
            subject="ORDER_PLACED",
            body=b'{"order": "y"}',
            inferred=True,
            content_type="application/json",
        ),
        Message(subject="ORDER_SHIPPED", body=BAD),
        Message(subject="ORDER_PLACED", body={"order": 2}),
    ]
    found = await asyncio.to_thread(outcomes, typed, messages)
    refused = (Delivery.REJECTED, "amqp:invalid-field", f"{REFUSAL} {AT_ORDER}")
    refused_y = (*refused[:2], f"{REFUSAL} {AT_ORDER.replace('x', 'y')}")
    assert found == [
        (Delivery.ACCEPTED, None, None),
        refused,
        refused_y,
        (Delivery.ACCEPTED, None, None),
        (Delivery.ACCEPTED, None, None),
    ]
    assert await stored(typed.store) == [
        ("ORDER_PLACED", GOOD),
        ("ORDER_SHIPPED", BAD),
        ("ORDER_PLACED", {"order": 2}),
    ]


async def test_amqp_with_rhea(js_peer: Path, typed: EventServer) -> None:
    assert typed.amqp is not None
    lines = await run_js(
        js_peer,
        "amqp_rhea_outcomes.js",
        {"port": typed.amqp.port, "user": "alice", "password": USERS["alice"],
         "address": "orders",
         "messages": [{"subject": "ORDER_PLACED", "body": GOOD},
                      {"subject": "ORDER_PLACED", "body": BAD},
                      {"subject": "ORDER_SHIPPED", "body": BAD}]},
    )  # fmt: skip
    assert lines == [
        {"state": "accepted"},
        {
            "state": "rejected",
            "condition": "amqp:invalid-field",
            "description": f"{REFUSAL} {AT_ORDER}",
        },
        {"state": "accepted"},
    ]
    assert await stored(typed.store) == [("ORDER_PLACED", GOOD), ("ORDER_SHIPPED", BAD)]


async def test_event_hubs_batches_are_one_delivery_all_or_none(typed: EventServer) -> None:
    """The SDK sends a batch as one delivery: one bad event rejects it, and none is stored;
    events without a subject are of the type EVENT."""
    assert await register(typed.schemas, "orders-EVENT", V1) == 1
    user = await typed.store.get_user("alice")
    assert user is not None
    assert typed.amqp is not None
    conn_str = (
        f"Endpoint=sb://127.0.0.1:{typed.amqp.port}/;SharedAccessKeyName=alice;"
        f"SharedAccessKey={sas_key(SECRET, user)};EntityPath=orders;UseDevelopmentEmulator=true"
    )

    def event(data: Any) -> EventData:
        sent = EventData(json.dumps(data))
        sent.content_type = "application/json"
        return sent

    def produce() -> str:
        with EventHubProducerClient.from_connection_string(conn_str, retry_total=0) as producer:
            batch = producer.create_batch()
            for data in (GOOD, BAD, {"order": 3}):
                batch.add(event(data))
            try:
                producer.send_batch(batch)
            except EventDataSendError as exc:
                refused = str(exc)
            else:
                raise AssertionError("the batch was accepted")
            good = producer.create_batch()
            good.add(event(GOOD))
            producer.send_batch(good)
            producer.send_event(event({"order": 4}))
            return refused

    refused = await asyncio.to_thread(produce)
    assert "Error condition: ErrorCondition.InvalidField" in refused  # amqp:invalid-field
    sentence = "event 2 of 3 (EVENT) does not match version 1 of schema orders-EVENT"
    assert f"{sentence} {AT_ORDER}" in refused
    assert await stored(typed.store) == [("EVENT", GOOD), ("EVENT", {"order": 4})]


# -- DCB ---------------------------------------------------------------------------------------


def dcb_event(data: Any, event_type: str = "ORDER_PLACED") -> dict[str, Any]:
    return {"type": event_type, "data": data, "tags": ["order"]}


async def test_dcb_over_http(typed: EventServer) -> None:
    base = typed.url.replace("ws", "http", 1) + "dcb/v1/streams/orders"
    async with httpx.AsyncClient(auth=ALICE, base_url=base, timeout=60) as http:
        one = await http.post("/append", json={"events": [dcb_event(GOOD)]})
        assert one.json() == {"position": 1}
        alone = await http.post("/append", json={"events": [dcb_event(BAD)]})
        assert alone.status_code == 400
        assert alone.json() == {"error": "InvalidRequest", "message": f"{REFUSAL} {AT_ORDER}."}
        batch = [dcb_event({"order": 2}), dcb_event(BAD), dcb_event({"order": 3})]
        refused = await http.post("/append", json={"events": batch})
        assert refused.status_code == 400
        assert refused.json()["message"] == (
            "event 2 of 3 (ORDER_PLACED) does not match version 1 of schema"
            f" orders-ORDER_PLACED {AT_ORDER}."
        )
        # opaque bytes are checked as what is stored: a JSON string of their base64
        as_bytes = {**dcb_event("eyJvcmRlciI6IDF9"), "bytes": True}
        opaque = await http.post("/append", json={"events": [as_bytes]})
        assert opaque.json()["message"] == (
            f'{REFUSAL} at /: "eyJvcmRlciI6IDF9" is not of type "object".'
        )
        other = await http.post("/append", json={"events": [dcb_event(BAD, "OrderShipped")]})
        assert other.json() == {"position": 2}
    assert await stored(typed.store) == [("ORDER_PLACED", GOOD), ("OrderShipped", BAD)]


async def test_dcb_over_ftn3(typed: EventServer, orders: EventStreamClient) -> None:
    call = orders.ftn3.call
    assert await call(DCB_IFACE, "append", {"events": [dcb_event(GOOD)]}) == 1
    batch = [dcb_event({"order": 2}), dcb_event({"order": 3}), dcb_event(BAD)]
    with pytest.raises(RemoteError) as refused:
        await call(DCB_IFACE, "append", {"events": batch})
    assert (refused.value.name, refused.value.desc) == (
        "InvalidRequest",
        f"event 3 of 3 (ORDER_PLACED) does not match version 1 of schema orders-ORDER_PLACED"
        f" {AT_ORDER}",
    )
    assert await call(DCB_IFACE, "append", {"events": [dcb_event(BAD, "OTHER")]}) == 2
    assert await stored(typed.store) == [("ORDER_PLACED", GOOD), ("OTHER", BAD)]


# -- versions and soft deletes -----------------------------------------------------------------


async def test_the_newest_live_version_is_enforced(
    typed: EventServer, orders: EventStreamClient
) -> None:
    """A new version at once; its soft delete falls back to the newest live one (Confluent's
    ``latest``); the subject's soft delete ends the check."""
    noted = {"order": 1, "note": "gift"}
    with pytest.raises(RemoteError) as by_v1:
        await orders.add_event("ORDER_PLACED", noted)
    assert "version 1 " in by_v1.value.desc
    assert await register(typed.schemas, SUBJECT, V2) == 2
    assert await orders.add_event("ORDER_PLACED", noted) == 1
    with pytest.raises(RemoteError) as by_v2:
        await orders.add_event("ORDER_PLACED", BAD)
    assert by_v2.value.desc == f"{REFUSAL.replace('version 1', 'version 2')} {AT_ORDER}"
    await typed.schemas.delete_version(OPERATOR, SUBJECT, 2)
    with pytest.raises(RemoteError) as again_v1:
        await orders.add_event("ORDER_PLACED", noted)
    assert "version 1 " in again_v1.value.desc
    await typed.schemas.delete_subject(OPERATOR, SUBJECT)
    assert await orders.add_event("ORDER_PLACED", BAD) == 2
    assert await stored(typed.store) == [("ORDER_PLACED", noted), ("ORDER_PLACED", BAD)]


async def test_aggregated_streams_copy_events_as_stored(
    start_server: ServerFactory,
) -> None:
    """An event stored before its type had a schema is copied into the aggregate unchecked,
    and the aggregate's own subject does not stop the copying."""
    server = await start_server()
    await server.streams.add(OPERATOR, "orders", 1)
    await server.streams.add(OPERATOR, "everything", 1, aggregate_of="orders")
    async with await EventStreamClient.connect(
        server.url + "orders", credentials=":".join(ALICE)
    ) as client:
        await client.add_event("ORDER_PLACED", BAD)
        await register(server.schemas, "everything-ORDER_PLACED", V1)
        await register(server.schemas, SUBJECT, V1)
        with pytest.raises(RemoteError):
            await client.add_event("ORDER_PLACED", BAD)
        await client.add_event("ORDER_PLACED", GOOD)

    async def copied() -> bool:
        return len(await stored(server.store, "everything")) == 2

    await until(copied, "both events copied")
    assert await stored(server.store, "everything") == [
        ("ORDER_PLACED", BAD),
        ("ORDER_PLACED", GOOD),
    ]


# -- the native API ----------------------------------------------------------------------------


async def registry_on(store: Store) -> tuple[StreamRegistry, SchemaRegistry]:
    streams = await StreamRegistry.open(store)
    schemas = SchemaRegistry(store, streams)
    await schemas.start()
    return streams, schemas


async def test_native_api_on_sqlite(db_path: Path) -> None:
    async with await open_store(db_path) as store:
        streams, schemas = await registry_on(store)
        try:
            await streams.add(OPERATOR, "orders", 1)
            await register(schemas, "events-ORDER_PLACED", V1)
            await register(schemas, SUBJECT, V2)  # another stream's subject

            with sqlite3.connect(db_path) as conn:
                assert sqlite_native.add_event(conn, "ORDER_PLACED", GOOD) == 1
                with pytest.raises(EventDataInvalid) as refused:
                    sqlite_native.add_event(conn, "ORDER_PLACED", BAD)
                sqlite_native.add_event(conn, "ORDER_SHIPPED", BAD)
            assert isinstance(refused.value, EventRejected)
            assert str(refused.value) == (
                f"ORDER_PLACED event does not match version 1 of schema events-ORDER_PLACED"
                f" {AT_ORDER}"
            )
            # read in the transaction: a version registered since is the one met
            await register(schemas, "events-ORDER_PLACED", V2)
            async with aiosqlite.connect(db_path) as conn:
                noted = {"order": 2, "note": "x"}
                assert await sqlite_native.add_event_async(conn, "ORDER_PLACED", noted) == 3
                with pytest.raises(EventDataInvalid) as by_v2:
                    await sqlite_native.add_event_async(conn, "ORDER_PLACED", BAD)
                await conn.commit()
            assert "version 2 of schema events-ORDER_PLACED" in str(by_v2.value)
            await schemas.delete_subject(OPERATOR, "events-ORDER_PLACED")
            with sqlite3.connect(db_path) as conn:
                sqlite_native.add_event(conn, "ORDER_PLACED", BAD)  # soft-deleted: unchecked
            assert await stored(store, "events") == [
                ("ORDER_PLACED", GOOD),
                ("ORDER_SHIPPED", BAD),
                ("ORDER_PLACED", {"order": 2, "note": "x"}),
                ("ORDER_PLACED", BAD),
            ]
        finally:
            await schemas.close()
            await streams.close()


async def test_native_api_on_postgres(pg_url: str) -> None:
    async with await open_store(pg_url) as store:
        streams, schemas = await registry_on(store)
        try:
            info = await streams.add(OPERATOR, "orders", 1)
            await register(schemas, SUBJECT, V1)
            orders = info.partitions[0]

            with psycopg.connect(pg_url) as conn:
                pg_native.add_event(conn, "ORDER_PLACED", GOOD, partition=orders)
                with pytest.raises(EventDataInvalid) as refused:
                    pg_native.add_event(conn, "ORDER_PLACED", BAD, partition=orders)
            assert str(refused.value) == f"{REFUSAL} {AT_ORDER}"
            with psycopg.connect(pg_url) as conn:
                pg_native.add_event(conn, "ORDER_SHIPPED", BAD, partition=orders)
                pg_native.add_event(conn, "ORDER_PLACED", BAD)  # events: another stream
            await register(schemas, SUBJECT, V2)
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                noted = {"order": 2, "note": "x"}
                await pg_native.add_event_async(conn, "ORDER_PLACED", noted, partition=orders)
                with pytest.raises(EventDataInvalid) as by_v2:
                    await pg_native.add_event_async(conn, "ORDER_PLACED", BAD, partition=orders)
            assert "version 2 of schema orders-ORDER_PLACED" in str(by_v2.value)
            await schemas.delete_subject(OPERATOR, SUBJECT)
            with psycopg.connect(pg_url) as conn:
                pg_native.add_event(conn, "ORDER_PLACED", BAD, partition=orders)
            assert await stored(store) == [
                ("ORDER_PLACED", GOOD),
                ("ORDER_SHIPPED", BAD),
                ("ORDER_PLACED", {"order": 2, "note": "x"}),
                ("ORDER_PLACED", BAD),
            ]
            assert await stored(store, "events") == [("ORDER_PLACED", BAD)]
        finally:
            await schemas.close()
            await streams.close()


# -- across workers and processes --------------------------------------------------------------


def registered(port: int, subject: str, schema: dict[str, Any]) -> int:
    """Register over HTTP, as a Confluent client does; the schema id."""
    answer = httpx.post(
        f"http://127.0.0.1:{port}/schemas/subjects/{subject}/versions",
        json={"schema": json.dumps(schema), "schemaType": "JSON"},
        auth=ALICE,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return int(answer.json()["id"])


def deleted(port: int, subject: str) -> None:
    answer = httpx.delete(f"http://127.0.0.1:{port}/schemas/subjects/{subject}", auth=ALICE)
    assert answer.status_code == 200, answer.text


async def add(client: FTN3Client, data: Any) -> str:
    """addEvent of ORDER_PLACED: the id, or the refusal's sentence."""
    try:
        return str(await client.call(GEN_IFACE, "addEvent", {"type": "ORDER_PLACED", "data": data}))
    except RemoteError as exc:
        return exc.desc


@pytest.mark.parametrize("store_db", ["sqlite", "postgres"], indirect=True)
async def test_every_worker_enforces_a_registration_once_it_returns(
    store_db: str, password_hashes: dict[str, str]
) -> None:
    from .support.workers import Group, connect_to

    async with await open_store(store_db) as store:
        await add_user(store, "alice", password_hashes["alice"], is_admin=True)
    group = Group(store_db, workers=2)
    try:
        clients = [await connect_to(group, slot) for slot in (0, 1)]
        subject = "events-ORDER_PLACED"
        sentence = f"ORDER_PLACED event does not match version 1 of schema {subject} {AT_ORDER}"
        for _round in range(3):  # whichever worker takes the registration
            await asyncio.to_thread(registered, group.port, subject, V1)
            assert [await add(client, BAD) for client in clients] == [sentence, sentence]
            await asyncio.to_thread(deleted, group.port, subject)
            assert [(await add(client, BAD)).isdigit() for client in clients] == [True, True]
            await asyncio.to_thread(
                httpx.delete,
                f"http://127.0.0.1:{group.port}/schemas/subjects/{subject}?permanent=true",
                auth=ALICE,
            )
        for client in clients:
            await client.close()
    finally:
        assert group.stop() == 0


@pytest.mark.parametrize("store_db", ["sqlite", "postgres"], indirect=True)
async def test_another_process_enforces_once_it_has_heard(
    start_server: ServerFactory, store_db: str
) -> None:
    """Another process on the database enforces a version, and stops for its soft delete,
    once it has heard of it: on PostgreSQL through the notification the registration's
    commit sends (milliseconds), on SQLite within the registry's poll."""
    here = await start_server(db=store_db, streams_poll_seconds=0.1)
    alice = await here.store.get_user("alice")
    assert alice is not None
    await here.store.grant(alice.id, "*", 7)  # read, write and manage
    await here.access.changed_here()
    there = await start_server(db=store_db, streams_poll_seconds=0.1)
    subject = "events-ORDER_PLACED"
    async with await EventStreamClient.connect(there.url, credentials=":".join(ALICE)) as client:
        await asyncio.to_thread(registered, here.port, subject, V1)
        await until(lambda: there.schemas.schema_of("events", "ORDER_PLACED") is not None, "heard")
        with pytest.raises(RemoteError) as refused:
            await client.add_event("ORDER_PLACED", BAD)
        assert (
            refused.value.desc
            == f"ORDER_PLACED event does not match version 1 of schema {subject} {AT_ORDER}"
        )
        await asyncio.to_thread(deleted, here.port, subject)
        await until(lambda: there.schemas.schema_of("events", "ORDER_PLACED") is None, "heard")
        assert await client.add_event("ORDER_PLACED", BAD) == 1
