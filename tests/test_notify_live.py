"""Reading notifications from a real SQLite log: push-down of pinned types, the shared ring,
management events, and the GET-EVENTS catalog."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.domain.management import CONSUMER_DROPPED, CONSUMER_REGISTERED, ManagementBus
from futoin_evt.domain.notification import Notification
from futoin_evt.domain.stream import EventDraft
from futoin_evt.log.eventlog import EventLog
from futoin_evt.notify.catalog import EventCatalog
from futoin_evt.notify.live import LiveEvents, Subscription
from futoin_evt.notify.selector import compile_selector
from futoin_evt.storage import open_store
from futoin_evt.storage.base import Store
from futoin_evt.storage.pages import rows_sql
from futoin_evt.storage.sqlite.schema import ensure_schema

from .support.notify import CASES, EVENTS, WRITER

RARE_EVERY = 100_000
LOG_SIZE = 1_000_000


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    async with await open_store(db_path) as opened:
        yield opened


async def drain(subscription: Subscription) -> list[int]:
    """Ids of everything matching up to the head, in order."""
    ids: list[int] = []
    while subscription.live.events.head > subscription.after_id:
        ids += [n.id for n in await subscription.read_log(1000) if n.id is not None]
    return ids


def big_log(path: Path) -> None:
    """A million events, one in RARE_EVERY of them RARE, written straight into the file."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    ensure_schema(conn)
    rows = (
        ("RARE" if i % RARE_EVERY == 0 else "COMMON", json.dumps({"n": i}), "2026-11-23T10:00:00Z")
        for i in range(1, LOG_SIZE + 1)
    )
    conn.executemany("INSERT INTO events (type, data, ts) VALUES (?, ?, ?)", rows)
    conn.execute("COMMIT")
    conn.close()


async def test_a_pinned_type_reads_only_its_events_from_a_million(db_path: Path) -> None:
    big_log(db_path)
    plan = sqlite3.connect(db_path).execute(
        "EXPLAIN QUERY PLAN " + rows_sql("?", 0, 1000, ["RARE"])[0], ("RARE", 0, 1000, 1000)
    )
    assert any("INDEX events_by_type" in row[3] for row in plan.fetchall())
    async with await open_store(db_path) as store:
        live = LiveEvents(EventLog(store))
        rare = Subscription(live, None, compile_selector("eventType = 'RARE'"), 0).start()
        assert await drain(rare) == list(range(RARE_EVERY, LOG_SIZE + 1, RARE_EVERY))
        assert live.rows_read == LOG_SIZE // RARE_EVERY
        assert rare.after_id == LOG_SIZE  # it knows it has seen everything up to the head


async def test_every_case_through_the_shared_ring_and_alone(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    at_head = [
        Subscription(live, None, compile_selector(selector), 0).start() for selector, _ in CASES
    ]
    for event_type, data in EVENTS:
        await events.append(WRITER, [EventDraft(event_type, data)])
    for subscription, (selector, expected) in zip(at_head, CASES, strict=True):
        assert set(await drain(subscription)) == expected, selector
    # a new subscriber behind the ring reads the store with its own push-down
    alone = LiveEvents(events, capacity=2)
    for selector, expected in CASES:
        subscription = Subscription(alone, None, compile_selector(selector), 0).start()
        assert set(await drain(subscription)) == expected, selector


async def test_the_ring_reads_each_event_once_for_all_subscribers(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    subscribers = [
        Subscription(live, None, compile_selector(f"n > {i}"), 0).start() for i in range(20)
    ]
    for i in range(50):
        await events.append(WRITER, [EventDraft("COUNT", {"n": i})])
    results = [await drain(s) for s in subscribers]
    assert [len(r) for r in results] == [49 - i for i in range(20)]
    assert live.rows_read == 50


async def test_ring_of_pinned_types_skips_the_others(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    a = Subscription(live, None, compile_selector("eventType = 'A'"), 0).start()
    b = Subscription(live, None, compile_selector("eventType IN ('B', 'A')"), 0).start()
    for i in range(30):
        await events.append(WRITER, [EventDraft("ABC"[i % 3], i)])
    assert await drain(a) == list(range(1, 31, 3))
    assert await drain(b) == sorted([*range(1, 31, 3), *range(2, 31, 3)])
    assert live.rows_read == 20
    b.close()
    a.close()


async def test_management_events_reach_matching_subscribers_only(store: Store) -> None:
    live = LiveEvents(EventLog(store))
    bus = ManagementBus()
    assert not bus.active
    mine = Subscription(
        live,
        bus,
        compile_selector(f"eventType = '{CONSUMER_REGISTERED}' AND user = 'alice'"),
        0,
        management=lambda n: True,
    ).start()
    not_allowed = Subscription(live, bus, None, 0, management=None).start()
    assert bus.active
    bus.publish(CONSUMER_REGISTERED, user="bob", component="C")
    bus.publish(CONSUMER_REGISTERED, user="alice", component="C")
    bus.publish(CONSUMER_DROPPED, user="alice", component="C", by="alice", reason="dropped")
    got = await asyncio.wait_for(mine.next(), 5)
    assert [(n.type, n.data["component"], n.data["user"]) for n in got] == [
        (CONSUMER_REGISTERED, "C", "alice")
    ]
    assert not not_allowed.has_more()
    mine.close()
    not_allowed.close()
    assert not bus.active


async def test_catalog_lists_declared_and_seen_types(store: Store) -> None:
    events = EventLog(store)
    catalog = EventCatalog(events)
    await events.append(
        WRITER, [EventDraft("ORDER", {"total": 1, "region": "EU", "items": [1], "meta": {"a": 1}})]
    )
    await events.append(WRITER, [EventDraft("ORDER", {"total": 2, "express": True})])
    await events.append(WRITER, [EventDraft("USER", ["not", "a", "map"])])
    first = await catalog.event_types()
    base = ["eventType", "id", "ts", "stream", "partition"]
    assert first["ORDER"] == [*base, "total", "region", "express"]
    assert first["USER"] == base
    assert first[CONSUMER_REGISTERED] == [
        "eventType", "ts", "stream", "partition", "user", "component", "transport",
    ]  # fmt: skip
    await events.append(WRITER, [EventDraft("USER", {"name": "x"})])
    assert await catalog.event_types("USER") == {"USER": [*base, "name"]}
    assert await catalog.event_types("NOPE") == {}
    assert catalog.seen_up_to == 4


async def test_shared_selectors_each_get_every_event_and_others_none_of_theirs(
    store: Store,
) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    selectors = {
        "all": "n >= 0 OR n IS NULL",
        "a_big": "eventType = 'A' AND n > 10",
        "ab": "eventType IN ('A', 'B') AND n <> 7",
        "c": "eventType = 'C'",
    }
    # three subscribers of each selector: the same text is evaluated once for them all
    subscribers = {
        name: [Subscription(live, None, compile_selector(text), 0).start() for _ in range(3)]
        for name, text in selectors.items()
    }
    added: list[tuple[int, str, int]] = []
    for i in range(60):
        event_type = "ABC"[i % 3]
        added.append(
            (
                await events.append(WRITER, [EventDraft(event_type, {"n": i})]),
                event_type,
                i,
            )
        )
    expected = {
        "all": [id_ for id_, _, _ in added],
        "a_big": [id_ for id_, t, n in added if t == "A" and n > 10],
        "ab": [id_ for id_, t, n in added if t in "AB" and n != 7],
        "c": [id_ for id_, t, _ in added if t == "C"],
    }
    for name, of_selector in subscribers.items():
        for subscription in of_selector:
            assert await drain(subscription) == expected[name], name
    # each selector over the events of its pinned types, once: 60 + 20 + 40 + 20
    assert live.evaluations == 140
    assert live.rows_read == 60
    for of_selector in subscribers.values():
        for subscription in of_selector:
            subscription.close()


async def test_a_shared_selector_serves_subscribers_at_different_positions(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events, capacity=2000)
    selector = compile_selector("eventType = 'A' AND n > 2")
    first = Subscription(live, None, selector, 0).start()
    for i in range(10):
        await events.append(WRITER, [EventDraft("AB"[i % 2], {"n": i})])
    at_ten = events.head
    assert [n.data["n"] for n in await first.read_log(2)] == [4, 6]
    # one that starts later, and one that starts before the shared result began
    later = Subscription(live, None, selector, at_ten).start()
    behind = Subscription(live, None, selector, 0).start()
    for i in range(10, 3010):
        await events.append(WRITER, [EventDraft("AB"[i % 2], {"n": i})])
    wanted = [i for i in range(3010) if i % 2 == 0 and i > 2]
    assert [n.data["n"] for n in await _all(first)] == wanted[2:]
    assert [n.data["n"] for n in await _all(later)] == [i for i in wanted if i >= 10]
    assert [n.data["n"] for n in await _all(behind)] == wanted
    for subscription in (first, later, behind):
        subscription.close()


async def test_sharing_ends_with_the_last_subscriber_of_a_selector(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    one = Subscription(live, None, compile_selector("n > 0"), 0).start()
    two = Subscription(live, None, compile_selector("n > 0"), 0).start()
    other = Subscription(live, None, compile_selector("n > 1"), 0).start()
    await events.append(WRITER, [EventDraft("X", {"n": 1})])
    await events.append(WRITER, [EventDraft("X", {"n": 2})])
    assert await drain(one) == [1, 2]
    one.close()
    assert await drain(two) == [1, 2]
    two.close()
    await events.append(WRITER, [EventDraft("X", {"n": 3})])
    assert await drain(other) == [2, 3]
    assert live.evaluations == 2 + 3  # both selectors over the first two, then one
    again = Subscription(live, None, compile_selector("n > 0"), events.head).start()
    await events.append(WRITER, [EventDraft("X", {"n": 4})])
    assert await drain(again) == [4]
    other.close()
    again.close()


async def _all(subscription: Subscription) -> list[Notification]:
    got: list[Notification] = []
    while subscription.live.events.head > subscription.after_id:
        got += await subscription.read_log(1000)
    return got
