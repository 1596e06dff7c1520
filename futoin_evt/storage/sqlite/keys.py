"""Producers' keys of events in the SQLite file (see :mod:`..dedup`), on the writer's
connection inside its transaction.

A keyed event's row holds its key (:data:`..dedup.KEY_COLUMNS`), under the unique partial
index of its partition's events table. A run's events are inserted with their keys, as new:
only when the index refuses one (a retry, or a key past the window) is the statement undone
(SQLite undoes a failed statement alone) and the run's keys looked up (:func:`stored`); an
event whose key is stored since the window's start is answered with the stored id, a key
stored before is cleared from its old row (:func:`take_over`), and the rest inserted again.

The lookup reads a run's keys as one JSON array (``null`` for an event without a key, so an
element's index is its event's offset in the run), by ``json_each``. When one user writes
every key of the run (the usual run: one producer's batch, or one at a time) the elements
are the keys and the writer is one more parameter; else each element is ``[user id, key]``,
read by ``json_extract``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from ..dedup import WriterKey

#: Keyed rows per INSERT statement (seven parameters each; SQLite takes at most 32,766).
_ROWS_PER_INSERT: Final = 500
#: A keyed event's row: type, data, ts, checksum, then its key's user id, key and time
#: stored (ms); the last three None for an event without a key.
KeyedRow = tuple[str, str, str, int, int | None, str | None, int | None]

#: Each key of a run with its writer (params :keys, :writer; see :class:`RunKeys`).
_WRITER: Final = "COALESCE(:writer, json_extract(value, '$[0]'))"
_KEY: Final = "CASE WHEN :writer IS NULL THEN json_extract(value, '$[1]') ELSE value END"


class RunKeys(NamedTuple):
    """A run's keys as the lookup takes them."""

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


def insert(conn: sqlite3.Connection, table: str, rows: Sequence[KeyedRow]) -> int | None:
    """Insert a run's rows with their keys in multi-row statements; the first new id (the
    rest follow it), or None when the key index refused one of them (then nothing of the
    run stays: its ids are drawn again)."""
    first_id = 0
    try:
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            cursor = conn.execute(
                f"INSERT INTO {table} (type, data, ts, checksum, key_user_id, key, key_at)"
                " VALUES " + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(chunk)),
                [value for row in chunk for value in row],
            )
            assert cursor.lastrowid is not None
            if start == 0:
                first_id = cursor.lastrowid - len(chunk) + 1
    except sqlite3.IntegrityError as exc:
        if "UNIQUE" not in str(exc):
            raise
        if first_id:  # the statements before the refused one stay: theirs are the newest ids
            conn.execute(f"DELETE FROM {table} WHERE id >= ?", (first_id,))
            conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (first_id - 1, table))
        return None
    return first_id


def stored(
    conn: sqlite3.Connection, table: str, keys: RunKeys
) -> dict[tuple[int, str], tuple[int, int]]:
    """The event id and time stored (ms) of each of ``keys`` stored in ``table`` (by writer
    and key: a :class:`WriterKey` finds its own), whatever its age: one probe of the key
    index per key (CROSS JOIN keeps the run outside)."""
    rows = conn.execute(
        f"SELECT e.key_user_id, e.key, e.id, e.key_at FROM json_each(:keys)"
        f" CROSS JOIN {table} e ON e.key_user_id = {_WRITER} AND e.key = {_KEY}"
        " WHERE value IS NOT NULL",
        {"writer": keys.writer, "keys": keys.keys},
    )
    return {(writer, key): (event_id, at) for writer, key, event_id, at in rows.fetchall()}


def take_over(conn: sqlite3.Connection, table: str, event_ids: Iterable[int]) -> None:
    """Clear the keys of these events of ``table`` (past the window: new events take them)."""
    conn.executemany(
        f"UPDATE {table} SET key_user_id = NULL, key = NULL, key_at = NULL WHERE id = ?",
        [(event_id,) for event_id in event_ids],
    )
