"""Event notification from the tests' side. Selector cases over a fixed set of events, shared
by the selector unit test and the tests of every door (AMQP ``$events``, FTN3
``futoin.evt.notify``, the HTTP feed's ``?selector=``); a server with several streams.

``EVENTS[i]`` gets id ``i + 1`` in an empty log. Each case is (selector, ids it matches).
"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message, symbol, ulong

from futoin_evt.amqp import AmqpConfig
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.stream import EventDraft, UserId
from futoin_evt.server.app import EventServer

from .servers import ServerFactory

#: Who appends the events the notification tests add through an event log.
WRITER = Principal(UserId(1), "alice", is_admin=False)

EVENTS: list[tuple[str, Any]] = [
    ("ORDER_PLACED", {"total": 150, "region": "EU", "customer": "alice", "express": True,
                      "discount": None, "order": {"total": 150, "items": 3}}),  # 1
    ("ORDER_PLACED", {"total": 80, "region": "US", "customer": "bob", "express": False}),  # 2
    ("ORDER_PLACED", {"total": 100, "region": "EU", "customer": "carol_1", "note": "50% off"}),
    ("ORDER_SHIPPED", {"total": "150", "region": "APAC", "carrier": "DHL"}),  # 4
    ("ORDER_SHIPPED", {"carrier": "UPS", "weight": 2.5}),  # 5
    ("USER_CREATED", {"name": "Dave", "age": 30}),  # 6
    ("USER_CREATED", {"name": "eve", "age": None, "tags": ["a"]}),  # 7
    ("USER_CREATED", ["not", "an", "object"]),  # 8
    ("PAYMENT", {"amount": -20, "currency": "EUR", "ratio": 0.5}),  # 9
    ("PAYMENT", {"amount": 7, "currency": "USD", "ratio": 1000.0}),  # 10
    ("RARE", {"total": 1000, "region": "EU"}),  # 11
    ("NOTE", {"text": "it's", "path": "a.b", "a.b": "dotted", "x": {"y": {"z": 1}}}),  # 12
]  # fmt: skip

ALL = frozenset(range(1, len(EVENTS) + 1))

CASES: list[tuple[str, frozenset[int]]] = [
    # the event type and the base attributes
    ("eventType = 'ORDER_PLACED'", frozenset({1, 2, 3})),
    ("eventType <> 'ORDER_PLACED'", ALL - {1, 2, 3}),
    ("eventType IN ('PAYMENT', 'RARE')", frozenset({9, 10, 11})),
    (
        "eventType NOT IN ('ORDER_PLACED', 'ORDER_SHIPPED', 'USER_CREATED')",
        frozenset({9, 10, 11, 12}),
    ),
    ("eventType LIKE 'ORDER%'", frozenset({1, 2, 3, 4, 5})),
    ("eventType LIKE 'ORDER\\_%' ESCAPE '\\'", frozenset({1, 2, 3, 4, 5})),
    ("id = 3", frozenset({3})),
    ("id BETWEEN 4 AND 6", frozenset({4, 5, 6})),
    ("id > 10 OR id < 2", frozenset({1, 11, 12})),
    ("ts IS NOT NULL", ALL),
    ("ts > '2000-01-01T00:00:00Z'", ALL),
    # comparisons and numbers
    ("total > 100", frozenset({1, 11})),
    ("total >= 100", frozenset({1, 3, 11})),
    ("total = 150", frozenset({1})),
    ("total = '150'", frozenset({4})),
    ("total <> 150", frozenset({2, 3, 11})),
    ("total < 100.5", frozenset({2, 3})),
    ("weight = 2.5", frozenset({5})),
    ("ratio > 1e2", frozenset({10})),
    ("amount < 0", frozenset({9})),
    ("amount = -20", frozenset({9})),
    ("-amount = 20", frozenset({9})),
    ("amount * 2 = 14", frozenset({10})),
    ("amount + 3 = 10", frozenset({10})),
    ("amount / 2 = 3", frozenset({10})),
    ("amount / 2 = -10", frozenset({9})),
    ("amount / 0 = 1", frozenset()),
    ("total - 50 = 100", frozenset({1})),
    ("0x10 = 16 AND id = 1", frozenset({1})),
    ("total BETWEEN 80 AND 100", frozenset({2, 3})),
    ("total NOT BETWEEN 80 AND 100", frozenset({1, 11})),
    ("total BETWEEN '1' AND '2'", frozenset({4})),
    # numbers against strings, booleans
    ("total > '100'", frozenset({4})),
    ("region = 1", frozenset()),
    ("age = '30'", frozenset()),
    ("express = TRUE", frozenset({1})),
    ("express", frozenset({1})),
    ("NOT express", frozenset({2})),
    ("express <> true", frozenset({2})),
    ("express = 1", frozenset()),
    # NULL and three-valued logic
    ("discount IS NULL", ALL),
    ("discount IS NOT NULL", frozenset()),
    ("age IS NULL", ALL - {6}),
    ("age IS NOT NULL", frozenset({6})),
    ("tags IS NULL", ALL),
    ("missing = 1", frozenset()),
    ("NOT missing = 1", frozenset()),
    ("missing = 1 OR id = 2", frozenset({2})),
    ("NOT (missing = 1 AND id = 2)", ALL - {2}),
    ("NOT (missing = 1 OR id = 2)", frozenset()),
    ("age > 18 OR age IS NULL", frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})),
    ("region NOT IN ('EU')", frozenset({2, 4})),
    ("NOT region = 'EU'", frozenset({2, 4})),
    # LIKE, IN
    ("customer LIKE 'a%'", frozenset({1})),
    ("customer LIKE '_ob'", frozenset({2})),
    ("customer LIKE '%\\_1' ESCAPE '\\'", frozenset({3})),
    ("customer NOT LIKE '%o%'", frozenset({1})),
    ("note LIKE '50!%%' ESCAPE '!'", frozenset({3})),
    ("name LIKE 'd%'", frozenset()),
    ("text = 'it''s'", frozenset({12})),
    ("total LIKE '1%'", frozenset({4})),
    ("currency IN ('EUR', 'USD')", frozenset({9, 10})),
    ("region IN ('EU', 'APAC') AND total IN (150, 1000)", frozenset({1, 11})),
    ("total IN ('150', 100)", frozenset({3, 4})),
    # nested attributes
    ("order.total = 150", frozenset({1})),
    ("order.items > 2 AND order.total > 100", frozenset({1})),
    ("a.b = 'dotted'", frozenset({12})),
    ("x.y.z = 1", frozenset({12})),
    ("x.y IS NULL", ALL),
    # precedence
    ("id = 1 OR id = 2 AND region = 'EU'", frozenset({1})),
    ("(id = 1 OR id = 2) AND region = 'EU'", frozenset({1})),
    ("NOT id = 1 AND region = 'EU'", frozenset({3, 11})),
    ("amount + 2 * 3 = 13", frozenset({10})),
    ("(amount + 2) * 3 = 27", frozenset({10})),
    ("- - amount = 7", frozenset({10})),
    ("eventType = 'ORDER_PLACED' AND total > 90 AND region = 'EU'", frozenset({1, 3})),
    ("TRUE", ALL),
    ("FALSE OR eventType = 'NOTE'", frozenset({12})),
    ("and_ = 1 OR notice IS NULL AND id < 2", frozenset({1})),
]

BAD_SELECTORS: list[tuple[str, str]] = [
    ("total >", "ends too early"),
    ("total > > 1", "unexpected '>'"),
    ("region = 'EU", "unexpected character"),
    ("total = 1 AND", "ends too early"),
    ("upper(region) = 'EU'", "unknown function: upper"),
    ("(" * 10_000 + "id = 1" + ")" * 10_000, "longer than 4096"),
    ("(" * 1000 + "id = 1" + ")" * 1000, "nested deeper than"),
    ("NOT " * 200 + "TRUE", "nested deeper than"),
    ("x" * 1024 * 1024, "longer than 4096"),
    ("a LIKE 'x' ESCAPE 'ab'", "one character"),
    ("", "empty"),
]


SELECTOR = ulong(0x0000_468C_0000_0004)


TRANSFORMATION = symbol("org.futoin.evt:notification-transformation:map")


def props(message: Message) -> dict[str, Any]:
    assert message.properties is not None
    return dict(message.properties)


PARTITIONS = 4


@pytest.fixture
async def streams_server(start_server: ServerFactory, store_db: str) -> EventServer:
    """A server on each backend, with AMQP, and the stream ``orders`` of 4 partitions."""
    server = await start_server(db=store_db, amqp=AmqpConfig(port=0))
    await server.store.add_stream("orders", PARTITIONS)
    await server.streams.refresh()
    return server


async def add(server: EventServer, stream: str, partition: int, event_type: str, data: Any) -> int:
    """Add an event to a partition through the store; its id there."""
    found = server.streams.partition(stream, partition)
    assert found is not None
    return int(await server.logs.partition(found).append(WRITER, [EventDraft(event_type, data)]))
