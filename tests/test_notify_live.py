"""Reading notifications from a real SQLite log: push-down of pinned types, the shared ring,
management events, and the GET-EVENTS catalog."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.log.eventlog import EventLog
from futoin_evt.notify.catalog import EventCatalog
from futoin_evt.notify.live import LiveEvents, Subscription
from futoin_evt.notify.management import CONSUMER_DROPPED, CONSUMER_REGISTERED, ManagementBus
from futoin_evt.notify.selector import compile_selector
from futoin_evt.storage import open_store
from futoin_evt.storage.base import Store
from futoin_evt.storage.pages import rows_sql
from futoin_evt.storage.schema import ensure_schema

from .notify_cases import CASES, EVENTS

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
        await events.append(event_type, data)
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
        await events.append("COUNT", {"n": i})
    results = [await drain(s) for s in subscribers]
    assert [len(r) for r in results] == [49 - i for i in range(20)]
    assert live.rows_read == 50


async def test_ring_of_pinned_types_skips_the_others(store: Store) -> None:
    events = EventLog(store)
    live = LiveEvents(events)
    a = Subscription(live, None, compile_selector("eventType = 'A'"), 0).start()
    b = Subscription(live, None, compile_selector("eventType IN ('B', 'A')"), 0).start()
    for i in range(30):
        await events.append("ABC"[i % 3], i)
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
    await events.append("ORDER", {"total": 1, "region": "EU", "items": [1], "meta": {"a": 1}})
    await events.append("ORDER", {"total": 2, "express": True})
    await events.append("USER", ["not", "a", "map"])
    first = await catalog.event_types()
    base = ["eventType", "id", "ts", "stream", "partition"]
    assert first["ORDER"] == [*base, "total", "region", "express"]
    assert first["USER"] == base
    assert first[CONSUMER_REGISTERED] == [
        "eventType", "ts", "stream", "partition", "user", "component", "transport",
    ]  # fmt: skip
    await events.append("USER", {"name": "x"})
    assert await catalog.event_types("USER") == {"USER": [*base, "name"]}
    assert await catalog.event_types("NOPE") == {}
    assert catalog.seen_up_to == 4
