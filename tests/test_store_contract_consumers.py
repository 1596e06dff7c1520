"""The storage contract of registered consumers: positions, claims, reads, listing, lags, expiry,
counts, run against every backend (a SQLite file and a PostgreSQL database; see
:mod:`tests.support.stores`). Only what truly differs between backends is tested elsewhere
(test_store_sqlite.py, test_postgres.py)."""

from __future__ import annotations

import json

import pytest

from futoin_evt.domain.stream import UserId
from futoin_evt.storage.base import (
    Store,
)

from .support import stores
from .support.sql import execute_sql
from .support.stores import BIG, TS_RE, ids_of

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


async def test_consumer_positions_move_only_forward(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.position(user, "C") is None
    assert await store.acknowledge(user, "C", 5) is None
    assert await store.register_consumer(user, "C") is True
    assert await store.register_consumer(user, "C") is False
    assert await store.position(user, "C") == 0
    assert await store.acknowledge(user, "C", 5) == 5
    assert await store.acknowledge(user, "C", 3) == 5
    assert await store.position(user, "C") == 5
    # an operator's seek may go back
    assert await store.set_position(user, "C", 2)
    assert await store.position(user, "C") == 2
    assert not await store.set_position(user, "OTHER", 2)


async def test_a_claim_fences_acknowledgements_of_older_claims(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.claim_consumer(user, "C") is None
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 2)
    first = await store.claim_consumer(user, "C")
    assert first is not None
    assert first[1] == 2
    assert await store.acknowledge(user, "C", 4, epoch=first[0]) == 4
    second = await store.claim_consumer(user, "C")
    assert second is not None
    assert second == (first[0] + 1, 4)
    assert await store.acknowledge(user, "C", 9, epoch=first[0]) is None  # the older stream
    assert await store.position(user, "C") == 4
    assert await store.acknowledge(user, "C", 9, epoch=second[0]) == 9
    assert await store.acknowledge(user, "C", 10) == 10  # a poll is not fenced


async def test_consumer_reads_start_at_the_position_or_later(store: Store) -> None:
    user = await store.add_user("u", "hash")
    for i in range(6):
        await store.append("A" if i % 2 else "B", str(i))
    assert await store.read_consumer_events(user, "C", max_bytes=BIG) is None
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 2)
    page = await store.read_consumer_events(user, "C", max_bytes=BIG)
    assert page is not None
    assert (ids_of(page.json), page.start_id) == ([3, 4, 5, 6], 2)
    page = await store.read_consumer_events(user, "C", at_least=4, types=["A"], max_bytes=BIG)
    assert page is not None
    assert (ids_of(page.json), page.start_id, page.head_id) == ([6], 4, 6)
    ranged = await store.read_range(user, "C", 3, 5, max_bytes=BIG, data_as_text=True)
    assert ranged is not None
    assert [(e["id"], e["data"]) for e in json.loads(ranged.json)] == [("4", "3"), ("5", "4")]
    assert ranged.start_id == 2
    assert await store.position(user, "C") == 2  # reading never moves it
    assert await store.read_range(user, "NONE", 0, None, max_bytes=BIG) is None


async def test_consumer_listing_lag_and_dropping(store: Store) -> None:
    alice = await store.add_user("alice", "h")
    bob = await store.add_user("bob", "h")
    await store.register_consumer(alice, "A")
    await store.register_consumer(bob, "B")
    for _ in range(4):
        await store.append("T", "1")
    await store.acknowledge(alice, "A", 3)
    rows = await store.consumers()
    assert [(r.user, r.user_id, r.component, r.position, r.behind) for r in rows] == [
        ("alice", alice, "A", 3, 1),
        ("bob", bob, "B", 0, 4),
    ]
    assert rows[0].oldest_unread_ts is not None
    assert TS_RE.match(rows[0].registered_at)
    assert TS_RE.match(rows[0].last_seen_at)
    assert [r.component for r in await store.consumers(bob)] == ["B"]
    assert await store.lowest_consumer() == ("bob", bob, "B")
    assert await store.consumer_state(alice, "A") == (3, 4)
    assert await store.drop_consumer(bob, "B")
    assert not await store.drop_consumer(bob, "B")
    assert await store.lowest_consumer() == ("alice", alice, "A")


async def test_consumer_lags_in_one_pass_equal_the_listing(store: Store) -> None:
    """The metrics' read: the same rows as :meth:`consumers`, with gaps in the ids (discarded
    events), consumers at one position, at the head and before the oldest event kept."""
    alice = await store.add_user("alice", "h")
    bob = await store.add_user("bob", "h")
    for _ in range(20):
        await store.append("T", "1")
    await store.delete_events(5, 1000)  # ids 1-5 gone
    positions = {"A": 0, "B": 7, "C": 7, "D": 20, "E": 12}
    for component, position in positions.items():
        user = alice if component < "D" else bob
        await store.register_consumer(user, component)
        await store.acknowledge(user, component, position)
    for _ in range(3):
        await store.append("T", "1")
    listed = await store.consumers()
    assert await store.consumer_lags(100) == listed
    assert [r.behind for r in listed] == [18, 16, 16, 3, 11]
    assert [r.component for r in await store.consumer_lags(2)] == ["A", "B"]
    assert await store.count_consumers() == 5


async def test_consumers_not_seen_expire_unless_touched(store: Store, store_db: str) -> None:
    user = await store.add_user("u", "h")
    await store.register_consumer(user, "OLD")
    await store.register_consumer(user, "SEEN")
    await store.register_consumer(user, "CONNECTED")
    long_ago = "2001-01-01T00:00:00Z"
    execute_sql(store_db, "UPDATE consumers SET last_seen_at = ?", (long_ago,))
    await store.register_consumer(user, "SEEN")  # registering again counts as seen
    await store.touch_consumers([(user, "CONNECTED"), (UserId(user + 100), "NONE")])
    await store.touch_consumers([])
    assert await store.expire_consumers(long_ago) == []
    assert await store.expire_consumers("2002-01-01T00:00:00Z") == [("u", "OLD")]
    assert [r.component for r in await store.consumers()] == ["CONNECTED", "SEEN"]


async def test_consumers_are_counted_by_partition_in_one_read(store: Store) -> None:
    alice = await store.add_user("alice", "x")
    bob = await store.add_user("bob", "x")
    info = await store.add_stream("orders", 2)
    one = store.partition_log(info.partitions[1])
    await store.register_consumer(alice, "A")
    for user, component in ((alice, "A"), (alice, "B"), (bob, "A")):
        await one.register_consumer(user, component)
    key = info.partitions[1].key
    assert await store.consumer_counts() == {0: 1, key: 3}
    assert await store.consumer_counts(bob) == {key: 1}
    await store.drop_stream("orders")
    assert await store.consumer_counts() == {0: 1}
