"""The schema registry under ``/schemas``: Confluent's own client (``confluent-kafka``),
unchanged, and plain HTTP, against a real server on SQLite and PostgreSQL; rights; two
servers on one database; ``serve --workers 2``."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.client.notify import Notifications
from futoin_evt.domain.notification import BASE_ATTRIBUTES
from futoin_evt.domain.rights import Right
from futoin_evt.domain.schemas import Compatibility
from futoin_evt.log.schemas import OPERATOR, Candidate, SchemaRegistry
from futoin_evt.log.streams import StreamRegistry
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION
from futoin_evt.storage.sql.schemas import SCHEMAS_VERSION
from futoin_evt.storage.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS

from .support import waiting
from .support.cli import run
from .support.console import console_login
from .support.schemas import V1, basic
from .support.servers import USERS, ServerFactory, add_user
from .support.sql import execute_sql, pg_schema_at

SUBJECT = "orders-ORDER_PLACED"
ALICE = f"alice:{USERS['alice']}"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: V1 with an optional property: BACKWARD-compatible (the model is closed).
V2: dict[str, Any] = {**V1, "properties": {**V1["properties"], "note": {"type": "string"}}}
#: V2 with a new required property: breaks BACKWARD.
V3: dict[str, Any] = {**V2, "required": ["order", "note"]}
WITHIN_SECONDS = 30.0

#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=WITHIN_SECONDS)


def json_schema(document: dict[str, Any]) -> Schema:
    return Schema(json.dumps(document), "JSON")


async def setup(server: EventServer, password_hashes: dict[str, str]) -> None:
    """Streams orders and payroll; alice manages orders* (and reads and writes every
    stream, as bob does); dave has no right."""
    await server.streams.add(OPERATOR, "orders", 2)
    await server.streams.add(OPERATOR, "payroll", 1)
    alice = await server.store.get_user("alice")
    assert alice is not None
    await server.store.grant(alice.id, "orders*", int(Right.MANAGE))
    if await server.store.get_user("dave") is None:
        await server.store.add_user("dave", password_hashes["bob"])
    await server.access.changed_here()


@pytest.fixture
async def registry(
    start_server: ServerFactory, store_db: str, password_hashes: dict[str, str]
) -> EventServer:
    server = await start_server(db=store_db)
    await setup(server, password_hashes)
    return server


def client(server: EventServer, user: str = "alice") -> SchemaRegistryClient:
    assert server.schemas_url is not None
    return SchemaRegistryClient(
        {
            "url": server.schemas_url,
            "basic.auth.user.info": f"{user}:{USERS.get(user, USERS['bob'])}",
            "max.retries": 0,
        }
    )


def refusal(call: Callable[[], Any]) -> tuple[int, int, str]:
    with pytest.raises(SchemaRegistryError) as refused:
        call()
    error = refused.value
    return error.http_status_code, error.error_code, error.error_message


async def test_confluent_client_registers_reads_tests_and_evolves(registry: EventServer) -> None:
    def work() -> None:
        with client(registry) as sr:
            run_evolution(sr)

    await asyncio.to_thread(work)
    typed = registry.schemas.schema_of("orders", "ORDER_PAID")
    assert typed is not None
    assert typed.violation({"order": 1}) is None
    assert registry.schemas.schema_of("orders", "ORDER_PLACED") is None


def run_evolution(sr: SchemaRegistryClient) -> None:
    first = sr.register_schema(SUBJECT, json_schema(V1))
    assert sr.register_schema(SUBJECT, json_schema(V1)) == first  # no second version
    latest = sr.get_latest_version(SUBJECT)
    assert (latest.version, latest.schema_id, latest.subject) == (1, first, SUBJECT)
    assert latest.schema.schema_type == "JSON"
    assert json.loads(str(latest.schema.schema_str)) == V1
    assert json.loads(str(sr.get_schema(first).schema_str)) == V1
    assert sr.lookup_schema(SUBJECT, json_schema(V1)).version == 1
    assert sr.get_subjects() == [SUBJECT]
    assert sr.get_compatibility() == "BACKWARD"

    assert sr.test_compatibility(SUBJECT, json_schema(V2)) is True
    assert sr.test_compatibility(SUBJECT, json_schema(V3)) is False
    second = sr.register_schema(SUBJECT, json_schema(V2))
    assert second != first
    status, code, message = refusal(lambda: sr.register_schema(SUBJECT, json_schema(V3)))
    assert (status, code) == (409, 409)
    assert 'required property "note" added' in message
    assert sr.get_versions(SUBJECT) == [1, 2]

    sr.set_compatibility(SUBJECT, "NONE")
    assert sr.get_compatibility(SUBJECT) == "NONE"
    assert sr.register_schema(SUBJECT, json_schema(V3)) not in (first, second)
    # the same text for another type of the stream: the same id
    assert sr.register_schema("orders-ORDER_PAID", json_schema(V1)) == first

    assert sr.delete_version(SUBJECT, 3) == 3
    assert sr.get_versions(SUBJECT) == [1, 2]
    assert sr.get_latest_version("orders-ORDER_PAID").schema_id == first
    assert refusal(lambda: sr.get_version(SUBJECT, 3))[:2] == (404, 40402)
    assert sr.delete_subject(SUBJECT) == [1, 2]
    assert sr.get_subjects() == ["orders-ORDER_PAID"]
    assert set(sr.get_subjects(deleted=True)) == {SUBJECT, "orders-ORDER_PAID"}
    assert refusal(lambda: sr.delete_subject(SUBJECT))[:2] == (404, 40404)
    assert sr.delete_subject(SUBJECT, permanent=True) == [1, 2, 3]
    assert sr.get_subjects(deleted=True) == ["orders-ORDER_PAID"]


async def test_json_serializer_and_deserializer_round_trip(registry: EventServer) -> None:
    """Confluent's JSON serde registers the schema under TOPIC-TITLE (the topic is the
    stream, the schema's title the event type), checks data against it and reads it back."""

    def work() -> None:
        with client(registry) as sr:
            round_trip(sr)

    await asyncio.to_thread(work)


def round_trip(sr: SchemaRegistryClient) -> None:
    serializer = JSONSerializer(
        json.dumps(V1), sr, conf={"subject.name.strategy": topic_record_subject_name_strategy}
    )
    context = SerializationContext("orders", MessageField.VALUE)
    payload = serializer({"order": 17, "total": "12.50"}, context)
    assert payload is not None
    assert JSONDeserializer(None, schema_registry_client=sr)(payload, context) == {
        "order": 17,
        "total": "12.50",
    }
    with pytest.raises(SerializationError, match="is not of type 'integer'"):
        serializer({"order": "seventeen"}, context)
    assert sr.get_subjects() == [SUBJECT]


async def test_refusals_in_confluent_shape(registry: EventServer) -> None:
    assert registry.schemas_url is not None
    async with httpx.AsyncClient(base_url=registry.schemas_url) as http:
        answer = await http.get("/subjects")
        assert answer.status_code == 401
        assert answer.json()["error_code"] == 40101
        assert answer.headers["WWW-Authenticate"].startswith("Basic ")
        wrong = await http.get("/subjects", headers=basic("alice", "wrong"))
        assert (wrong.status_code, wrong.json()["error_code"]) == (401, 40101)
        alice = basic("alice")
        body = {"schema": json.dumps(V1), "schemaType": "JSON"}
        cases: list[tuple[str, str, Any, int, int, str]] = [
            ("POST", "/subjects/Orders/versions", body, 422, 42208, "STREAM-TYPE"),
            ("POST", "/subjects/ghost-T/versions", body, 404, 40401, "no stream ghost"),
            ("GET", "/subjects/orders-T/versions/x", None, 422, 42202, "not a valid version"),
            ("GET", f"/subjects/{SUBJECT}/versions", None, 404, 40401, SUBJECT),
            ("PUT", f"/config/{SUBJECT}", {"compatibility": "SIDEWAYS"}, 422, 42203, "SIDEWAYS"),
            ("GET", f"/config/{SUBJECT}", None, 404, 40408, "subject-level compatibility"),
            (
                "POST",
                f"/subjects/{SUBJECT}/versions",
                {"schema": "{", "schemaType": "JSON"},
                422,
                42201,
                "not JSON",
            ),
            ("POST", f"/subjects/{SUBJECT}/versions", {"schema": "{}"}, 422, 42201, "AVRO"),
            ("POST", f"/subjects/{SUBJECT}/versions", [1], 422, 42201, "JSON object"),
            ("GET", "/schemas/ids/999", None, 404, 40403, "999"),
            ("GET", "/nowhere", None, 404, 404, "Not Found"),
        ]
        for method, path, sent, status, code, said in cases:
            answer = await http.request(method, path, json=sent, headers=alice)
            assert answer.status_code == status, (path, answer.text)
            assert answer.headers["Content-Type"] == CONTENT_TYPE
            assert answer.json()["error_code"] == code, (path, answer.text)
            assert said in answer.json()["message"], (path, answer.text)
        garbled = await http.post(f"/subjects/{SUBJECT}/versions", content=b"{", headers=alice)
        assert garbled.status_code == 400
        # nothing of the refused requests was kept
        assert (await http.get("/subjects?deleted=true", headers=alice)).json() == []
        kept = await http.post(f"/subjects/{SUBJECT}/versions", json=body, headers=alice)
        assert kept.status_code == 200
        assert kept.json()["id"] >= 1
        assert (await http.get("/schemas/types", headers=alice)).json() == ["JSON"]
        schema = await http.get(f"/subjects/{SUBJECT}/versions/latest/schema", headers=alice)
        assert schema.json() == V1


async def test_rights_decide_and_refusals_tell_no_more(registry: EventServer) -> None:
    """Registering needs manage on the stream, reading needs read; a user without any right
    on a stream learns nothing of its subjects, whether the stream exists or not."""
    assert registry.schemas_url is not None
    body = {"schema": json.dumps(V1), "schemaType": "JSON"}
    async with httpx.AsyncClient(base_url=registry.schemas_url) as http:
        alice, bob, dave = basic("alice"), basic("bob"), basic("dave", USERS["bob"])
        for subject in (SUBJECT, "payroll-SALARY"):
            if subject == SUBJECT:
                answer = await http.post(f"/subjects/{subject}/versions", json=body, headers=alice)
            else:  # alice may not manage payroll: an admin registers it
                await registry.schemas.register(OPERATOR, subject, Candidate(json.dumps(V1)))
                answer = await http.post(f"/subjects/{subject}/versions", json=body, headers=alice)
                assert answer.status_code == 403
                assert answer.json() == {
                    "error_code": 40301,
                    "message": "The manage right on stream payroll is needed.",
                }
                continue
            assert answer.status_code == 200, answer.text
        # bob reads and writes every stream, manages none
        refused = await http.post(f"/subjects/{SUBJECT}/versions", json=body, headers=bob)
        assert (refused.status_code, refused.json()["error_code"]) == (403, 40301)
        assert (await http.get("/subjects", headers=bob)).json() == [SUBJECT, "payroll-SALARY"]
        assert (await http.get(f"/subjects/{SUBJECT}/versions", headers=bob)).json() == [1]
        changed = await http.put(f"/config/{SUBJECT}", json={"compatibility": "NONE"}, headers=bob)
        assert changed.status_code == 403
        # alice manages orders* only: not the global level
        refused = await http.put("/config", json={"compatibility": "NONE"}, headers=alice)
        assert refused.json()["message"] == "The manage right on stream * is needed."
        # dave holds no right: an existing stream and a missing one answer alike
        assert (await http.get("/subjects", headers=dave)).json() == []
        for subject in (SUBJECT, "ghost-ORDER_PLACED"):
            answer = await http.get(f"/subjects/{subject}/versions", headers=dave)
            stream = subject.rsplit("-", 1)[0]
            assert answer.json() == {
                "error_code": 40301,
                "message": f"The read right on stream {stream} is needed.",
            }
        schema_id = (await http.get(f"/subjects/{SUBJECT}/versions/1", headers=alice)).json()["id"]
        hidden = await http.get(f"/schemas/ids/{schema_id}", headers=dave)
        assert (hidden.status_code, hidden.json()["error_code"]) == (404, 40403)
        shown = await http.get(f"/schemas/ids/{schema_id}/subjects", headers=bob)
        assert shown.json() == [SUBJECT]


async def test_get_events_lists_a_typed_events_properties_from_its_schema(
    registry: EventServer,
) -> None:
    """Before any event of the type, GET-EVENTS (notification, FTN3) names the properties
    its schema gives a scalar type; an event's other scalar properties are added as seen."""
    schema = {
        **V1,
        "additionalProperties": True,
        "properties": {**V1["properties"], "items": {"type": "array"}, "paid": {}},
    }
    await registry.schemas.register(OPERATOR, SUBJECT, Candidate(json.dumps(schema)))
    async with await EventStreamClient.connect(registry.url, credentials=ALICE) as alice:
        notifications = Notifications(alice.ftn3)
        listed = await notifications.event_types("ORDER_PLACED", stream="orders")
        assert listed == {"ORDER_PLACED": [*BASE_ATTRIBUTES, "order", "total", "paid"]}
        assert "ORDER_PLACED" not in await notifications.event_types()  # of events only
        orders = await EventStreamClient.connect(f"{registry.url}orders/0", credentials=ALICE)
        async with orders:
            await orders.add_event("ORDER_PLACED", {"order": 1, "total": "1.00", "coupon": "X"})
        listed = await notifications.event_types("ORDER_PLACED", stream="orders")
        assert listed["ORDER_PLACED"][-1] == "coupon"


async def test_a_dropped_stream_takes_its_subjects(registry: EventServer) -> None:
    await registry.schemas.register(OPERATOR, SUBJECT, Candidate(json.dumps(V1)))
    await registry.schemas.set_level(OPERATOR, SUBJECT, Compatibility.NONE)
    assert await registry.streams.drop(OPERATOR, "orders")
    await registry.streams.add(OPERATOR, "orders", 1)
    assert await registry.schemas.subjects(OPERATOR, deleted=True) == []
    assert await registry.store.schema_levels() == {}
    assert registry.schemas.schema_of("orders", "ORDER_PLACED") is None


async def test_every_process_on_the_database_follows_the_newest_schema(
    start_server: ServerFactory, store_db: str, password_hashes: dict[str, str]
) -> None:
    """What enforcement reads (``schema_of``) follows a registration made by another
    process on the same database, and its deletion: on PostgreSQL through the notification,
    on SQLite within the registry's poll."""
    here = await start_server(db=store_db, streams_poll_seconds=0.1)
    await setup(here, password_hashes)
    there = await start_server(db=store_db, streams_poll_seconds=0.1)
    await until(lambda: there.streams.get("orders") is not None, "the stream known there")

    def register() -> int:
        with client(here) as sr:
            return int(sr.register_schema(SUBJECT, json_schema(V1)))

    def delete() -> None:
        with client(here) as sr:
            sr.delete_subject(SUBJECT)

    schema_id = await asyncio.to_thread(register)
    await until(lambda: there.schemas.schema_of("orders", "ORDER_PLACED") is not None, "v1 there")
    typed = there.schemas.schema_of("orders", "ORDER_PLACED")
    assert typed is not None
    assert (typed.version, typed.schema_id) == (1, schema_id)
    violation = typed.violation({"order": "x"})
    assert violation is not None
    assert violation.pointer == "/order"
    # GET-EVENTS there lists the type's properties from the schema it reloaded
    listed = await there.live_streams.event_types("orders", "ORDER_PLACED")
    assert listed == {"ORDER_PLACED": [*BASE_ATTRIBUTES, "order", "total"]}
    await asyncio.to_thread(delete)
    await until(lambda: there.schemas.schema_of("orders", "ORDER_PLACED") is None, "gone there")


# -- serve --workers 2 ---------------------------------------------------------------------------

#: A WebSocket handshake, sent after a request on the same connection to learn which worker
#: took it (the worker logs each WebSocket it opens, with the peer's port).
UPGRADE = (
    "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def answered(group: Any, method: str, target: str, body: Any = None) -> tuple[int, Any]:
    """(the worker that answered, its JSON answer) of one registry request on a new
    connection, which is then upgraded: the worker that logs the upgrade answered."""
    sent = json.dumps(body).encode() if body is not None else b""
    auth = basic("alice")["Authorization"]
    reader, writer = await asyncio.open_connection("127.0.0.1", group.port)
    try:
        writer.write(
            f"{method} /schemas{target} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
            f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(sent)}\r\n\r\n".encode()
            + sent
        )
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = int(head.lower().split("content-length: ")[1].split("\r\n")[0])
        answer = await reader.readexactly(length)
        assert head.startswith("HTTP/1.1 200 "), head + answer.decode()
        writer.write(UPGRADE.encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
        worker = await group.worker_at(writer.get_extra_info("sockname")[1])
    finally:
        writer.close()
    return worker, json.loads(answer)


@pytest.mark.functional
@pytest.mark.parametrize("store_db", ["sqlite", "postgres"], indirect=True)
async def test_registered_on_one_worker_read_on_the_other(
    store_db: str, password_hashes: dict[str, str]
) -> None:
    from .support.workers import Group

    async with await open_store(store_db) as store:
        await add_user(store, "alice", password_hashes["alice"], is_admin=True)
        await store.add_stream("orders", 1)
    group = Group(store_db, workers=2)
    try:
        body = {"schema": json.dumps(V1), "schemaType": "JSON"}
        worker, registered = await answered(group, "POST", f"/subjects/{SUBJECT}/versions", body)
        for _ in range(200):
            other, latest = await answered(group, "GET", f"/subjects/{SUBJECT}/versions/latest")
            if other != worker:
                break
        assert other != worker, "no request reached the other worker"
        assert (latest["id"], latest["version"]) == (registered["id"], 1)
        assert json.loads(latest["schema"]) == V1
    finally:
        assert group.stop() == 0


# -- futoin-evt schema ---------------------------------------------------------------------------


def files(tmp_path: Path) -> tuple[str, str, str]:
    """Files of V1, V2 (compatible) and V3 (breaks BACKWARD)."""
    paths = []
    for name, document in (("v1", V1), ("v2", V2), ("v3", V3)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document, indent=2))
        paths.append(str(path))
    return paths[0], paths[1], paths[2]


@pytest.mark.parametrize("store_db", ["sqlite", "postgres"], indirect=True)
async def test_schema_commands_on_the_database(store_db: str, tmp_path: Path) -> None:
    async with await open_store(store_db) as store:
        await store.add_stream("orders", 1)
    v1, v2, v3 = files(tmp_path)
    db = ("--db", store_db)
    added = run("schema", "add", "orders", "ORDER_PLACED", v1, *db)
    assert (added.returncode, added.stdout) == (0, f"{SUBJECT}: version 1, schema id 1\n")
    assert run("schema", "add", "orders", "ORDER_PLACED", v1, *db).stdout == added.stdout
    checked = run("schema", "check", "orders", "ORDER_PLACED", v3, *db)
    assert checked.returncode == 1
    assert 'required property "note" added' in checked.stderr
    refused = run("schema", "add", "orders", "ORDER_PLACED", v3, *db)
    assert refused.returncode == 1
    assert "incompatible with version 1 (BACKWARD)" in refused.stderr
    assert (
        run("schema", "check", "orders", "ORDER_PLACED", v2, *db).stdout
        == f"{SUBJECT}: compatible\n"
    )
    assert run("schema", "add", "orders", "ORDER_PLACED", v2, *db).returncode == 0
    listed = run("schema", "list", "orders", "--json", *db)
    assert [(v["subject"], v["version"]) for v in json.loads(listed.stdout)] == [(SUBJECT, 2)]
    shown = json.loads(
        run("schema", "show", "orders", "ORDER_PLACED", "--version", "1", "--json", *db).stdout
    )
    assert json.loads(shown["schema"]) == V1
    for bad, status, said in (
        (("orders", "bad-type", v1), 2, "Invalid subject"),
        (("ghost", "T", v1), 1, "no stream ghost"),
        (("orders", "T", str(tmp_path / "missing.json")), 2, "cannot read"),
    ):
        answer = run("schema", "add", *bad, *db)
        assert (answer.returncode, said in answer.stderr) == (status, True), answer.stderr


async def test_schema_commands_on_a_server(registry: EventServer, tmp_path: Path) -> None:
    v1, _v2, v3 = files(tmp_path)

    def as_user(user: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"FUTOIN_EVT_USER": user, "FUTOIN_EVT_PASSWORD": USERS[user]}
        return run("schema", *args, "--url", registry.url, env=env)

    added = await asyncio.to_thread(as_user, "alice", "add", "orders", "ORDER_PLACED", v1)
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"{SUBJECT}: version 1, schema id ")
    refused = await asyncio.to_thread(as_user, "bob", "add", "orders", "ORDER_PAID", v1)
    assert (refused.returncode, refused.stderr) == (
        1,
        "futoin-evt: The manage right on stream orders is needed.\n",
    )
    listed = await asyncio.to_thread(as_user, "bob", "list")
    assert listed.stdout.startswith(f"{SUBJECT}  version 1  schema id ")
    shown = await asyncio.to_thread(as_user, "bob", "show", "orders", "ORDER_PLACED")
    assert json.loads(shown.stdout.split("\n", 1)[1]) == V1
    checked = await asyncio.to_thread(as_user, "bob", "check", "orders", "ORDER_PLACED", v3)
    assert checked.returncode == 1
    assert 'required property "note" added' in checked.stderr


async def test_the_console_shows_each_streams_types_with_their_schemas(
    start_server: ServerFactory, password_hashes: dict[str, str]
) -> None:
    from futoin_evt.console.config import ConsoleConfig

    server = await start_server(console=ConsoleConfig())
    await setup(server, password_hashes)
    quoted = {**V1, "description": "<b>not markup</b>"}
    await server.schemas.register(OPERATOR, SUBJECT, Candidate(json.dumps(quoted)))
    await server.schemas.register(OPERATOR, "payroll-SALARY", Candidate(json.dumps(V1)))
    assert server.console_url is not None
    for user, password, shown in (
        ("bob", USERS["bob"], [SUBJECT, "payroll-SALARY"]),
        ("dave", USERS["bob"], []),
    ):
        async with httpx.AsyncClient(base_url=server.console_url, timeout=30) as http:
            assert (await console_login(http, user, password)).status_code == 303
            page = (await http.get("streams")).text
        rows = re.findall(r'<tr data-stream="([^"]+)" data-type="([^"]+)">', page)
        assert [f"{stream}-{kind}" for stream, kind in rows] == shown
        if shown:
            assert "<code>order</code> integer (required)" in page
            assert "&lt;b&gt;not markup&lt;/b&gt;" in page
            assert "<b>not markup</b>" not in page


@pytest.mark.parametrize("store_db", ["sqlite", "postgres"], indirect=True)
async def test_a_database_from_before_the_registry_gains_it(store_db: str) -> None:
    """A database the previous release left (schema version 9, a stream with events) opens
    with the registry's tables, and keeps what it had."""
    before = SCHEMAS_VERSION - 1
    if store_db.startswith("postgresql://"):
        pg_schema_at(store_db, before)
    else:
        with sqlite3.connect(store_db, isolation_level=None) as conn:
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for step in range(1, before + 1):
                for statement in SQLITE_MIGRATIONS[step].split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?)", (before,))
    execute_sql(store_db, "INSERT INTO events (type, data, ts) VALUES ('OLD', '1', 't')")
    async with await open_store(store_db) as store:
        info = await store.add_stream("orders", 1)
        streams = await StreamRegistry.open(store)
        try:
            registry = SchemaRegistry(store, streams)
            row = await registry.register(OPERATOR, SUBJECT, Candidate(json.dumps(V1)))
            assert (row.version, row.schema_id) == (1, 1)
            await registry.reload()
            assert registry.schema_of("orders", "ORDER_PLACED") is not None
        finally:
            await streams.close()
        assert info.partitions[0].stream == "orders"
        assert (await store.read_rows(0, limit=9))[0][1] == "OLD"
    assert execute_sql(store_db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
