"""FTN18 native extension on PostgreSQL: add an event in the application's own transaction.

The application writes its business rows and the event on one psycopg connection to the
event database; both commit or roll back together. Servers on the database see the event
when it commits (their LISTEN connections get its id).

The event's id is drawn under the same advisory lock the servers take to add events (see
:mod:`.store`), and the lock is held until the application's transaction ends: keep that
transaction short after this call, since every other producer waits for it.

Example::

    with psycopg.connect("postgresql://app@db/events") as conn:   # commits on success
        conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
        add_event(conn, "XFER", {"account": 7, "amount": -10})
"""

from __future__ import annotations

from typing import Any

import psycopg

from ...domain.stream import EventId, encode_event_data, utc_timestamp
from .schema import INSERT_EVENT, NOTIFY_HEAD, TAKE_APPEND_LOCK


def add_event(conn: psycopg.Connection[Any], event_type: str, data: Any) -> EventId:
    """Insert an event in the caller's transaction (one is begun if none is open); it is
    visible to consumers after commit. Raises :class:`futoin_evt.domain.stream.EventRejected` for a
    bad type or data."""
    data_json = encode_event_data(event_type, data)
    conn.execute(TAKE_APPEND_LOCK)
    row = conn.execute(INSERT_EVENT, (event_type, data_json, utc_timestamp())).fetchone()
    conn.execute(NOTIFY_HEAD)
    assert row is not None
    return EventId(int(row[0]))


async def add_event_async(
    conn: psycopg.AsyncConnection[Any], event_type: str, data: Any
) -> EventId:
    """:func:`add_event` for an application on psycopg's asyncio connection."""
    data_json = encode_event_data(event_type, data)
    await conn.execute(TAKE_APPEND_LOCK)
    cursor = await conn.execute(INSERT_EVENT, (event_type, data_json, utc_timestamp()))
    row = await cursor.fetchone()
    await conn.execute(NOTIFY_HEAD)
    assert row is not None
    return EventId(int(row[0]))
