"""The FTN18 services through a real server on 127.0.0.1, with our asyncio client."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from futoin_evt.auth.users import Authenticator
from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.ftn3.messages import parse_request
from futoin_evt.server.app import EventServer, build_registry
from futoin_evt.server.executor import Channel, Executor

from .support.servers import ClientFactory

pytestmark = pytest.mark.functional

DATA_KINDS: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    3.25,
    "",
    "text é ✓",
    [],
    [1, "a", None],
    {},
    {"n": {"d": [1]}},
]


async def _drain(client: EventStreamClient, component: str, **kw: Any) -> list[Any]:
    """Poll until empty, acknowledging as a reliable consumer does."""
    seen: list[Any] = []
    last_id: int | None = None
    while True:
        events = await client.poll_events(component, last_id, **kw)
        if not events:
            return seen
        seen.extend(events)
        last_id = events[-1].id


async def test_add_and_poll_every_json_kind(alice: EventStreamClient) -> None:
    ids = [await alice.add_event("KIND", data) for data in DATA_KINDS]
    assert ids == sorted(ids)
    await alice.register_consumer("READER")
    events = await _drain(alice, "READER")
    assert [e.id for e in events] == ids
    assert [e.data for e in events] == DATA_KINDS
    assert all(e.type == "KIND" for e in events)
    assert all(len(e.ts) == 20 and e.ts.endswith("Z") for e in events)


async def test_register_is_idempotent_and_live_is_refused(alice: EventStreamClient) -> None:
    assert await alice.register_consumer("C") is True
    assert await alice.register_consumer("C") is True
    with pytest.raises(RemoteError) as info:
        await alice.register_consumer("LIVE")
    assert info.value.name == "LiveNotAllowed"


async def test_unregistered_reliable_poll(alice: EventStreamClient) -> None:
    with pytest.raises(RemoteError) as info:
        await alice.poll_events("NOBODY")
    assert info.value.name == "NotRegistered"
    with pytest.raises(RemoteError) as info:
        await alice.poll_events("NOBODY", last_id=1)
    assert info.value.name == "NotRegistered"


async def test_position_moves_only_on_acknowledgement_and_only_forward(
    alice: EventStreamClient, server: EventServer
) -> None:
    ids = [await alice.add_event("E", i) for i in range(5)]
    await alice.register_consumer("C")
    first = await alice.poll_events("C")
    assert [e.id for e in first] == ids
    # not acknowledged yet: the same events again
    assert [e.id for e in await alice.poll_events("C")] == ids
    assert [e.id for e in await alice.poll_events("C", last_id=ids[2])] == ids[3:]
    # a lower last_id does not rewind
    assert [e.id for e in await alice.poll_events("C", last_id=ids[0])] == ids[3:]
    user = await server.store.get_user("alice")
    assert user is not None
    assert await server.store.position(user.id, "C") == ids[2]


async def test_want_filters_and_skips_ahead(alice: EventStreamClient, server: EventServer) -> None:
    await alice.register_consumer("C")
    a1 = await alice.add_event("A", 1)
    await alice.add_event("B", 2)
    a2 = await alice.add_event("A", 3)
    b_last = await alice.add_event("B", 4)
    events = await alice.poll_events("C", want=["A"])
    assert [e.id for e in events] == [a1, a2]
    assert await alice.poll_events("C", last_id=a2, want=["A"]) == []
    user = await server.store.get_user("alice")
    assert user is not None
    # nothing wanted was left: the unwanted tail counts as delivered
    assert await server.store.position(user.id, "C") == b_last


async def test_live_polls_without_registering_and_stores_nothing(
    alice: EventStreamClient,
) -> None:
    ids = [await alice.add_event("L", i) for i in range(3)]
    assert [e.id for e in await alice.poll_events("LIVE")] == ids
    assert [e.id for e in await alice.poll_events("LIVE", last_id=ids[0])] == ids[1:]
    assert [e.id for e in await alice.poll_events("LIVE")] == ids


async def test_consumers_are_per_user(alice: EventStreamClient, bob: EventStreamClient) -> None:
    ids = [await alice.add_event("E", i) for i in range(3)]
    await alice.register_consumer("ARCHIVE")
    with pytest.raises(RemoteError) as info:
        await bob.poll_events("ARCHIVE")
    assert info.value.name == "NotRegistered"
    await bob.register_consumer("ARCHIVE")
    await alice.poll_events("ARCHIVE", last_id=ids[-1])
    # bob's ARCHIVE is his own: alice's acknowledgement did not move it
    assert [e.id for e in await bob.poll_events("ARCHIVE")] == ids


async def test_replies_stay_within_each_version_limit(alice: EventStreamClient) -> None:
    payload = "x" * 20_000
    await asyncio.gather(*(alice.add_event("BIG", payload) for _ in range(10)))
    await alice.register_consumer("C")
    via_10 = await alice.poll_events("C", iface="futoin.evt.poll:1.0")
    via_push = await alice.poll_events("C", iface="futoin.evt.push:1.1")
    via_11 = await alice.poll_events("C", iface="futoin.evt.poll:1.1")
    assert len(via_10) == len(via_push) == 3  # 64 KiB
    assert len(via_11) == 10  # 8 MiB


async def test_a_poll_reads_what_was_added_after_its_page_was_read_ahead(
    alice: EventStreamClient,
) -> None:
    """A consumer behind gets its next page read ahead; when that page ended at the newest
    event, the poll that comes for it reads again: an event acknowledged meanwhile is in it."""
    await alice.register_consumer("C")
    big = [await alice.add_event("BIG", "x" * 20_000) for _ in range(4)]
    first = await alice.poll_events("C", iface="futoin.evt.poll:1.0")
    assert [e.id for e in first] == big[:3]  # 64 KiB: full, the page after it is read ahead
    added = await alice.add_event("E", {})
    second = await alice.poll_events("C", big[2], iface="futoin.evt.poll:1.0")
    assert [e.id for e in second] == [big[3], added]


async def test_at_most_1000_events_per_poll(alice: EventStreamClient) -> None:
    await asyncio.gather(*(alice.add_event("E", i) for i in range(1200)))
    assert len(await alice.poll_events("LIVE")) == 1000


async def test_event_too_large_for_any_reply_is_refused(alice: EventStreamClient) -> None:
    with pytest.raises(RemoteError) as info:
        await alice.add_event("BIG", "x" * 65_300)
    assert info.value.name == "InvalidRequest"
    assert await alice.poll_events("LIVE") == []


async def test_request_over_64k_is_refused_and_connection_lives(alice: EventStreamClient) -> None:
    with pytest.raises(RemoteError) as info:
        await alice.add_event("BIG", "x" * 70_000)
    assert info.value.name == "InvalidRequest"
    assert await alice.ping(5) == 5


async def test_ping_through_every_iface(alice: EventStreamClient) -> None:
    for iface in (
        "futoin.ping:1.0",
        "futoin.evt.gen:1.0",
        "futoin.evt.poll:1.1",
        "futoin.evt.push:1.0",
    ):
        assert await alice.ftn3.call(iface, "ping", {"echo": 42}) == {"echo": 42}


@pytest.mark.parametrize(
    ("credentials", "f", "error"),
    [
        ("alice:wrong", "futoin.evt.gen:1.1:addEvent", "SecurityError"),
        ("nobody:x", "futoin.evt.gen:1.1:addEvent", "SecurityError"),
        (None, "futoin.evt.gen:1.1:addEvent", "SecurityError"),
        (None, "futoin.evt.gen:1.9:addEvent", "UnknownInterface"),
        (None, "futoin.evt.gen:1.1:nope", "UnknownInterface"),
        (None, "futoin.evt.other:1.0:nope", "UnknownInterface"),
        ("alice:alice-pw", "futoin.evt.gen:1.1:nope", "InvalidRequest"),
        ("alice:alice-pw", "futoin.evt.gen:2.0:addEvent", "NotSupportedVersion"),
        ("alice:alice-pw", "futoin.evt.other:1.0:nope", "UnknownInterface"),
    ],
)
async def test_security_and_probing(
    server: EventServer, credentials: str | None, f: str, error: str
) -> None:
    iface, _, func = f.rpartition(":")
    async with await FTN3Client.connect(server.url, credentials=credentials) as client:
        with pytest.raises(RemoteError) as info:
            await client.call(iface, func, {"type": "A", "data": 1})
        assert info.value.name == error


async def test_gen_needs_a_secure_channel(server: EventServer) -> None:
    """Plain ws from a peer that is not on loopback (and not trusted) may not add events."""
    executor = Executor(build_registry(), Authenticator(server.store))
    assert server.doors is not None
    remote = Channel(peer="192.0.2.7:40000", secure=False, routes=server.doors.open("/"))

    async def call(f: str, params: dict[str, Any]) -> dict[str, Any]:
        msg = {"rid": "C1", "f": f, "p": params, "sec": "alice:alice-pw"}
        reply: dict[str, Any] = json.loads(await executor.call(parse_request(msg), 100, remote))
        return reply

    refused = await call("futoin.evt.gen:1.1:addEvent", {"type": "A", "data": 1})
    assert (refused["e"], refused["edesc"]) == ("SecurityError", "Insecure channel")
    assert await call("futoin.evt.poll:1.1:pollEvents", {"component": "LIVE"}) == {
        "r": [],
        "rid": "C1",
    }


async def test_eight_producers_and_a_poller_see_every_id_once_in_order(
    connect: ClientFactory,
) -> None:
    producers = [await connect("alice") for _ in range(8)]
    consumer = await connect("bob")
    await consumer.register_consumer("ORDERED")
    per_producer = 250
    done = asyncio.Event()

    async def produce(client: EventStreamClient, n: int) -> list[int]:
        ids: list[int] = []
        for start in range(0, per_producer, 4):
            # a few in flight per producer, so commits interleave between connections
            calls = (client.add_event("P", {"p": n, "i": i}) for i in range(start, start + 4))
            ids.extend(await asyncio.gather(*calls))
        return ids

    async def consume() -> list[int]:
        seen: list[int] = []
        last_id = None
        while True:
            producers_done = done.is_set()  # before the poll: its reply then sees them all
            events = await consumer.poll_events("ORDERED", last_id)
            seen.extend(e.id for e in events)
            if events:
                last_id = events[-1].id
            elif producers_done:
                return seen

    consumer_task = asyncio.create_task(consume())
    produced = await asyncio.gather(*(produce(c, n) for n, c in enumerate(producers)))
    done.set()
    seen = await consumer_task
    all_ids = sorted(i for ids in produced for i in ids)
    assert seen == all_ids
    assert len(set(seen)) == len(seen)
    for ids in produced:
        assert ids == sorted(ids)


async def test_many_calls_in_flight_on_one_connection(alice: EventStreamClient) -> None:
    kinds = [random.choice(["A", "B"]) for _ in range(300)]
    ids = await asyncio.gather(*(alice.add_event(k, i) for i, k in enumerate(kinds)))
    assert sorted(ids) == list(range(1, 301))
    by_id = {e.id: e for e in await alice.poll_events("LIVE")}
    # every reply names the id of that call's own event
    for i, event_id in enumerate(ids):
        assert (by_id[event_id].type, by_id[event_id].data) == (kinds[i], i)
