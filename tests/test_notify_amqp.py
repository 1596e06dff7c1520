"""Event notification over AMQP: ``$events`` with selector and transformation filters, and
GET-EVENTS on ``$management``, driven by python-qpid-proton's blocking client."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import pytest
from proton import ConnectionException, Described, LinkException, Message, symbol
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.domain.management import AUTH_FAILED, CONSUMER_REGISTERED
from futoin_evt.domain.stream import EventDraft
from futoin_evt.server.app import EventServer

from .support.amqp import LinkProperties, connected, in_thread, management_requests
from .support.notify import CASES, EVENTS, SELECTOR, TRANSFORMATION, WRITER, props
from .support.servers import USERS

pytestmark = pytest.mark.functional

END = "END"
_LINK_NAMES = itertools.count()


def subscribe(
    conn: BlockingConnection,
    selector: str | None = None,
    transformation: dict[str, Any] | None = None,
    *,
    symbolic: bool = False,
    credit: int = 100,
) -> Any:
    filters: dict[Any, Any] = {}
    if selector is not None:
        descriptor = symbol("apache.org:selector-filter:string") if symbolic else SELECTOR
        filters[symbol("selector")] = Described(descriptor, selector)
    if transformation is not None:
        filters[symbol("transformation")] = Described(TRANSFORMATION, cast(Any, transformation))
    name = f"notify-{next(_LINK_NAMES)}"  # names are unique per connection
    return conn.create_receiver("$events", credit=credit, name=name, options=Filter(filters))


def produce_cases(conn: BlockingConnection) -> None:
    sender = conn.create_sender("events")
    for event_type, data in [*EVENTS, (END, {})]:
        sender.send(Message(subject=event_type, body=data))


def until_end(receiver: Any) -> list[Message]:
    messages: list[Message] = []
    while True:
        message = receiver.receive(timeout=30)
        receiver.accept()
        if message.subject == END or (isinstance(message.body, list) and END in message.body):
            return messages
        messages.append(message)


async def test_every_selector_case_over_amqp(amqp_server: EventServer) -> None:
    def run() -> list[set[int]]:
        with connected(amqp_server.amqp_url or "") as conn:
            receivers = [
                subscribe(conn, f"({selector}) OR eventType = '{END}'", symbolic=index % 2 == 0)
                for index, (selector, _) in enumerate(CASES)
            ]
            produce_cases(conn)
            return [{int(props(m)["id"]) for m in until_end(r)} for r in receivers]

    results = await in_thread(run)
    for (selector, expected), got in zip(CASES, results, strict=True):
        assert got == expected, selector


async def test_virtual_message_and_transformations(amqp_server: EventServer) -> None:
    pinned = f"eventType IN ('ORDER_PLACED', 'ORDER_SHIPPED', '{END}')"

    def run() -> list[list[Message]]:
        with connected(amqp_server.amqp_url or "") as conn:
            receivers = [
                subscribe(conn, f"eventType IN ('ORDER_PLACED', '{END}')"),
                subscribe(conn, pinned, {"requestedAttributes": ["total", "carrier"]}),
                subscribe(
                    conn,
                    pinned,
                    {"requestedAttributes": ["eventType", "total", "carrier"], "compact": True},
                ),
            ]
            produce_cases(conn)
            return [until_end(r) for r in receivers]

    full, named, compact = await in_thread(run)
    first = full[0]
    assert first.subject == "ORDER_PLACED"
    assert first.properties == {
        "eventType": "ORDER_PLACED",
        "id": 1,
        "ts": props(first)["ts"],
        "stream": "events",
        "partition": 0,
        "total": 150,
        "region": "EU",
        "customer": "alice",
        "express": True,
        "discount": None,
    }
    assert first.body == EVENTS[0][1]
    assert [(m.subject, m.properties) for m in named] == [
        ("ORDER_PLACED", {"total": 150}),
        ("ORDER_PLACED", {"total": 80}),
        ("ORDER_PLACED", {"total": 100}),
        ("ORDER_SHIPPED", {"total": "150", "carrier": "DHL"}),
        ("ORDER_SHIPPED", {"carrier": "UPS"}),
    ]
    # compact: no names, no subject; eventType tells the two kinds of "total" apart
    assert all(m.subject is None and not m.properties for m in compact)
    assert [m.body for m in compact] == [
        ["ORDER_PLACED", 150, None],
        ["ORDER_PLACED", 80, None],
        ["ORDER_PLACED", 100, None],
        ["ORDER_SHIPPED", "150", "DHL"],
        ["ORDER_SHIPPED", None, "UPS"],
    ]


INVALID = "amqp:invalid-field"


@pytest.mark.parametrize(
    ("selector", "transformation", "condition", "description"),
    [
        ("total > > 1", None, INVALID, "unexpected '>' (at column 9)"),
        ("upper(region) = 'EU'", None, INVALID, "unknown function: upper"),
        ("(" * 10_000 + "id = 1" + ")" * 10_000, None, INVALID, "longer than 4096 characters"),
        ("(" * 1000 + "id = 1" + ")" * 1000, None, INVALID, "nested deeper than 64 levels"),
        ("x" * 60_000, None, INVALID, "longer than 4096 characters"),
        # beyond the connection's max-frame-size: the engine refuses the frame itself
        ("x" * 1024 * 1024, None, "amqp:connection:framing-error", ""),
        ("id > 1", {"compact": True}, INVALID, "requestedAttributes must be a non-empty list"),
    ],
)
async def test_bad_selector_refuses_the_attach(
    amqp_server: EventServer,
    selector: str,
    transformation: Any,
    condition: str,
    description: str,
) -> None:
    url = amqp_server.amqp_url or ""

    def attach() -> None:
        with connected(url) as conn:
            subscribe(conn, selector, transformation)

    with pytest.raises((LinkDetached, LinkException, ConnectionException)) as refused:
        await in_thread(attach)
    assert condition in str(refused.value)
    assert description in str(refused.value)

    def still_serves() -> list[int]:
        with connected(url) as conn:
            receiver = subscribe(conn, f"eventType = '{END}' OR id = 1")
            produce_cases(conn)
            return [int(props(m)["id"]) for m in until_end(receiver)]

    assert (await in_thread(still_serves))[-1] > 0


async def test_get_events_lists_management_and_log_types(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""

    def run() -> list[tuple[Any, Any]]:
        with connected(url) as conn:
            produce_cases(conn)
        return management_requests(
            url,
            [
                {"operation": "GET-EVENTS"},
                {"operation": "GET-EVENTS", "eventType": "PAYMENT"},
                {"operation": "GET-EVENTS", "eventType": 7},
            ],
        )

    (status, everything), (one_status, one), (bad, _) = await in_thread(run)
    assert status["status-code"] == one_status["status-code"] == 200
    assert everything[CONSUMER_REGISTERED] == [
        "eventType", "ts", "stream", "partition", "user", "component", "transport",
    ]  # fmt: skip
    assert everything["ORDER_PLACED"] == [
        "eventType", "id", "ts", "stream", "partition",
        "total", "region", "customer", "express", "discount", "note",
    ]  # fmt: skip
    assert one == {
        "PAYMENT": ["eventType", "id", "ts", "stream", "partition", "amount", "currency", "ratio"]
    }
    assert bad["status-code"] == 400


async def test_management_events_reach_an_amqp_subscriber(amqp_server: EventServer) -> None:
    """alice sees her own consumer registered and a failed login in her name; not bob's."""
    url = amqp_server.amqp_url or ""
    selector = (
        "eventType IN ('org.futoin.evt.consumerRegistered', 'org.futoin.evt.authFailed')"
        f" OR eventType = '{END}'"
    )
    loop = asyncio.get_running_loop()
    attached = asyncio.Event()

    def receive() -> list[Message]:
        with connected(url) as conn:
            shape = {"requestedAttributes": ["eventType", "user", "component"]}
            receiver = subscribe(conn, selector, shape)
            loop.call_soon_threadsafe(attached.set)
            return until_end(receiver)

    receiving = asyncio.ensure_future(in_thread(receive))
    await asyncio.wait(
        {receiving, asyncio.ensure_future(attached.wait())}, return_when="FIRST_COMPLETED"
    )
    for user in ("bob", "alice"):
        async with await EventStreamClient.connect(
            amqp_server.url, credentials=f"{user}:{USERS[user]}"
        ) as client:
            await client.register_consumer(f"{user.upper()}_C")

    def ftn18_group() -> None:
        """An AMQP consumer group bound to alice's FTN18 consumer AMQP_C registers it."""
        with connected(url) as conn:
            group = LinkProperties(event_streams_consumer_group="ftn18:AMQP_C")
            receiver = conn.create_receiver("events", credit=10, name="group", options=group)
            conn.create_sender("events").send(Message(subject="PING", body={}))
            receiver.receive(timeout=30)
            receiver.accept()

    await in_thread(ftn18_group)
    with pytest.raises(RemoteError):
        async with await EventStreamClient.connect(
            amqp_server.url, credentials="alice:wrong"
        ) as client:
            await client.ping()
    await amqp_server.logs.default.append(WRITER, [EventDraft(END, {})])
    messages = await receiving
    assert [props(m) for m in messages] == [
        {"eventType": CONSUMER_REGISTERED, "user": "alice", "component": "ALICE_C"},
        {"eventType": CONSUMER_REGISTERED, "user": "alice", "component": "AMQP_C"},
        {"eventType": AUTH_FAILED, "user": "alice"},
    ]
