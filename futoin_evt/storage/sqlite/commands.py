"""The commands SQLite's writer runs inside its transaction, in queue order, on its thread
(see :class:`~.writer.QueuedCommand`): each takes the connection and the commit's timestamp
and returns its result with the events it inserted (none here), or raises; a failure undoes
only its own writes."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from ...domain.groups import GroupClaim, GroupHold
from ...domain.partition import StreamInfo
from ..base import AggregateCopy
from ..sql.access import BUMP_ACCESS
from ..sql.aggregates import (
    add_sources_sql,
    aggregated_by_sql,
    check_aggregate,
    copy_steps,
    lease_sql,
)
from ..sql.calls import Statements
from ..sql.dialect import SQLITE
from ..sql.groups import hold_sql, holder_sql
from ..sql.streams import BUMP_STREAMS_VERSION, grows
from ..tables import STREAM_ROWS, Step, Tables, stream_infos
from .schema import drop_partition_tables_sql, partition_tables_sql
from .transaction import Inserted

_R = TypeVar("_R")


def claim_group_sync(
    conn: sqlite3.Connection, _ts: str, sql: str, params: Sequence[Any]
) -> tuple[GroupClaim, Inserted]:
    row = conn.execute(sql, params).fetchone()
    if row is not None:
        return GroupClaim(True, int(row[0]), int(row[1])), []
    held = conn.execute(holder_sql(SQLITE.mark), params[:3]).fetchone()
    return GroupClaim(False, int(held[0]), int(held[1])), []  # the upsert found its row


def hold_groups_sync(
    conn: sqlite3.Connection, _ts: str, key: int, holds: list[GroupHold], hold_seconds: float
) -> tuple[list[GroupHold], Inserted]:
    sql = hold_sql(SQLITE)
    lost = [
        hold for hold in holds if conn.execute(sql, (hold_seconds, key, *hold)).fetchone() is None
    ]
    return lost, []


def run_sync(
    conn: sqlite3.Connection, _ts: str, statements: Statements
) -> tuple[list[list[tuple[Any, ...]]], Inserted]:
    return [conn.execute(sql, params).fetchall() for sql, params in statements], []


def registry_change_sync(
    conn: sqlite3.Connection, _ts: str, steps: Generator[Step, Any, Any]
) -> tuple[Any, Inserted]:
    """A change of the schema registry's versions (:mod:`..sql.schemas`'s steps) that moves
    the registry's version on."""
    done = _run_steps_sync(conn, steps)
    _bump_streams_version(conn)
    conn.execute(BUMP_ACCESS).fetchall()
    return done, []


def _run_steps_sync(conn: sqlite3.Connection, steps: Generator[Step, Any, _R]) -> _R:
    """Run the statements ``steps`` yields, sending each one's rows back; what it returns."""
    try:
        sql, params = next(steps)
        while True:
            sql, params = steps.send(conn.execute(sql, params).fetchall())
    except StopIteration as done:
        result: _R = done.value
        return result


def _bump_streams_version(conn: sqlite3.Connection) -> None:
    conn.execute(BUMP_STREAMS_VERSION).fetchall()


def _read_stream(conn: sqlite3.Connection, name: str) -> StreamInfo | None:
    rows = conn.execute(STREAM_ROWS + " WHERE s.name = ? ORDER BY p.number", (name,)).fetchall()
    infos = stream_infos(rows)
    return infos[0] if infos else None


def _add_partitions(conn: sqlite3.Connection, name: str, numbers: range) -> None:
    """The partitions' rows and tables; the aggregates of the stream copy them (an
    aggregate's own partition, once its stream row is there, copies every source)."""
    for number in numbers:
        cursor = conn.execute(
            "INSERT INTO partitions (stream, number) VALUES (?, ?)", (name, number)
        )
        assert cursor.lastrowid is not None
        for statement in partition_tables_sql(cursor.lastrowid):
            conn.execute(statement)
        as_source, as_aggregate = add_sources_sql(SQLITE.mark)
        conn.execute(as_source, (cursor.lastrowid,))
        conn.execute(as_aggregate, (cursor.lastrowid, name))


def add_stream_sync(
    conn: sqlite3.Connection, ts: str, name: str, partitions: int, aggregate_of: str | None
) -> tuple[StreamInfo, Inserted]:
    if conn.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone():
        raise KeyError(f"the stream {name} exists already")
    if aggregate_of is not None:
        check_aggregate(name, partitions, _read_stream(conn, aggregate_of), aggregate_of)
    conn.execute(
        "INSERT INTO streams (name, created_at, aggregate_of) VALUES (?, ?, ?)",
        (name, ts, aggregate_of),
    )
    _add_partitions(conn, name, range(partitions))
    _bump_streams_version(conn)
    info = _read_stream(conn, name)
    assert info is not None
    return info, []


def grow_stream_sync(
    conn: sqlite3.Connection, _ts: str, name: str, partitions: int
) -> tuple[StreamInfo, Inserted]:
    info = _read_stream(conn, name)
    if info is None:
        raise KeyError(f"no stream {name}")
    if grows(info, name, partitions):
        _add_partitions(conn, name, range(len(info.partitions), partitions))
        _bump_streams_version(conn)
        info = _read_stream(conn, name)
        assert info is not None
    return info, []


def drop_stream_sync(
    conn: sqlite3.Connection, _ts: str, name: str
) -> tuple[list[int] | None, Inserted]:
    info = _read_stream(conn, name)
    if info is None:
        return None, []
    aggregate = conn.execute(aggregated_by_sql(SQLITE.mark), (name,)).fetchone()
    if aggregate is not None:
        raise ValueError(f"the stream {aggregate[0]} aggregates {name}: drop {aggregate[0]} first")
    keys = [p.key for p in info.partitions]
    for key in keys:
        for statement in drop_partition_tables_sql(key):
            conn.execute(statement)
    # partitions and their consumers go with the stream (ON DELETE CASCADE)
    conn.execute("DELETE FROM streams WHERE name = ?", (name,))
    _bump_streams_version(conn)
    return keys, []


def copy_sync(
    conn: sqlite3.Connection,
    _ts: str,
    aggregate: Tables,
    holder: str,
    lease_seconds: float,
    limit: int,
    start: int,
) -> tuple[AggregateCopy | None, Inserted]:
    """The copying transaction's statements (:func:`..sql.aggregates.copy_steps`), run inside
    the writer's; the lease in this machine's clock (every process on the file shares it)."""
    now = time.time()
    lease = (
        lease_sql(SQLITE.mark, SQLITE.mark, SQLITE.mark),
        [aggregate.key, holder, now + lease_seconds, now],
    )
    return _run_steps_sync(conn, copy_steps(aggregate, lease, limit, start, SQLITE.mark)), []


def delete_events_sync(
    conn: sqlite3.Connection, _ts: str, tables: Tables, up_to: int, limit: int, dcb_events: bool
) -> tuple[tuple[int, int | None], Inserted]:
    """(count, newest id deleted) of one chunk of
    :meth:`.store.SqlitePartitionLog.delete_events`."""
    (lowest,) = conn.execute(
        "SELECT MIN(position) FROM consumers WHERE partition_key = ?", (tables.key,)
    ).fetchone()
    bound = up_to if lowest is None else min(up_to, int(lowest))
    kept = "" if dcb_events else f" AND id NOT IN (SELECT event_id FROM {tables.dcb_events})"
    ids = [
        row[0]
        for row in conn.execute(
            f"SELECT id FROM {tables.events} WHERE id <= ?{kept} ORDER BY id LIMIT ?",
            (bound, limit),
        )
    ]
    if not ids:
        return (0, None), []
    low, high = ids[0], ids[-1]
    if dcb_events:
        conn.execute(f"DELETE FROM {tables.event_tags} WHERE event_id BETWEEN ? AND ?", (low, high))
        conn.execute(f"DELETE FROM {tables.dcb_events} WHERE event_id BETWEEN ? AND ?", (low, high))
    conn.execute(f"DELETE FROM {tables.events} WHERE id BETWEEN ? AND ?{kept}", (low, high))
    return (len(ids), high), []
