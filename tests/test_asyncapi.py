"""``GET /asyncapi.json``: the AsyncAPI 3.0 document of the streams a user may read, checked
against the official AsyncAPI 3.0 JSON Schema (npm ``@asyncapi/specs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from jsonschema.protocols import Validator

from futoin_evt import __version__
from futoin_evt.amqp import AmqpConfig
from futoin_evt.domain.rights import Right
from futoin_evt.log.schemas import OPERATOR, Candidate
from futoin_evt.server.app import EventServer
from futoin_evt.server.http import FeedConfig

from .support.schemas import V1, basic
from .support.servers import USERS, ServerFactory

SALARY: dict[str, Any] = {"type": "object", "properties": {"amount": {"type": "number"}}}
#: A schema of a later draft than AsyncAPI's own: named as such.
SHIPPED: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "array",
    "prefixItems": [{"type": "integer"}, {"type": "string"}],
}


@pytest.fixture(scope="module")
def asyncapi_schema(js_peer: Path) -> Validator:
    """A validator of the official AsyncAPI 3.0.0 JSON Schema (every definition bundled)."""
    path = js_peer / "node_modules" / "@asyncapi" / "specs" / "schemas" / "3.0.0.json"
    schema = json.loads(path.read_text())
    validator: Validator = jsonschema.validators.validator_for(schema)(
        schema, format_checker=jsonschema.FormatChecker()
    )
    return validator


async def start(
    start_server: ServerFactory, db: str, password_hashes: dict[str, str], **options: Any
) -> EventServer:
    """Streams orders (2 partitions) and payroll, each with a typed event type; carol may
    read orders and nothing else; alice and bob read and write every stream."""
    server = await start_server(db=db, **options)
    await server.streams.add(OPERATOR, "orders", 2)
    await server.streams.add(OPERATOR, "payroll", 1)
    await server.schemas.register(OPERATOR, "orders-ORDER_PLACED", Candidate(json.dumps(V1)))
    await server.schemas.register(OPERATOR, "payroll-SALARY", Candidate(json.dumps(SALARY)))
    carol = await server.store.add_user("carol", password_hashes["bob"])
    await server.store.grant(carol, "orders", int(Right.READ))
    await server.access.changed_here()
    return server


async def document(server: EventServer, user: str, **headers: str) -> dict[str, Any]:
    secret = USERS.get(user, USERS["bob"])
    async with httpx.AsyncClient(base_url=server.url.replace("ws", "http", 1)) as http:
        answer = await http.get("/asyncapi.json", headers=basic(user, secret) | headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    found: dict[str, Any] = answer.json()
    return found


def errors(validator: Validator, found: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(found)]


async def test_a_reader_gets_a_valid_document_of_their_streams(
    start_server: ServerFactory,
    store_db: str,
    password_hashes: dict[str, str],
    asyncapi_schema: Validator,
) -> None:
    """The document is valid AsyncAPI 3.0; carol sees orders only: each partition at each
    door, receive operations only (she may not write), its typed message with the registered
    schema as payload, and nothing of payroll."""
    server = await start(start_server, store_db, password_hashes, amqp=AmqpConfig(port=0))
    found = await document(server, "carol")
    assert errors(asyncapi_schema, found) == []
    assert found["asyncapi"] == "3.0.0"
    assert found["info"]["title"] == "futoin-evt"
    assert found["info"]["version"] == __version__
    port = server.transport.port
    assert server.amqp_url is not None
    amqp_port = int(server.amqp_url.rsplit(":", 1)[1])
    assert {name: (s["host"], s["protocol"]) for name, s in found["servers"].items()} == {
        "ftn3": (f"127.0.0.1:{port}", "ws"),
        "amqp": (f"127.0.0.1:{amqp_port}", "amqp"),
        "feed": (f"127.0.0.1:{port}", "http"),
    }
    addresses = {name: channel["address"] for name, channel in found["channels"].items()}
    assert addresses == {
        "orders.0.ftn18": "/orders/0",
        "orders.1.ftn18": "/orders/1",
        "orders.0.amqp": "orders/Partitions/0",
        "orders.1.amqp": "orders/Partitions/1",
        "orders.0.feed": "/feeds/orders/events?partition=0",
        "orders.1.feed": "/feeds/orders/events?partition=1",
    }
    assert {op["action"] for op in found["operations"].values()} == {"receive"}
    assert len(found["operations"]) == 6
    messages = found["components"]["messages"]
    assert set(messages) == {"orders-ORDER_PLACED", "event"}
    placed = messages["orders-ORDER_PLACED"]
    assert placed["name"] == "ORDER_PLACED"
    assert placed["payload"] == {
        "schemaFormat": "application/schema+json;version=draft-07",
        "schema": V1,
    }
    assert set(found["channels"]["orders.1.amqp"]["messages"]) == {"orders-ORDER_PLACED", "event"}
    assert "payroll" not in json.dumps(found)


async def test_a_writer_also_gets_the_send_operations_and_every_stream(
    start_server: ServerFactory,
    db_path: Path,
    password_hashes: dict[str, str],
    asyncapi_schema: Validator,
) -> None:
    """alice reads and writes every stream: events, orders and payroll, with addEvent and
    AMQP send; a schema's newest version is the payload; with the feed and AMQP off their
    servers and channels are absent; the host is the one the request came to."""
    server = await start(start_server, str(db_path), password_hashes, feed=FeedConfig(path=None))
    await server.schemas.register(
        OPERATOR, "payroll-SALARY", Candidate(json.dumps(SALARY | {"title": "v2"}))
    )
    await server.schemas.register(OPERATOR, "orders-ORDER_SHIPPED", Candidate(json.dumps(SHIPPED)))
    found = await document(server, "alice", Host="evt.example:8443")
    assert errors(asyncapi_schema, found) == []
    assert found["servers"] == {
        "ftn3": {
            "host": "evt.example:8443",
            "protocol": "ws",
            "description": found["servers"]["ftn3"]["description"],
        }
    }
    assert set(found["channels"]) == {
        "events.0.ftn18",
        "orders.0.ftn18",
        "orders.1.ftn18",
        "payroll.0.ftn18",
    }
    assert sorted(op["summary"] for op in found["operations"].values()) == sorted(
        ["addEvent", "push"] * 4
    )
    salary = found["components"]["messages"]["payroll-SALARY"]["payload"]["schema"]
    assert salary == SALARY | {"title": "v2"}
    assert found["components"]["messages"]["orders-ORDER_SHIPPED"]["payload"] == {
        "schemaFormat": "application/schema+json;version=2020-12",
        "schema": SHIPPED,
    }
    # a Host header that is not a host[:port] is not echoed: the listening address is named
    found = await document(server, "alice", Host="evil/x")
    assert found["servers"]["ftn3"]["host"] == f"127.0.0.1:{server.transport.port}"


async def test_anonymous_gets_401_and_a_user_without_rights_no_stream(
    server: EventServer, password_hashes: dict[str, str], asyncapi_schema: Validator
) -> None:
    """Without valid credentials: 401 and nothing of the streams; dave, who holds no right,
    gets a valid document without channels."""
    async with httpx.AsyncClient(base_url=server.url.replace("ws", "http", 1)) as http:
        for headers in ({}, basic("alice", "wrong")):
            answer = await http.get("/asyncapi.json", headers=headers)
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"].startswith("Basic ")
            assert "events" not in answer.text
            assert "asyncapi" not in answer.text
    await server.store.add_user("dave", password_hashes["bob"])
    found = await document(server, "dave")
    assert errors(asyncapi_schema, found) == []
    assert (found["channels"], found["operations"]) == ({}, {})
    assert set(found["components"]["messages"]) == {"event"}
