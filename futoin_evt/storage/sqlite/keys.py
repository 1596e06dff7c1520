"""Producers' keys of events in the SQLite file (see :mod:`..dedup`), on the writer's
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
rather than five per key, so the writer thread spends less time holding the GIL, which the
event loop needs meanwhile. When one user writes every key of the run (the usual run: one
producer's batch, or one at a time) the elements are the keys and the writer is one more
parameter; else each element is ``[user id, key]``, read by ``json_extract``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Final, NamedTuple

from ..dedup import TABLE, WriterKey

#: The time the oldest key was stored (ms), for a reader to see whether any is past the window.
OLDEST_SQL: Final = f"SELECT at FROM {TABLE} ORDER BY rowid LIMIT 1"
#: Each key of a run with its writer (params :keys, :writer; see :class:`RunKeys`).
_WRITER: Final = "COALESCE(:writer, json_extract(value, '$[0]'))"
_KEY: Final = "CASE WHEN :writer IS NULL THEN json_extract(value, '$[1]') ELSE value END"
_ELEMENTS: Final = "json_each(:keys) WHERE value IS NOT NULL"
#: The keys of a run as rows (params also :partition, :first, the first event id, :at, ms).
_ROWS: Final = (
    f"SELECT :partition, {_WRITER}, {_KEY}, :first + key, :at FROM {_ELEMENTS} ORDER BY key"
)
_COLUMNS: Final = "(partition_key, user_id, key, event_id, at)"
_INSERT_NEW: Final = f"INSERT INTO {TABLE} {_COLUMNS} {_ROWS} ON CONFLICT DO NOTHING"
_TAKE_OVER: Final = f"REPLACE INTO {TABLE} {_COLUMNS} {_ROWS}"
#: The stored rows of a run's keys: one probe of the unique index per key (CROSS JOIN keeps
#: the run outside; ``(user_id, key) IN (...)`` would search by the user id alone).
_STORED: Final = (
    f"FROM json_each(:keys) CROSS JOIN {TABLE} d ON d.partition_key = :partition"
    f" AND d.user_id = {_WRITER} AND d.key = {_KEY} WHERE value IS NOT NULL"
)


class RunKeys(NamedTuple):
    """A run's keys as the statements here take them."""

    #: The one user who writes every key of the run; None when there are several (then each
    #: element of ``keys`` is ``[user id, key]``).
    writer: int | None
    #: One element per event in order, ``null`` for one without a key.
    keys: str


def run_keys(keys: Sequence[WriterKey | None]) -> RunKeys:
    """A run's keys, one per event in order (None for none), as :mod:`json_each` reads them."""
    writers = {key.writer for key in keys if key is not None}
    if len(writers) == 1:
        return RunKeys(writers.pop(), json.dumps([None if k is None else k.key for k in keys]))
    return RunKeys(None, json.dumps(keys))


def insert_new(
    conn: sqlite3.Connection, partition_key: int, first_id: int, at: int, keys: RunKeys, count: int
) -> bool:
    """Store the ``count`` keys of a run whose events have ids from ``first_id`` on, as
    stored at ``at`` (ms); False when one of them was stored already (that one is left as it
    was: the caller undoes the others, :func:`undo_new`)."""
    params = _params(partition_key, keys, first=first_id, at=at)
    return bool(conn.execute(_INSERT_NEW, params).rowcount == count)


def undo_new(conn: sqlite3.Connection, partition_key: int, keys: RunKeys, first_id: int) -> None:
    """Delete what :func:`insert_new` stored of ``keys``: their rows for events from
    ``first_id`` on."""
    conn.execute(
        f"DELETE FROM {TABLE} WHERE rowid IN (SELECT d.rowid {_STORED} AND d.event_id >= :first)",
        _params(partition_key, keys, first=first_id),
    )


def take_over(
    conn: sqlite3.Connection, partition_key: int, first_id: int, at: int, keys: RunKeys
) -> None:
    """:func:`insert_new`, where a key stored already is past the window (the lookup said
    so): it is replaced, at the end of the table."""
    conn.execute(_TAKE_OVER, _params(partition_key, keys, first=first_id, at=at))


def stored(
    conn: sqlite3.Connection, partition_key: int, keys: RunKeys, cutoff_ms: int
) -> dict[tuple[int, str], int]:
    """The event id of each of ``keys`` (by writer and key: a :class:`WriterKey` finds its
    own) stored in the partition since ``cutoff_ms``."""
    rows = conn.execute(
        f"SELECT d.user_id, d.key, d.event_id {_STORED} AND d.at >= :cutoff",
        _params(partition_key, keys, cutoff=cutoff_ms),
    )
    return {(writer, key): event_id for writer, key, event_id in rows.fetchall()}


def _params(partition_key: int, keys: RunKeys, **more: int) -> dict[str, object]:
    return {"partition": partition_key, "writer": keys.writer, "keys": keys.keys, **more}


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
