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
from collections.abc import Sequence
from typing import Any

import aiosqlite

from ...domain.partition import DEFAULT_PARTITION
from ...domain.stream import EventId
from ..checksums import native_row
from ..sql.schemas import check_data, check_data_async
from .schema import INSERT_EVENT

#: The stream the native API adds to (its one partition's table is ``events``).
_STREAM = DEFAULT_PARTITION.stream


def add_event(conn: sqlite3.Connection, event_type: str, data: Any) -> EventId:
    """Insert an event in the caller's transaction; it is visible to consumers after commit.

    Raises :class:`futoin_evt.domain.stream.EventRejected` for a bad type or data, and
    :class:`futoin_evt.domain.schemas.EventDataInvalid` (one) when the type's schema on the
    stream ``events`` refuses the data: the newest live version, read in the transaction.
    """
    values = native_row(event_type, data)
    check_data(
        lambda sql, params: conn.execute(sql, params).fetchall(), _STREAM, event_type, data, "?"
    )
    cursor = conn.execute(INSERT_EVENT, values)
    assert cursor.lastrowid is not None
    return EventId(cursor.lastrowid)


async def add_event_async(conn: aiosqlite.Connection, event_type: str, data: Any) -> EventId:
    """:func:`add_event` for an application on aiosqlite."""
    values = native_row(event_type, data)

    async def fetch(sql: str, params: Sequence[Any]) -> list[Any]:
        return list(await conn.execute_fetchall(sql, params))

    await check_data_async(fetch, _STREAM, event_type, data, "?")
    cursor = await conn.execute(INSERT_EVENT, values)
    assert cursor.lastrowid is not None
    return EventId(cursor.lastrowid)
