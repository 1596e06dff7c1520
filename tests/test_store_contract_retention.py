"""The storage contract of what bounds discarding, and deleting the oldest events, run against
every backend (a SQLite file and a PostgreSQL database; see :mod:`tests.support.stores`). Only
what truly differs between backends is tested elsewhere (test_store_sqlite.py,
test_postgres.py)."""

from __future__ import annotations

import time

import pytest

from futoin_evt.domain.stream import utc_timestamp
from futoin_evt.storage.base import (
    Store,
)

from .support import stores
from .support.stores import BIG, ids_of

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


async def test_discard_limits_and_deleting_the_oldest(store: Store) -> None:
    limits = await store.discard_limits(None)
    assert tuple(limits) == (None, 0, 0, None, None)
    for _ in range(10):
        await store.append("T", "1")
    user = await store.add_user("u", "h")
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 6)
    limits = await store.discard_limits(utc_timestamp(time.time() + 5))
    assert tuple(limits) == (6, 10, 1, 10, None)
    assert (await store.discard_limits("2000-01-01T00:00:00Z")).older_than_kept is None
    assert await store.delete_events(4, 3) == 3  # the oldest three, within the bound
    assert await store.delete_events(4, 3) == 1
    assert await store.delete_events(4, 3) == 0
    assert (await store.stream_bounds()).first_id == 5
    assert ids_of((await store.read_events(0, max_bytes=BIG)).json)[0] == 5
    assert await store.id_before("2000-01-01T00:00:00Z") == 4
