"""Producers' keys of events in the SQLite file (see :mod:`.dedup`), on the writer's
connection inside its transaction.

The rows of ``dedup_keys`` are kept in the order they were stored (their rowid; a key taken
over after the window is deleted and stored anew), so the oldest are the first ones: the
keys past the window are forgotten from the start of the table, a bounded chunk at a time,
without an index on the time (which would cost every keyed append a second index entry).
A batch's keys are inserted with its events, as new; only when one of them is stored
already (a retry, or a key past the window) is the batch undone and done again with a
lookup.

A run's keys go to SQLite as one JSON array (``null`` for an event without a key, so an
element's index is its event's offset in the run), read by ``json_each``: one parameter
rather than four per key, so the writer thread spends less time holding the GIL, which the
event loop needs meanwhile.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Final

from .dedup import TABLE

#: The time the oldest key was stored (ms), for a reader to see whether any is past the window.
OLDEST_SQL: Final = f"SELECT at FROM {TABLE} ORDER BY rowid LIMIT 1"
#: The keys of a run as rows (params: partition key, first event id, ms, the keys as JSON).
_ROWS: Final = "SELECT ?, value, ? + key, ? FROM json_each(?) WHERE value IS NOT NULL ORDER BY key"
_INSERT_NEW: Final = (
    f"INSERT INTO {TABLE} (partition_key, key, event_id, at) {_ROWS} ON CONFLICT DO NOTHING"
)
_TAKE_OVER: Final = f"REPLACE INTO {TABLE} (partition_key, key, event_id, at) {_ROWS}"
_IN_RUN: Final = "key IN (SELECT value FROM json_each(?) WHERE value IS NOT NULL)"


def run_keys(keys: Sequence[str | None]) -> str:
    """A run's keys, one per event in order (None for none), as :mod:`json_each` reads them."""
    return json.dumps(keys)


def insert_new(
    conn: sqlite3.Connection, partition_key: int, first_id: int, at: int, keys: str, count: int
) -> bool:
    """Store the ``count`` keys of a run whose events have ids from ``first_id`` on, as
    stored at ``at`` (ms); False when one of them was stored already (that one is left as it
    was: the caller undoes the others, :func:`undo_new`)."""
    inserted = conn.execute(_INSERT_NEW, (partition_key, first_id, at, keys)).rowcount
    return bool(inserted == count)


def undo_new(conn: sqlite3.Connection, partition_key: int, keys: str, first_id: int) -> None:
    """Delete what :func:`insert_new` stored of ``keys``: their rows for events from
    ``first_id`` on."""
    conn.execute(
        f"DELETE FROM {TABLE} WHERE partition_key = ? AND event_id >= ? AND {_IN_RUN}",
        (partition_key, first_id, keys),
    )


def take_over(
    conn: sqlite3.Connection, partition_key: int, first_id: int, at: int, keys: str
) -> None:
    """:func:`insert_new`, where a key stored already is past the window (the lookup said
    so): it is replaced, at the end of the table."""
    conn.execute(_TAKE_OVER, (partition_key, first_id, at, keys))


def stored(
    conn: sqlite3.Connection, partition_key: int, keys: str, cutoff_ms: int
) -> dict[str, int]:
    """The event id of each of ``keys`` stored in the partition since ``cutoff_ms``."""
    rows = conn.execute(
        f"SELECT key, event_id FROM {TABLE} WHERE partition_key = ? AND at >= ? AND {_IN_RUN}",
        (partition_key, cutoff_ms, keys),
    )
    return dict(rows.fetchall())


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
