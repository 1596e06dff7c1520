"""``$events`` subscriptions from a start position: the event log node's offset and timestamp
filters on a notification link replay the stored events from there through the selector,
then go on live with nothing missed and nothing twice; driven by python-qpid-proton."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from proton import Described, LinkException, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.amqp.codec import format_offset
from futoin_evt.domain.stream import EventDraft, ts_to_ms
from futoin_evt.server.app import EventServer

from .support.amqp import connected, in_thread
from .support.notify import PARTITIONS, SELECTOR, WRITER, add, props, streams_server

pytestmark = pytest.mark.functional

__all__ = ["streams_server"]  # the fixture, used here

END = "END"
ANNOTATIONS = ulong(0x200)
SQL = ulong(0x201)
OFFSET = symbol("event-streams-offset")
TIMESTAMP = symbol("event-streams-timestamp")


def subscribe_from(
    conn: BlockingConnection, address: str, selector: str, position: dict[Any, Any]
) -> Any:
    """A receiver from ``address`` with ``selector`` and ``position`` (more filter-set
    entries: where to start)."""
    filters = {symbol("selector"): Described(SELECTOR, selector), **position}
    return conn.create_receiver(address, credit=100, name=address, options=Filter(filters))


def at(offset: str | None = None, timestamp: int | None = None) -> dict[Any, Any]:
    """The delivery-annotations filter: after ``offset`` and after ``timestamp`` (ms)."""
    value: dict[Any, Any] = {}
    if offset is not None:
        value[OFFSET] = symbol(offset)
    if timestamp is not None:
        value[TIMESTAMP] = timestamp
    return {symbol("from"): Described(ANNOTATIONS, value)}


def sql(text: str) -> dict[Any, Any]:
    return {symbol("sql"): Described(SQL, text)}


async def subscribed_while_adding(
    url: str,
    address: str,
    selector: str,
    position: dict[Any, Any],
    add_live: Any,
    *,
    end: str = END,
    ends: int = 1,
) -> list[Message]:
    """Subscribe with ``selector OR eventType = end``, then run ``add_live()`` (events added
    once the link is attached, ``ends`` events of type ``end`` last) and return what came
    before those."""
    loop = asyncio.get_running_loop()
    attached = asyncio.Event()

    def receive() -> list[Message]:
        with connected(url) as conn:
            receiver = subscribe_from(
                conn, address, f"({selector}) OR eventType = '{end}'", position
            )
            loop.call_soon_threadsafe(attached.set)
            messages: list[Message] = []
            left = ends
            while left:
                message = receiver.receive(timeout=30)
                receiver.accept()
                if message.subject == end:
                    left -= 1
                else:
                    messages.append(message)
            return messages

    receiving = asyncio.ensure_future(in_thread(receive))
    waiting = asyncio.ensure_future(attached.wait())
    await asyncio.wait({receiving, waiting}, return_when="FIRST_COMPLETED")
    waiting.cancel()
    if not receiving.done():
        await add_live()
    return await receiving


def kind(number: int) -> str:
    return "A" if number % 2 else "B"


async def test_from_an_offset_replays_then_goes_on_live(amqp_server: EventServer) -> None:
    """Stored events after the offset, then the ones added meanwhile: every matching id once,
    in order, through the hand-over from the store to the live reader."""
    log = amqp_server.logs.default
    stored = [await log.append(WRITER, [EventDraft(kind(n), {"n": n})]) for n in range(60)]
    start = stored[19]
    added: list[int] = []

    async def add_live() -> None:
        added.extend(
            [await log.append(WRITER, [EventDraft(kind(n), {"n": n})]) for n in range(60, 120)]
        )
        await log.append(WRITER, [EventDraft(END, {})])

    selector = "eventType = 'A'"
    messages = await subscribed_while_adding(
        amqp_server.amqp_url or "", "$events", selector, at(format_offset(start)), add_live
    )
    ids = [int(props(m)["id"]) for m in messages]
    every = stored + added
    assert ids == [i for n, i in enumerate(every) if kind(n) == "A" and i > start]
    assert [props(m)["n"] for m in messages] == list(range(21, 120, 2))


@pytest.mark.parametrize(
    ("position", "first"),
    [
        (at("@earliest"), 0),
        (sql("d.event-streams-offset >= '00000000000000000011'"), 10),
        (sql("amqp.annotation.x-opt-sequence-number > 4"), 4),
        (sql("amqp.annotation.x-opt-offset > '@latest'"), 20),
    ],
    ids=["earliest", "sql-offset", "sql-sequence-number", "sql-latest"],
)
async def test_every_offset_form_of_the_event_log_node(
    amqp_server: EventServer, position: dict[Any, Any], first: int
) -> None:
    log = amqp_server.logs.default
    for n in range(20):
        await log.append(WRITER, [EventDraft("A", {"n": n})])

    async def add_live() -> None:
        await log.append(WRITER, [EventDraft("A", {"n": 20})])
        await log.append(WRITER, [EventDraft(END, {})])

    messages = await subscribed_while_adding(
        amqp_server.amqp_url or "", "$events", "TRUE", position, add_live
    )
    assert [props(m)["n"] for m in messages] == list(range(first, 21))


async def test_an_sql_filter_bounds_what_is_sent(amqp_server: EventServer) -> None:
    """The whole SQL filter holds, not only its start: here an upper bound too."""
    log = amqp_server.logs.default
    ids = [await log.append(WRITER, [EventDraft("A", {"n": n})]) for n in range(10)]
    end = await log.append(WRITER, [EventDraft(END, {})])
    low, high = format_offset(ids[2]), format_offset(ids[5])
    text = (
        f"(d.event-streams-offset > '{low}' AND d.event-streams-offset <= '{high}')"
        f" OR d.event-streams-offset = '{format_offset(end)}'"
    )

    async def add_live() -> None:
        await log.append(WRITER, [EventDraft("A", {"n": 10})])  # past the bound: not sent

    messages = await subscribed_while_adding(
        amqp_server.amqp_url or "", "$events", "TRUE", sql(text), add_live
    )
    assert [props(m)["n"] for m in messages] == [3, 4, 5]


async def test_from_a_timestamp(amqp_server: EventServer) -> None:
    """A time before the stored events replays them all, then the live ones come."""
    log = amqp_server.logs.default
    for n in range(5):
        await log.append(WRITER, [EventDraft("A", {"n": n})])
    first_ms = ts_to_ms((await log.read_after(WRITER, 0, 1))[0].ts)

    async def add_live() -> None:
        await log.append(WRITER, [EventDraft("A", {"n": 5})])
        await log.append(WRITER, [EventDraft(END, {})])

    messages = await subscribed_while_adding(
        amqp_server.amqp_url or "", "$events", "TRUE", at(timestamp=first_ms - 1000), add_live
    )
    assert [props(m)["n"] for m in messages] == [0, 1, 2, 3, 4, 5]


async def partitioned(server: EventServer) -> dict[int, list[int]]:
    """Five events in each partition of ``orders``: partition -> their ids."""
    ids: dict[int, list[int]] = {}
    for n in range(5 * PARTITIONS):
        partition = n % PARTITIONS
        ids.setdefault(partition, []).append(
            await add(server, "orders", partition, "ORDER", {"n": n})
        )
    return ids


def where(messages: list[Message]) -> set[tuple[int, int]]:
    return {(props(m)["partition"], props(m)["id"]) for m in messages}


async def test_a_stream_of_partitions_from_an_offset_in_each(
    streams_server: EventServer,
) -> None:
    """One offset per partition (as FTN3's ``after``), a single offset for every partition,
    or a timestamp for all of them; then the live events of every partition."""
    ids = await partitioned(streams_server)
    url = streams_server.amqp_url or ""
    live: set[tuple[int, int]] = set()

    def adding(end: str) -> Any:
        async def add_live() -> None:
            for partition in range(PARTITIONS):
                live.add((partition, await add(streams_server, "orders", partition, "ORDER", {})))
            for partition in range(PARTITIONS):
                await add(streams_server, "orders", partition, end, {})

        return add_live

    async def subscribed(position: dict[Any, Any], end: str) -> list[Message]:
        return await subscribed_while_adding(
            url, "$events/orders", "eventType = 'ORDER'", position, adding(end),
            end=end, ends=PARTITIONS,
        )  # fmt: skip

    skip = [1, 0, 4, 2]  # events to pass over in each partition
    offsets = ",".join(str(ids[p][skip[p] - 1]) if skip[p] else "0" for p in range(PARTITIONS))
    each = await subscribed(at(offsets), "END_ONE")
    assert where(each) == {(p, i) for p in range(PARTITIONS) for i in ids[p][skip[p] :]} | live
    for partition in range(PARTITIONS):  # each partition in id order, nothing twice
        in_order = [props(m)["id"] for m in each if props(m)["partition"] == partition]
        assert in_order == sorted(set(in_order))
    assert len(each) == len(where(each))

    one = await subscribed(at(str(ids[0][2])), "END_TWO")
    after = {(p, i) for p in range(PARTITIONS) for i in ids[p] if i > ids[0][2]}
    assert where(one) == after | live

    everything = await subscribed(at(timestamp=0), "END_THREE")
    assert where(everything) == {(p, i) for p in range(PARTITIONS) for i in ids[p]} | live
    assert len(everything) == len(where(everything))


BAD = "amqp:invalid-field"


@pytest.mark.parametrize(
    ("address", "position", "says"),
    [
        ("$events", at("yesterday"), "not an offset of this log: 'yesterday'"),
        ("$events", at("-5"), "not an offset of this log"),
        ("$events", {symbol("from"): Described(ANNOTATIONS, {OFFSET: 12})}, "symbol or string"),
        ("$events", {symbol("from"): Described(ANNOTATIONS, {TIMESTAMP: "now"})}, "timestamp"),
        ("$events", {symbol("from"): Described(ANNOTATIONS, {})}, "non-empty map"),
        ("$events", sql("d.event-streams-offset >"), "cannot parse the filter"),
        ("$events", sql("d.nothing > 1"), "cannot filter on"),
        ("$events", at("1,2"), "one offset per partition"),
        ("$events/orders", at("1,2"), "one offset per partition, 4 here"),
        ("$events/orders", at("1,2,x,4"), "not an offset of this log: 'x'"),
    ],
)
async def test_a_bad_position_refuses_the_attach(
    amqp_server: EventServer, address: str, position: dict[Any, Any], says: str
) -> None:
    await amqp_server.store.add_stream("orders", PARTITIONS)
    await amqp_server.streams.refresh()
    url = amqp_server.amqp_url or ""

    def attach() -> None:
        with connected(url) as conn:
            subscribe_from(conn, address, "TRUE", position)

    with pytest.raises((LinkDetached, LinkException)) as refused:
        await in_thread(attach)
    assert BAD in str(refused.value)
    assert says in str(refused.value)

    async def add_live() -> None:
        await amqp_server.logs.default.append(WRITER, [EventDraft(END, {})])

    fine = await subscribed_while_adding(url, "$events", "TRUE", at("@latest"), add_live)
    assert fine == []
