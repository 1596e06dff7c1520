"""FTN18 native extension: add an event inside a transaction the application already holds.

The application writes its business data and the event on one connection to the event
database file; both commit together or not at all. A running server picks the event up like
any other (its id is allocated under SQLite's write lock, so ids stay in commit order).

Example::

    with sqlite3.connect("events.sqlite") as conn:      # commits on success
        conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
        add_event(conn, "XFER", {"account": 7, "amount": -10})
"""

from __future__ import annotations

import sqlite3
from typing import Any

import aiosqlite

from ..domain.stream import EventId
from .checksums import native_row
from .schema import INSERT_EVENT


def add_event(conn: sqlite3.Connection, event_type: str, data: Any) -> EventId:
    """Insert an event in the caller's transaction; it is visible to consumers after commit.

    Raises :class:`futoin_evt.domain.stream.EventRejected` for a bad type or data.
    """
    cursor = conn.execute(INSERT_EVENT, native_row(event_type, data))
    assert cursor.lastrowid is not None
    return EventId(cursor.lastrowid)


async def add_event_async(conn: aiosqlite.Connection, event_type: str, data: Any) -> EventId:
    """:func:`add_event` for an application on aiosqlite."""
    cursor = await conn.execute(INSERT_EVENT, native_row(event_type, data))
    assert cursor.lastrowid is not None
    return EventId(cursor.lastrowid)
