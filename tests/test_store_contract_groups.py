"""The storage contract of AMQP consumer groups: one claim at a time, fenced acknowledgements, run
against every backend (a SQLite file and a PostgreSQL database; see
:mod:`tests.support.stores`). Only what truly differs between backends is tested elsewhere
(test_store_sqlite.py, test_postgres.py)."""

from __future__ import annotations

import pytest

from futoin_evt.domain.groups import GroupClaim
from futoin_evt.storage.base import (
    Store,
)

from .support import stores
from .support.stores import HOLD

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


async def test_a_consumer_group_is_held_by_one_claim_at_a_time(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD) == GroupClaim(True, 1, 1)
    # a live holder keeps it against its own epoch, no epoch, and a claim of free groups only
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD) == (False, 1, 1)
    assert await store.claim_group(user, "G", None, hold_seconds=HOLD) == (False, 1, 1)
    assert await store.claim_group(user, "G", 9, hold_seconds=HOLD, free_only=True) == (
        False,
        1,
        1,
    )
    # an equal Event Hubs owner level takes it over, so does a higher epoch
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD, equal_takes_over=True) == (
        True,
        2,
        1,
    )
    assert await store.claim_group(user, "G", 2, hold_seconds=HOLD) == (True, 3, 2)
    # another user's group of that name, and another partition's, are other groups
    other = await store.add_user("v", "hash")
    assert await store.claim_group(other, "G", None, hold_seconds=HOLD) == (True, 1, 0)
    info = await store.add_stream("orders", 2)
    orders1 = store.partition_log(info.partitions[1])
    assert await orders1.claim_group(user, "G", None, hold_seconds=HOLD) == (True, 1, 0)
    # renewing tells which holds another claim took
    assert await store.hold_groups([(user, "G", 2), (user, "G", 3)], HOLD) == [(user, "G", 2)]
    # released (an older claim releases nothing): free for any epoch; claim numbers go on
    await store.release_group(user, "G", 2)
    assert not (await store.claim_group(user, "G", None, hold_seconds=HOLD)).taken
    await store.release_group(user, "G", 3)
    assert await store.claim_group(user, "G", None, hold_seconds=HOLD) == (True, 4, 0)
    # the largest epoch a link can give is no error
    top = (1 << 63) - 1
    assert (await store.claim_group(user, "G", top, hold_seconds=HOLD)).taken
    assert await store.claim_group(user, "G", top, hold_seconds=HOLD) == (False, 5, top)
    # a hold that ran out (its process died, renewing nothing) keeps nobody out
    assert (await store.claim_group(user, "H", 7, hold_seconds=0)).taken
    assert await store.claim_group(user, "H", 1, hold_seconds=HOLD) == (True, 2, 1)


async def test_a_group_claim_fences_acknowledgements_of_older_claims(store: Store) -> None:
    user = await store.add_user("u", "hash")
    await store.register_consumer(user, "C")
    first = await store.claim_group(user, "ftn18:C", 1, hold_seconds=HOLD)
    assert await store.acknowledge_group(user, "ftn18:C", first.claim, "C", 3) == 3
    second = await store.claim_group(user, "ftn18:C", 2, hold_seconds=HOLD)
    assert second.taken
    assert await store.acknowledge_group(user, "ftn18:C", first.claim, "C", 9) is None
    assert await store.position(user, "C") == 3
    assert await store.acknowledge_group(user, "ftn18:C", second.claim, "C", 5) == 5
    assert await store.acknowledge_group(user, "ftn18:C", second.claim, "D", 5) is None
    assert await store.acknowledge_group(user, "ftn18:D", 1, "C", 7) is None  # no such group
