"""FTN18 native extension on PostgreSQL: add an event in the application's own transaction.

The application writes its business rows and the event on one psycopg connection to the
event database; both commit or roll back together. Servers on the database see the event
when it commits (their LISTEN connections get its id).

The event's id is drawn under the same advisory lock the servers take to add events to that
partition (see :mod:`.store`), and the lock is held until the application's transaction
ends: keep that transaction short after this call, since every other producer to the
partition waits for it.

Example::

    with psycopg.connect("postgresql://app@db/events") as conn:   # commits on success
        conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
        add_event(conn, "XFER", {"account": 7, "amount": -10})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ...domain.partition import DEFAULT_PARTITION, Partition
from ...domain.stream import EventId
from ..checksums import native_row
from ..sql.schemas import check_data, check_data_async
from ..tables import Tables
from .schema import append_lock_sql, notify_head_sql


def _statements(partition: Partition) -> tuple[str, str, str]:
    """The lock, the insert and the notification of ``partition``."""
    insert = (
        f"INSERT INTO {Tables.of(partition.key).events} (type, data, ts, checksum)"
        " VALUES (%s, %s, %s, %s) RETURNING id"
    )
    return append_lock_sql(partition.key), insert, notify_head_sql(partition.key)


def add_event(
    conn: psycopg.Connection[Any],
    event_type: str,
    data: Any,
    *,
    partition: Partition = DEFAULT_PARTITION,
) -> EventId:
    """Insert an event in the caller's transaction (one is begun if none is open); it is
    visible to consumers after commit. Raises :class:`futoin_evt.domain.stream.EventRejected`
    for a bad type or data (:class:`~futoin_evt.domain.schemas.EventDataInvalid` when the
    type's schema on the partition's stream refuses it: the newest live version, read in
    the transaction). ``partition``: one the store's registry gave (``events``/0 by
    default)."""
    values = native_row(event_type, data)
    check_data(
        lambda sql, params: conn.execute(sql, params).fetchall(),
        partition.stream,
        event_type,
        data,
        "%s",
    )
    lock, insert, notify = _statements(partition)
    conn.execute(lock)
    row = conn.execute(insert, values).fetchone()
    conn.execute(notify)
    assert row is not None
    return EventId(int(row[0]))


async def add_event_async(
    conn: psycopg.AsyncConnection[Any],
    event_type: str,
    data: Any,
    *,
    partition: Partition = DEFAULT_PARTITION,
) -> EventId:
    """:func:`add_event` for an application on psycopg's asyncio connection."""
    values = native_row(event_type, data)

    async def fetch(sql: str, params: Sequence[Any]) -> list[Any]:
        return await (await conn.execute(sql, params)).fetchall()

    await check_data_async(fetch, partition.stream, event_type, data, "%s")
    lock, insert, notify = _statements(partition)
    await conn.execute(lock)
    cursor = await conn.execute(insert, values)
    row = await cursor.fetchone()
    await conn.execute(notify)
    assert row is not None
    return EventId(int(row[0]))
