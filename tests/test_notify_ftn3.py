"""Event notification over FTN3 (``futoin.evt.notify``): selector cases, transformations,
management events and GET-EVENTS, with our asyncio client over a real WebSocket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from futoin_evt.client.aio import CommError, EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.domain.management import (
    CONSUMER_DROPPED,
    CONSUMER_REGISTERED,
    CONSUMER_TAKEN_OVER,
)
from futoin_evt.server.app import EventServer

from .support.notify import CASES, EVENTS
from .support.servers import ClientFactory

pytestmark = pytest.mark.functional

END = "END"
PUSH = "futoin.evt.push:1.1"
OPS = "futoinevt.ops:1.0"


async def add_cases(client: EventStreamClient) -> None:
    for event_type, data in [*EVENTS, (END, {})]:
        await client.add_event(event_type, data)


async def until_end(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while True:
        message = await asyncio.wait_for(queue.get(), 30)
        if message.get("subject") == END or END in (message.get("body") or []):
            return messages
        messages.append(message)


async def test_every_selector_case_over_ftn3(alice: EventStreamClient) -> None:
    await add_cases(alice)
    notifications = Notifications(alice.ftn3)
    for selector, expected in CASES:
        queue = await notifications.subscribe(f"({selector}) OR eventType = '{END}'", after=0)
        got = {m["properties"]["id"] for m in await until_end(queue)}
        assert got == expected, selector
        assert await notifications.unsubscribe(queue)


async def test_live_transformations(alice: EventStreamClient) -> None:
    notifications = Notifications(alice.ftn3)
    pinned = f"eventType IN ('ORDER_PLACED', 'ORDER_SHIPPED', '{END}')"
    named = await notifications.subscribe(pinned, ["total", "carrier"])
    compact = await notifications.subscribe(pinned, ["eventType", "total", "carrier"], compact=True)
    full = await notifications.subscribe(f"eventType IN ('PAYMENT', '{END}')")
    await add_cases(alice)
    assert await until_end(named) == [
        {"subject": "ORDER_PLACED", "properties": {"total": 150}},
        {"subject": "ORDER_PLACED", "properties": {"total": 80}},
        {"subject": "ORDER_PLACED", "properties": {"total": 100}},
        {"subject": "ORDER_SHIPPED", "properties": {"total": "150", "carrier": "DHL"}},
        {"subject": "ORDER_SHIPPED", "properties": {"carrier": "UPS"}},
    ]
    assert [m["body"] for m in await until_end(compact)] == [
        ["ORDER_PLACED", 150, None],
        ["ORDER_PLACED", 80, None],
        ["ORDER_PLACED", 100, None],
        ["ORDER_SHIPPED", "150", "DHL"],
        ["ORDER_SHIPPED", None, "UPS"],
    ]
    payments = await until_end(full)
    assert [m["body"] for m in payments] == [EVENTS[8][1], EVENTS[9][1]]
    assert payments[0]["properties"]["eventType"] == "PAYMENT"
    assert payments[0]["properties"]["id"] == 9


async def test_management_events_for_a_consumer(
    server: EventServer, connect: ClientFactory
) -> None:
    alice, other_alice, bob = await connect("alice"), await connect("alice"), await connect("bob")
    notifications = Notifications(alice.ftn3)
    mine = await notifications.subscribe(
        "eventType IN ('org.futoin.evt.consumerRegistered', 'org.futoin.evt.consumerDropped',"
        " 'org.futoin.evt.consumerTakenOver')",
        ["eventType", "user", "component"],
        compact=True,
    )
    await bob.register_consumer("BOBS")  # not alice's: she does not see it
    await alice.register_consumer("ORDERS", iface=PUSH)
    await alice.ftn3.call(PUSH, "readyToReceive", {"component": "ORDERS"})
    await other_alice.ftn3.call(PUSH, "readyToReceive", {"component": "ORDERS"})
    await alice.ftn3.call(OPS, "dropConsumer", {"user": "alice", "component": "ORDERS"})
    got = [await asyncio.wait_for(mine.get(), 30) for _ in range(3)]
    assert [m["body"] for m in got] == [
        [CONSUMER_REGISTERED, "alice", "ORDERS"],
        [CONSUMER_TAKEN_OVER, "alice", "ORDERS"],
        [CONSUMER_DROPPED, "alice", "ORDERS"],
    ]
    assert mine.empty()
    types = await notifications.event_types()
    assert types[CONSUMER_TAKEN_OVER] == [
        "eventType", "ts", "stream", "partition", "user", "component", "transport", "epoch",
        "reason",
    ]  # fmt: skip
    await alice.add_event("ORDER", {"total": 5, "region": "EU"})
    assert await notifications.event_types("ORDER") == {
        "ORDER": ["eventType", "id", "ts", "stream", "partition", "total", "region"]
    }


@pytest.mark.parametrize(
    ("params", "error", "desc"),
    [
        ({"selector": "total > > 1"}, "InvalidSelector", "unexpected '>' (at column 9)"),
        ({"selector": "upper(x) = 1"}, "InvalidSelector", "unknown function: upper"),
        ({"selector": "(" * 5000 + "1" + ")" * 5000}, "InvalidSelector", "longer than 4096"),
        ({"selector": "(" * 100 + "id=1" + ")" * 100}, "InvalidSelector", "nested deeper than"),
        ({"transformation": {"compact": True}}, "InvalidTransformation", "requestedAttributes"),
        ({"selector": "x" * 60_000}, "InvalidSelector", "longer than 4096"),
    ],
)
async def test_bad_subscriptions_are_refused(
    alice: EventStreamClient, params: dict[str, Any], error: str, desc: str
) -> None:
    with pytest.raises(RemoteError) as refused:
        await alice.ftn3.call("futoin.evt.notify:1.0", "subscribe", params)
    assert refused.value.name == error
    assert desc in refused.value.desc
    # the connection and the server go on
    queue = await Notifications(alice.ftn3).subscribe("id > 0")
    await alice.add_event("AFTER", {})
    assert (await asyncio.wait_for(queue.get(), 30))["subject"] == "AFTER"


async def test_a_megabyte_selector_loses_its_connection_only(connect: ClientFactory) -> None:
    """Over the WebSocket message limit: that connection is closed; the server goes on."""
    alice = await connect("alice")
    with pytest.raises(CommError):
        await alice.ftn3.call("futoin.evt.notify:1.0", "subscribe", {"selector": "x" * 2**20})
    again = await connect("alice")
    queue = await Notifications(again.ftn3).subscribe("eventType = 'AFTER'")
    await again.add_event("AFTER", {})
    assert (await asyncio.wait_for(queue.get(), 30))["subject"] == "AFTER"
