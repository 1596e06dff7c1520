"""The storage contract of kept AMQP link termini, run against every backend (a SQLite file and a
PostgreSQL database; see :mod:`tests.support.stores`). Only what truly differs between backends
is tested elsewhere (test_store_sqlite.py, test_postgres.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from futoin_evt.domain.stream import UserId
from futoin_evt.domain.termini import KeptTerminus, TerminusKey
from futoin_evt.storage import open_store
from futoin_evt.storage.base import (
    Store,
)
from futoin_evt.storage.sql.termini import pack_ids, unpack_ids

from .support import stores
from .support.sql import execute_sql
from .support.stores import HOLD

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


def terminus(
    user: UserId, name: str, partition_key: int = 0, timeout: float = 60.0, group: str | None = None
) -> KeptTerminus:
    """A suspended link's terminus: two runs of unsettled ids, one held back."""
    key = TerminusKey(user, "container", name)
    return KeptTerminus(key, partition_key, group, 2, (3, 4, 5, 9), True, 9, (2, 3), 1, timeout)


async def test_a_kept_terminus_is_taken_once_whole(store: Store, store_db: str) -> None:
    user = await store.add_user("u", "hash")
    kept = terminus(user, "link", group="g")
    (row,) = await store.keep_termini([(kept, HOLD)], 64)
    assert row is not None
    assert await store.count_termini(user) == 1
    # kept again under its key: replaced, with a row of its own
    newer = dataclasses.replace(kept, after=10, unsettled=(10,))
    (again,) = await store.keep_termini([(newer, HOLD)], 64)
    assert again not in (None, row)
    assert await store.expire_termini([row, again], HOLD) == [again]  # the older row is gone
    # two processes resume it at once: one gets it, the other nothing
    async with await open_store(store_db) as other:
        both = await asyncio.gather(store.take_terminus(kept.key), other.take_terminus(kept.key))
    assert sorted(both, key=lambda found: found is None) == [newer, None]
    assert await store.take_terminus(kept.key) is None
    # its user, container and name find it: another container's is another terminus
    mine, theirs = (
        terminus(user, "x"),
        dataclasses.replace(terminus(user, "x"), key=TerminusKey(user, "other", "x")),
    )
    await store.keep_termini([(mine, HOLD), (theirs, HOLD)], 64)
    await store.discard_termini([mine.key])
    assert await store.take_terminus(mine.key) is None
    assert await store.take_terminus(theirs.key) == theirs


async def test_kept_termini_are_bounded_per_user_the_oldest_going_first(store: Store) -> None:
    alice = await store.add_user("alice", "hash")
    bob = await store.add_user("bob", "hash")
    first = [terminus(alice, name) for name in "abc"]
    await store.keep_termini([(t, HOLD) for t in first] + [(terminus(bob, "a"), HOLD)], 2)
    assert (await store.count_termini(alice), await store.count_termini(bob)) == (2, 1)
    assert await store.take_terminus(first[0].key) is None  # the oldest of alice went
    await store.keep_termini([(terminus(alice, "d"), HOLD)], 2)
    assert await store.take_terminus(first[1].key) is None
    assert await store.take_terminus(first[2].key) == first[2]
    assert await store.count_termini() == 2  # alice's d, bob's a


async def test_kept_termini_expire_by_the_database_clock_and_are_purged(
    store: Store, store_db: str
) -> None:
    user = await store.add_user("u", "hash")
    ended, leased, brief = (
        terminus(user, "ended"),
        terminus(user, "leased"),
        terminus(user, "brief", timeout=0),
    )
    kept = await store.keep_termini([(ended, 0.0), (leased, HOLD), (brief, 0.0)], 64)
    rows = [row for row in kept if row is not None]
    assert len(rows) == 3
    assert await store.count_termini(user) == 2  # 0 s after its end: gone at once
    # a renewal moves the expiry on; its end (grace 0) leaves the timeout; past it, gone
    assert await store.expire_termini(rows[:2], HOLD) == rows[:2]
    assert await store.expire_termini([rows[1]], -120.0) == [rows[1]]
    assert await store.count_termini(user) == 1
    assert await store.take_terminus(leased.key) is None  # expired: not resumed, and deleted
    assert await store.purge_termini() == 1  # the brief one
    names = execute_sql(store_db, "SELECT link_name FROM amqp_termini")
    assert names == [("ended",)]
    assert await store.take_terminus(ended.key) == ended


async def test_kept_termini_go_with_their_user_and_partition(store: Store) -> None:
    alice = await store.add_user("alice", "hash")
    bob = await store.add_user("bob", "hash")
    info = await store.add_stream("orders", 2)
    key = info.partitions[1].key
    await store.keep_termini([(terminus(alice, "a", key), HOLD), (terminus(bob, "b", 0), HOLD)], 64)
    await store.drop_stream("orders")
    assert await store.count_termini(alice) == 0
    assert await store.remove_user("bob")
    assert await store.count_termini() == 0
    # kept for a partition or user that is gone: not kept, no error
    rows = await store.keep_termini(
        [(terminus(alice, "a", key), HOLD), (terminus(bob, "b"), HOLD)], 64
    )
    assert rows == [None, None]


def test_event_ids_are_packed_as_runs() -> None:
    for ids in [(), (1,), (3, 4, 5, 9), (1, 2, 4, 5, 7), (9, 3, 4), tuple(range(1, 10_001))]:
        assert unpack_ids(pack_ids(ids)) == ids
    assert pack_ids(range(100, 10_100)) == "100-10099"
    assert pack_ids((3, 4, 5, 9, 11, 12)) == "3-5,9,11-12"
