"""Producers' keys of events in the SQLite file (see :mod:`.dedup`), on the writer's
connection inside its transaction.

The rows of ``dedup_keys`` are kept in the order they were stored (their rowid; a key taken
over after the window is deleted and stored anew), so the oldest are the first ones: the
keys past the window are forgotten from the start of the table, a bounded chunk at a time,
without an index on the time (which would cost every keyed append a second index entry).
A batch's keys are inserted with its events, as new; only when one of them is stored
already (a retry, or a key past the window) is the batch undone and done again with a
lookup.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from .dedup import TABLE

#: Rows per statement (4 parameters each).
ROWS_PER_STATEMENT: Final = 500
#: The time the oldest key was stored (ms), for a reader to see whether any is past the window.
OLDEST_SQL: Final = f"SELECT at FROM {TABLE} ORDER BY rowid LIMIT 1"

#: A key row: (partition key, key, event id, ms since the epoch).
KeyRow = tuple[int, str, int, int]


def _insert(conn: sqlite3.Connection, rows: Sequence[KeyRow], verb: str, tail: str = "") -> int:
    inserted = 0
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        values = ",".join(["(?, ?, ?, ?)"] * len(chunk))
        sql = f"{verb} INTO {TABLE} (partition_key, key, event_id, at) VALUES {values}{tail}"
        inserted += conn.execute(sql, [v for row in chunk for v in row]).rowcount
    return inserted


def insert_new(conn: sqlite3.Connection, rows: Sequence[KeyRow]) -> bool:
    """Insert keys not stored yet; False when one was (that one is left as it was: the
    caller undoes the others, :func:`undo_new`)."""
    return _insert(conn, rows, "INSERT", " ON CONFLICT DO NOTHING") == len(rows)


def undo_new(
    conn: sqlite3.Connection, partition_key: int, keys: Sequence[str], first_id: int
) -> None:
    """Delete what :func:`insert_new` stored of ``keys``: their rows for events from
    ``first_id`` on."""
    for start in range(0, len(keys), ROWS_PER_STATEMENT):
        chunk = keys[start : start + ROWS_PER_STATEMENT]
        conn.execute(
            f"DELETE FROM {TABLE} WHERE partition_key = ? AND event_id >= ?"
            f" AND key IN ({','.join('?' * len(chunk))})",
            [partition_key, first_id, *chunk],
        )


def take_over(conn: sqlite3.Connection, rows: Sequence[KeyRow]) -> None:
    """Store keys; one stored already (past the window: the lookup said so) is replaced,
    at the end of the table."""
    _insert(conn, rows, "REPLACE")


def stored(
    conn: sqlite3.Connection, partition_key: int, keys: Sequence[str], cutoff_ms: int
) -> dict[str, int]:
    """The event id of each of ``keys`` stored in the partition since ``cutoff_ms``."""
    found: dict[str, int] = {}
    for start in range(0, len(keys), ROWS_PER_STATEMENT):
        chunk = keys[start : start + ROWS_PER_STATEMENT]
        sql = (
            f"SELECT key, event_id FROM {TABLE} WHERE partition_key = ? AND at >= ?"
            f" AND key IN ({','.join('?' * len(chunk))})"
        )
        found.update(conn.execute(sql, [partition_key, cutoff_ms, *chunk]).fetchall())
    return found


def forget(conn: sqlite3.Connection, cutoff_ms: int, limit: int) -> int:
    """Delete the first keys of the table stored before ``cutoff_ms``, up to the first one
    that is not (or ``limit`` of them); how many went."""
    last = None
    oldest = conn.execute(f"SELECT rowid, at FROM {TABLE} ORDER BY rowid LIMIT ?", (limit,))
    for rowid, at in oldest.fetchall():
        if at >= cutoff_ms:
            break
        last = rowid
    if last is None:
        return 0
    return conn.execute(f"DELETE FROM {TABLE} WHERE rowid <= ?", (last,)).rowcount
