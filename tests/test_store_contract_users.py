"""The storage contract of users and the console's sessions, run against every backend (a SQLite
file and a PostgreSQL database; see :mod:`tests.support.stores`). Only what truly differs
between backends is tested elsewhere (test_store_sqlite.py, test_postgres.py)."""

from __future__ import annotations

import pytest

from futoin_evt.domain.principal import Principal
from futoin_evt.domain.sessions import SessionLimits, SessionRow
from futoin_evt.storage.base import (
    Store,
)

from .support import stores

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


async def test_users(store: Store) -> None:
    first = await store.add_user("u", "h1")
    with pytest.raises(KeyError):
        await store.add_user("u", "h2")
    admin = await store.add_user("root", "h", is_admin=True)
    assert first != admin
    assert await store.set_password("u", "h3")
    assert not await store.set_password("nobody", "h3")
    user = await store.get_user("u")
    assert user is not None
    assert (user.id, user.name, user.password_hash, user.is_admin) == (first, "u", "h3", False)
    assert [(u.name, u.is_admin) for u in await store.list_users()] == [
        ("root", True),
        ("u", False),
    ]
    await store.register_consumer(user.id, "C")
    assert await store.remove_user("u")
    assert not await store.remove_user("u")
    assert await store.get_user("u") is None
    assert await store.position(user.id, "C") is None  # consumers go with their user


async def test_console_sessions_by_digest_bounded_and_expiring(store: Store) -> None:
    """The console's rules are its own; the store keeps the rows, ends those past the limits
    given at a login (the least recently used beyond the bound), and never moves a last use
    back."""
    alice = await store.add_user("alice", "x")
    root = await store.add_user("root", "x", is_admin=True)
    limits = SessionLimits(limit=2, idle_seconds=1800.0, lifetime_seconds=43200.0)
    a, b, c, d = (bytes([n]) * 32 for n in range(4))
    assert await store.add_console_session(a, alice, 1000.0, limits) == []
    assert await store.add_console_session(b, root, 1001.0, limits) == []
    await store.touch_console_sessions([a], 1002.0)  # a is the most recently used now
    await store.touch_console_sessions([a], 1001.5)  # never back
    assert await store.add_console_session(c, alice, 1003.0, limits) == [b]
    rows = await store.console_sessions([a, b, c])
    assert rows == {
        a: SessionRow(Principal(alice, "alice", False), 1000.0, 1002.0, None),
        c: SessionRow(Principal(alice, "alice", False), 1003.0, 1003.0, None),
    }
    await store.set_console_notice(c, "done")
    await store.clear_console_notice(c, "another")  # a newer notice stays
    assert (await store.console_sessions([c]))[c].notice == "done"
    await store.clear_console_notice(c, "done")
    assert (await store.console_sessions([c]))[c].notice is None
    # a login 30 minutes after a's last use ends it (c, used since, stays)
    await store.touch_console_sessions([c], 2000.0)
    assert await store.add_console_session(d, root, 1002.0 + 1800.5, limits) == [a]
    await store.end_console_session(d)
    assert set(await store.console_sessions([a, b, c, d])) == {c}
    assert await store.console_sessions([]) == {}
    assert await store.remove_user("alice")
    assert await store.console_sessions([c]) == {}  # sessions go with their user
