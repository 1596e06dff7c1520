"""DCB appends that reach the store together share one commit: each condition is checked in
queue order, against what was stored before and the batch's appends before it, and an
append that is refused is refused alone. On both backends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from futoin_evt.domain.dcb import (
    AppendCondition,
    AppendConditionFailed,
    EventIdConflict,
    NewEvent,
    Query,
    QueryItem,
    new_event,
)
from futoin_evt.storage import open_store
from futoin_evt.storage.base import DcbLog, Store

from .support.dcb import assert_no_lost_update
from .support.sql import execute_sql

pytestmark = pytest.mark.functional

#: Concurrent appenders on one tag, and the appends each one gets through.
APPENDERS = 32
WINS_EACH = 3
#: A read backwards from here starts at the newest event.
NEWEST = 2**63 - 1


def tagged(tag: str, *more: str, data: object = None, event_id: str | None = None) -> NewEvent:
    return new_event("Subscribed", data, [tag, *more], event_id)


def on_tag(tag: str, after: int | None) -> AppendCondition:
    return AppendCondition(Query((QueryItem(tags=frozenset([tag])),)), after)


async def stored(log: DcbLog) -> list[tuple[int, tuple[str, ...], str]]:
    """Every event of the log: (position, tags, data)."""
    events, _head = await log.dcb_read(Query(), after=0, before=None, limit=1000)
    return [(e.position, e.tags, e.data_json) for e in events]


async def together(
    log: DcbLog, appends: Sequence[tuple[Sequence[NewEvent], AppendCondition | None]]
) -> list[int | BaseException]:
    """The appends queued in one go (in order), each one's position or refusal."""
    return await asyncio.gather(
        *(log.dcb_append(events, condition) for events, condition in appends),
        return_exceptions=True,
    )


async def test_a_refused_append_in_a_batch_is_refused_alone_and_order_is_kept(
    store: Store,
) -> None:
    assert await store.dcb_append([tagged("course:c1", data=0)], None) == 1
    results = await together(
        store,
        [
            ([tagged("student:s1", data=1)], on_tag("student:s1", 1)),
            # fails on the event the append before it in the batch stored
            ([tagged("student:s1", data=2)], on_tag("student:s1", 1)),
            # fails on an event stored before the batch
            ([tagged("course:c1", data=3)], on_tag("course:c1", 0)),
            ([tagged("student:s2", data=4)], on_tag("student:s2", 1)),
            # an event of this batch at or before ``after`` does not count
            ([tagged("student:s1", data=5)], on_tag("student:s1", 2)),
            ([tagged("student:s3", data=6), tagged("student:s3", data=7)], None),
        ],
    )
    assert results[0] == 2
    assert isinstance(results[1], AppendConditionFailed)
    assert results[1].position == 2
    assert isinstance(results[2], AppendConditionFailed)
    assert results[2].position == 1
    assert results[3:] == [3, 4, 6]
    assert await stored(store) == [
        (1, ("course:c1",), "0"),
        (2, ("student:s1",), "1"),
        (3, ("student:s2",), "4"),
        (4, ("student:s1",), "5"),
        (5, ("student:s3",), "6"),
        (6, ("student:s3",), "7"),
    ]
    # the condition still sees everything: nothing after 4 has student:s1
    assert await store.dcb_append([tagged("student:s1", data=8)], on_tag("student:s1", 4)) == 7


async def test_retries_and_conflicting_ids_within_one_batch(store: Store) -> None:
    first = tagged("order:o1", data=1, event_id="o1-placed")
    results = await together(
        store,
        [
            ([first], None),
            ([first], None),  # a retry of the append before it: its position, nothing stored
            ([tagged("order:o1", data=2, event_id="o1-placed")], None),  # other content
            ([tagged("order:o2", data=3, event_id="o2-placed")], on_tag("order:o1", 0)),
            ([tagged("order:o3", data=4, event_id="o3-placed")], on_tag("order:o3", 0)),
        ],
    )
    assert results[:2] == [1, 1]
    assert isinstance(results[2], EventIdConflict)
    assert isinstance(results[3], AppendConditionFailed)
    assert results[3].position == 1
    assert results[4] == 2
    assert [(p, d) for p, _tags, d in await stored(store)] == [(1, "1"), (2, "4")]
    # o2 was refused: its id is free
    assert await store.dcb_append([tagged("order:o2", data=3, event_id="o2-placed")], None) == 3


async def test_a_tag_key_condition_sees_the_batch_before_it(store: Store) -> None:
    """The draft form's bare tag key matches every value, in the batch as in the store."""
    key_only = AppendCondition(Query((QueryItem(tag_keys=frozenset(["room"])),)), 0)
    typed = AppendCondition(Query((QueryItem(types=frozenset(["Subscribed"])),)), 0)
    results = await together(
        store,
        [
            ([tagged("room:r1", data=1)], None),
            ([tagged("other", data=2)], key_only),
            ([tagged("other", data=3)], typed),
            ([tagged("other", data=4)], AppendCondition(Query(), 0)),
        ],
    )
    assert results[0] == 1
    for refused in results[1:]:
        assert isinstance(refused, AppendConditionFailed)
        assert refused.position == 1
    assert len(await stored(store)) == 1


async def appender(log: DcbLog, tag: str, number: int, wins: list[tuple[int, int]]) -> None:
    """Read the tag, append on the condition that nothing came after what was read, read
    again when refused; until ``WINS_EACH`` appends went through. Keeps (after, position)."""
    query = Query((QueryItem(tags=frozenset([tag])),))
    won = 0
    while won < WINS_EACH:
        events, _head = await log.dcb_read(query, after=None, before=NEWEST, limit=1)
        after = events[0].position if events else 0
        try:
            position = await log.dcb_append(
                [tagged(tag, data=[number, won])], AppendCondition(query, after)
            )
        except AppendConditionFailed as exc:
            refused_at = exc.position
        else:
            wins.append((after, position))
            won += 1
            continue
        assert refused_at > after


async def test_concurrent_conditional_appends_on_one_tag_from_two_stores(
    store: Store, store_db: str
) -> None:
    """32 appenders, half on each of two stores on one database (as two processes)."""
    async with await open_store(store_db) as other:
        wins: list[tuple[int, int]] = []
        async with asyncio.timeout(120):
            await asyncio.gather(
                *(appender(store if n % 2 else other, "seat:s1", n, wins) for n in range(APPENDERS))
            )
    assert_no_lost_update(wins, APPENDERS * WINS_EACH)
    tagged_events = [p for p, tags, _ in await stored(store) if "seat:s1" in tags]
    assert tagged_events == sorted(position for _, position in wins)


TAGS = st.sampled_from(["a:1", "a:2", "b:1", "b"])
QUERY_ITEMS = st.builds(
    QueryItem,
    types=st.frozensets(st.sampled_from(["T1", "T2"]), max_size=1),
    tags=st.frozensets(TAGS, max_size=2),
    tag_keys=st.frozensets(st.sampled_from(["a", "b"]), max_size=1),
)
APPENDS = st.lists(
    st.tuples(
        st.lists(
            st.tuples(
                st.sampled_from(["T1", "T2"]),
                st.lists(TAGS, max_size=2, unique=True),
                st.none() | st.sampled_from(["i1", "i2", "i3"]),
            ),
            min_size=1,
            max_size=2,
            unique_by=lambda event: event[2] or object(),
        ),
        st.none()
        | st.builds(
            AppendCondition,
            st.builds(Query, st.lists(QUERY_ITEMS, max_size=2).map(tuple)),
            st.none() | st.integers(0, 6),
        ),
    ),
    min_size=1,
    max_size=8,
)


def outcome(result: int | BaseException) -> object:
    if isinstance(result, AppendConditionFailed):
        return ("AppendConditionFailed", result.position)
    if isinstance(result, BaseException):
        return type(result).__name__
    return result


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """Makes an empty database of each backend, each call (on PostgreSQL: the test database,
    emptied again)."""
    if request.param == "sqlite":
        made = itertools.count()
        return lambda: str(tmp_path / f"{next(made)}.sqlite")
    url = str(request.getfixturevalue("pg_database"))

    def emptied() -> str:
        execute_sql(url, "DROP SCHEMA public CASCADE")
        execute_sql(url, "CREATE SCHEMA public")
        return url

    return emptied


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(appends=APPENDS)
def test_a_batch_ends_as_the_same_appends_one_after_another(
    fresh_db: Callable[[], str],
    appends: list[tuple[list[tuple[str, list[str], str | None]], AppendCondition | None]],
) -> None:
    """Whatever the appends (retries, conflicting ids, conditions on what the batch itself
    adds), committing them together gives each the result, and the log the events, that
    appending them one after another gives."""
    batch = [
        ([new_event(t, [n], tags, i) for n, (t, tags, i) in enumerate(events)], condition)
        for events, condition in appends
    ]

    async def run() -> tuple[list[object], list[object], list[object], list[object]]:
        async with await open_store(fresh_db()) as store:
            joined = [outcome(r) for r in await together(store, batch)]
            joined_log = await stored(store)
        async with await open_store(fresh_db()) as store:
            alone: list[object] = []
            for events, condition in batch:
                try:
                    alone.append(await store.dcb_append(events, condition))
                except (AppendConditionFailed, EventIdConflict) as exc:
                    alone.append(outcome(exc))
            alone_log = await stored(store)
        return joined, alone, list(joined_log), list(alone_log)

    joined, alone, joined_log, alone_log = asyncio.run(run())
    assert joined == alone
    assert joined_log == alone_log
