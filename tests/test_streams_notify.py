"""Event notification over a named stream of 4 partitions: FTN3 ``futoin.evt.notify`` with
``stream``, AMQP ``$events/NAME``, and GET-EVENTS. Only the matching events of that stream
arrive, each with its ``stream`` and ``partition`` attributes, which selectors and
transformations use; unknown and bad stream names are refused. On both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest
from proton import ConnectionException, LinkException, Message
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.console.config import ConsoleConfig
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.stream import UserId
from futoin_evt.notify.live import Subscription
from futoin_evt.notify.selector import compile_selector
from futoin_evt.server.app import EventServer

from .support.amqp import connected, in_thread, management_requests
from .support.console import console_login
from .support.ftn3 import closed_with
from .support.notify import PARTITIONS, SELECTOR, TRANSFORMATION, add, props
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

ALICE = "alice:" + USERS["alice"]
ROOT = Principal(UserId(0), "root", is_admin=True)
END = "END"
#: (partition, type, data): the events added to ``orders``, in this order.
ORDERS: list[tuple[int, str, dict[str, Any]]] = [
    (0, "ORDER", {"total": 150}),
    (1, "ORDER", {"total": 20}),
    (2, "ORDER", {"total": 300}),
    (3, "REFUND", {"total": 500}),
    (1, "ORDER", {"total": 120}),
    (2, "ORDER", {"total": 5, "stream": "not this one"}),
    (3, "ORDER", {"total": 700}),
    (0, "NOTE", {"text": "x"}),
]


async def add_orders(server: EventServer) -> dict[tuple[int, int], dict[str, Any]]:
    """ORDERS, an END in each partition, and events of the same types in ``events`` (which no
    subscription to ``orders`` may see); (partition, id) -> data of each order event."""
    added = {}
    for partition, event_type, data in ORDERS:
        await add(server, "events", 0, event_type, {"total": 1000})
        added[partition, await add(server, "orders", partition, event_type, data)] = data
    for partition in range(PARTITIONS):
        await add(server, "orders", partition, END, {})
    return added


def where(
    added: dict[tuple[int, int], dict[str, Any]], event_type: str, minimum: int
) -> set[tuple[int, int]]:
    kinds = {(p, i): t for (p, t, _), (p, i) in zip(ORDERS, added, strict=True)}
    return {
        key for key, data in added.items() if kinds[key] == event_type and data["total"] > minimum
    }


async def until_ends(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages until an END from every partition has come."""
    messages: list[dict[str, Any]] = []
    ends = 0
    while ends < PARTITIONS:
        message = await asyncio.wait_for(queue.get(), 30)
        if message.get("subject") == END or END in (message.get("body") or []):
            ends += 1
        else:
            messages.append(message)
    return messages


async def test_ftn3_subscriptions_read_every_partition_of_the_stream(
    streams_server: EventServer,
) -> None:
    async with await EventStreamClient.connect(streams_server.url, credentials=ALICE) as client:
        notifications = Notifications(client.ftn3)
        ends = f" OR eventType = '{END}'"
        big = await notifications.subscribe(
            "eventType = 'ORDER' AND total > 100" + ends, stream="orders"
        )
        odd = await notifications.subscribe(
            f"(partition IN (1, 3) AND stream = 'orders'){ends}",
            ["stream", "partition", "id", "eventType"],
            compact=True,
            stream="orders",
        )
        elsewhere = await notifications.subscribe(f"stream = 'events'{ends}", stream="orders")
        default = await notifications.subscribe(f"eventType = 'ORDER' AND total = 1000{ends}")
        added = await add_orders(streams_server)
        await add(streams_server, "events", 0, END, {})

        got = await until_ends(big)
        assert {(m["properties"]["partition"], m["properties"]["id"]) for m in got} == where(
            added, "ORDER", 100
        )
        assert all(m["properties"]["stream"] == "orders" for m in got)
        assert all(m["properties"]["total"] > 100 for m in got)  # a data field loses to a base one
        assert {(p, i) for p, i in added if p in (1, 3)} == {
            (m["body"][1], m["body"][2]) for m in await until_ends(odd)
        }
        assert await until_ends(elsewhere) == []
        # Without a stream: events, as before (one partition, one END).
        message = await asyncio.wait_for(default.get(), 30)
        assert (message["properties"]["stream"], message["properties"]["partition"]) == (
            "events",
            0,
        )

        # after: one id per partition; the events after them, in each partition's order.
        replay = await notifications.subscribe(
            f"eventType = 'ORDER'{ends}", ["partition", "id", "eventType"], compact=True,
            stream="orders",
            after="1,0,1,0",
        )  # fmt: skip
        replayed = [(m["body"][0], m["body"][1]) for m in await until_ends(replay)]
        orders = {
            key for key in where(added, "ORDER", -1) if key[1] > (1 if key[0] in (0, 2) else 0)
        }
        assert set(replayed) == orders
        for partition in range(PARTITIONS):
            ids = [i for p, i in replayed if p == partition]
            assert ids == sorted(ids)

        await add(streams_server, "events", 0, "ONLY_EVENTS", {"x": 1})
        types = await notifications.event_types(stream="orders")
        assert types["ORDER"][:5] == ["eventType", "id", "ts", "stream", "partition"]
        assert "text" in types["NOTE"]
        assert "REFUND" in types
        assert "ONLY_EVENTS" not in types
        assert "ONLY_EVENTS" in await notifications.event_types()
        assert await notifications.event_types("REFUND", stream="orders") == {
            "REFUND": ["eventType", "id", "ts", "stream", "partition", "total"]
        }


async def test_subscribers_share_one_reader_per_partition(streams_server: EventServer) -> None:
    lives = streams_server.live_streams.of_stream("orders")
    assert streams_server.live_streams.of_stream("orders") == lives  # the same readers
    assert len({id(live) for live in lives}) == PARTITIONS
    subscriptions = [
        Subscription.of_partitions([(live, 0) for live in lives], None, compile_selector(s))
        for s in ("total > 100", "eventType = 'ORDER'", "partition = 1", "TRUE")
    ]
    for subscription in subscriptions:
        subscription.start()
    added = await add_orders(streams_server)
    seen = []
    for subscription in subscriptions:
        got = []
        while subscription.has_more():
            got += await subscription.poll()
        seen.append({(n.partition, n.id) for n in got if n.type != END})
        subscription.close()
    assert seen[3] == set(added)
    assert seen[2] == {key for key in added if key[0] == 1}
    # Every event of the stream was read from the store once, for all four subscribers.
    assert sum(live.rows_read for live in lives) == len(added) + PARTITIONS


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"stream": "nowhere"}, "UnknownStream"),
        ({"stream": "dcb"}, "UnknownStream"),  # reserved: never a stream
        ({"stream": "Bad!"}, "InvalidRequest"),
        ({"stream": 7}, "InvalidRequest"),
        ({"stream": "orders", "after": "5"}, "InvalidRequest"),
        ({"stream": "orders", "after": "1,2,3"}, "InvalidRequest"),
        ({"after": "1,2"}, "InvalidRequest"),
        ({"stream": "orders", "after": "1,,2,3"}, "InvalidRequest"),
    ],
)
async def test_ftn3_refuses_bad_streams_and_cursors(
    streams_server: EventServer, params: dict[str, Any], error: str
) -> None:
    async with await EventStreamClient.connect(streams_server.url, credentials=ALICE) as client:
        with pytest.raises(RemoteError) as refused:
            await client.ftn3.call("futoin.evt.notify:1.0", "subscribe", params)
        assert refused.value.name == error
        if "after" not in params:
            with pytest.raises(RemoteError) as refused:
                await client.ftn3.call("futoin.evt.notify:1.0", "getEvents", params)
            assert refused.value.name == error
        # The connection still serves.
        assert "ORDER" not in await Notifications(client.ftn3).event_types(stream="orders")


def receive_stream(
    conn: BlockingConnection, address: str, selector: str, transformation: Any = None
) -> Any:
    from proton import Described, symbol

    filters: dict[Any, Any] = {symbol("selector"): Described(SELECTOR, selector)}
    if transformation is not None:
        filters[symbol("transformation")] = Described(TRANSFORMATION, transformation)
    return conn.create_receiver(
        address, credit=100, name=address + selector, options=Filter(filters)
    )


def until_ends_amqp(receiver: Any) -> list[Message]:
    messages: list[Message] = []
    ends = 0
    while ends < PARTITIONS:
        message = receiver.receive(timeout=30)
        receiver.accept()
        if message.subject == END or (isinstance(message.body, list) and END in message.body):
            ends += 1
        else:
            messages.append(message)
    return messages


async def test_amqp_events_of_a_named_stream(streams_server: EventServer) -> None:
    url = streams_server.amqp_url or ""
    opened = asyncio.Event()
    loop = asyncio.get_running_loop()

    def receive() -> tuple[list[Message], list[Message]]:
        with connected(url) as conn:
            ends = f" OR eventType = '{END}'"
            big = receive_stream(conn, "$events/orders", f"total >= 150 AND partition <> 0{ends}")
            compact = receive_stream(
                conn,
                "$events/orders",
                f"eventType = 'ORDER'{ends}",
                {
                    "requestedAttributes": ["stream", "partition", "id", "eventType"],
                    "compact": True,
                },
            )
            loop.call_soon_threadsafe(opened.set)
            return until_ends_amqp(big), until_ends_amqp(compact)

    receiving = asyncio.ensure_future(in_thread(receive))
    await asyncio.wait_for(opened.wait(), 30)
    added = await add_orders(streams_server)
    big, compact = await receiving
    expected = {k for k, data in added.items() if data.get("total", 0) >= 150 and k[0] != 0}
    assert {(props(m)["partition"], props(m)["id"]) for m in big} == expected
    assert all(props(m)["stream"] == "orders" for m in big)
    bodies: list[list[Any]] = [cast(list[Any], m.body) for m in compact]
    assert {(body[1], body[2]) for body in bodies} == where(added, "ORDER", -1)
    assert {body[0] for body in bodies} == {"orders"}

    replies = await in_thread(
        management_requests,
        url,
        [
            {"operation": "GET-EVENTS", "stream": "orders", "eventType": "REFUND"},
            {"operation": "GET-EVENTS", "stream": "nowhere"},
            {"operation": "GET-EVENTS", "stream": 3},
        ],
    )
    assert replies[0][1] == {"REFUND": ["eventType", "id", "ts", "stream", "partition", "total"]}
    assert [status["status-code"] for status, _ in replies] == [200, 404, 400]


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("$events/nowhere", "there is no stream nowhere"),
        ("$events/Bad!", "invalid stream name"),
        ("$events/feed", "reserved"),
    ],
)
async def test_amqp_refuses_unknown_and_bad_streams(
    streams_server: EventServer, address: str, says: str
) -> None:
    url = streams_server.amqp_url or ""

    def attach() -> None:
        with connected(url) as conn:
            receive_stream(conn, address, "TRUE").receive(timeout=30)

    with pytest.raises((LinkDetached, LinkException, ConnectionException)) as refused:
        await in_thread(attach)
    assert "amqp:not-found" in str(refused.value)
    assert says in str(refused.value)


async def test_the_feed_selector_sees_stream_and_partition(streams_server: EventServer) -> None:
    await add(streams_server, "events", 0, "ORDER", {"total": 1})
    url = streams_server.url.replace("ws", "http", 1) + "feed"
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
        token = (await http.get(url)).json()["token"]
        counts = []
        for selector in ("stream = 'events' AND partition = 0", "stream = 'orders'"):
            params = {"token": token, "partition": "0", "cursor": "_first", "selector": selector}
            response = await http.get(url + "/events", params=params)
            lines = response.text.splitlines()
            counts.append(sum(line.startswith('{"data"') for line in lines))
    assert counts == [1, 0]


async def test_a_subscription_follows_the_partitions_a_stream_gains(
    streams_server: EventServer,
) -> None:
    async with await EventStreamClient.connect(streams_server.url, credentials=ALICE) as client:
        notifications = Notifications(client.ftn3)
        queue = await notifications.subscribe(
            "eventType = 'GROWN'", ["partition", "id"], compact=True, stream="orders"
        )
        await streams_server.store.grow_stream("orders", PARTITIONS + 2)
        await streams_server.streams.refresh()
        await add(streams_server, "orders", PARTITIONS + 1, "GROWN", {})
        await add(streams_server, "orders", 0, "GROWN", {})
        got = [(await asyncio.wait_for(queue.get(), 30))["body"] for _ in range(2)]
        assert sorted(got) == [[0, 1], [PARTITIONS + 1, 1]]


def amqp_subscriber(url: str, attached: asyncio.Event) -> Callable[[], None]:
    """A receiver from ``$events/orders`` (in a thread): sets ``attached`` once the link is
    attached, then waits for its end (raised)."""
    loop = asyncio.get_running_loop()

    def receive() -> None:
        with connected(url) as conn:
            receiver = receive_stream(conn, "$events/orders", "TRUE")
            loop.call_soon_threadsafe(attached.set)
            receiver.receive(timeout=60)

    return receive


async def test_dropping_a_stream_ends_its_subscriptions_and_frees_its_readers(
    streams_server: EventServer,
) -> None:
    """Dropping ``orders`` closes its FTN3 subscriber's connection (1008, the sentence), detaches
    its AMQP ``$events/orders`` link as a stream that is not there (``amqp:not-found``), and
    forgets its shared readers: the server holds as many as before anyone subscribed."""
    lives = streams_server.live_streams
    before = lives.readers
    attached = asyncio.Event()
    async with await EventStreamClient.connect(streams_server.url, credentials=ALICE) as client:
        await Notifications(client.ftn3).subscribe(stream="orders")
        receiving = asyncio.ensure_future(
            in_thread(amqp_subscriber(streams_server.amqp_url or "", attached))
        )
        await asyncio.wait_for(attached.wait(), 30)
        assert lives.readers == before + PARTITIONS
        assert await streams_server.streams.drop(ROOT, "orders")
        assert lives.readers == before
        assert await closed_with(client.ftn3) == (1008, "the stream orders was dropped")
        with pytest.raises((LinkDetached, LinkException)) as detached:
            await receiving
        assert "amqp:not-found" in str(detached.value)
        assert "the stream orders was dropped" in str(detached.value)
    # A stream of the name added again is a new one: subscribing reads it afresh.
    await streams_server.streams.add(ROOT, "orders", 2)
    assert len(lives.of_stream("orders")) == 2
    assert lives.readers == before + 2


async def test_every_serving_process_forgets_the_readers_of_a_dropped_stream(
    start_server: ServerFactory, store_db: str
) -> None:
    """Two servers on one database: a stream dropped through one ends the subscriptions of
    the other and frees its readers, once it has read the registry again."""
    one = await start_server(db=store_db)
    other = await start_server(db=store_db, streams_poll_seconds=0.1)
    await one.store.add_stream("orders", PARTITIONS)
    await other.streams.refresh()
    before = other.live_streams.readers
    async with await EventStreamClient.connect(other.url, credentials=ALICE) as client:
        await Notifications(client.ftn3).subscribe(stream="orders")
        assert other.live_streams.readers == before + PARTITIONS
        assert await one.streams.drop(ROOT, "orders")
        assert await closed_with(client.ftn3) == (1008, "the stream orders was dropped")
    assert other.live_streams.readers == before


async def test_a_console_live_tail_of_a_dropped_stream_ends_saying_so(
    start_server: ServerFactory, store_db: str
) -> None:
    server = await start_server(db=store_db, console=ConsoleConfig())
    await server.streams.add(ROOT, "orders", 2)
    before = server.live_streams.readers
    url = server.console_url
    assert url is not None
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await console_login(http, "alice", USERS["alice"])
        tail = {"stream": "orders", "partition": "1"}
        async with http.stream("GET", "tail/stream", params=tail) as response:
            assert response.status_code == 200  # the tail is following the partition
            assert server.live_streams.readers == before + 2
            assert await server.streams.drop(ROOT, "orders")
            lines = [line async for line in response.aiter_lines() if line]
    assert lines[-2:] == ["event: ended", 'data: "The stream orders was dropped."']
    assert server.live_streams.readers == before
