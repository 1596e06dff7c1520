"""SQLite's commit: one transaction on the writer's connection (on its thread, or inline on
the event loop; see :mod:`.writer`) takes the queued writes in queue order. The appends of a
run go in multi-row INSERTs, one group per partition; statements and commands keep their
places between them; DCB appends are judged against everything written before them in the
queue."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ...domain.dcb import AppendCondition, AppendConditionFailed, NewEvent
from ...domain.stream import EventId, StoredForm, utc_timestamp
from ...ftn3.messages import encode_json
from ..checksums import event_checksum
from ..dedup import PendingKeys, WriterKey
from ..sql.dcb import condition_sql, judge_batch, stored_retry
from ..tables import DEFAULT_TABLES, Tables
from .keys import KeyedRow, run_keys
from .keys import insert as insert_keyed
from .keys import stored as stored_keys
from .keys import take_over as take_over_keys

logger = logging.getLogger(__name__)

#: Rows per INSERT statement: one sqlite3_step (and one GIL round trip) for many events.
_ROWS_PER_INSERT: Final = 500


def last_given_id_sql(tables: Tables) -> str:
    """The newest id ever given to an event (AUTOINCREMENT keeps it after a discard)."""
    return (
        "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence"
        f" WHERE name = '{tables.events}'"  # a name made of an integer key: see Tables
    )


@dataclass(slots=True)
class QueuedAppend:
    type: str
    data: str
    future: asyncio.Future[EventId]
    content_type: str | None = None
    tables: Tables = DEFAULT_TABLES
    #: The next queued append belongs with this one: they are committed together.
    joined: bool = False
    #: The producer's key with its writer (see :mod:`..dedup`), and who answers the appends
    #: that follow it.
    key: WriterKey | None = None
    pending: PendingKeys | None = None
    #: Its attributes' JSON (:mod:`futoin_evt.domain.attrs`), when it has them.
    attrs: str | None = None


@dataclass(slots=True)
class QueuedStatement:
    sql: str
    params: Sequence[Any]
    future: asyncio.Future[list[tuple[Any, ...]]]


#: Events a write inserted: (id, type, data), in id order.
Inserted = list[tuple[int, str, str]]


@dataclass(slots=True)
class QueuedCommand:
    """Work that runs inside the writer's transaction, in queue order, on the writer thread:
    ``apply(conn, ts)`` returns its result and the events it inserted into ``key``'s
    partition or raises; a failure undoes only its own writes (a savepoint)."""

    apply: Callable[[sqlite3.Connection, str], tuple[Any, Inserted]]
    future: asyncio.Future[Any]
    key: int = 0


@dataclass(slots=True)
class QueuedDcbAppend:
    """A DCB append: its condition is checked in the writer's transaction, after every
    write before it in the queue (the DCB appends of one commit included)."""

    events: Sequence[NewEvent]
    condition: AppendCondition | None
    future: asyncio.Future[Any]
    tables: Tables = DEFAULT_TABLES


QueuedWrite = QueuedAppend | QueuedStatement | QueuedCommand | QueuedDcbAppend
#: A write that goes in with the others of its run and partition.
_Run = TypeVar("_Run", QueuedAppend, QueuedDcbAppend)


def commit_sync(
    conn: sqlite3.Connection, batch: list[QueuedWrite], turns: int | None = None, dedup_ms: int = 0
) -> tuple[str, dict[int, Inserted], list[Any]]:
    """:func:`commit_in_turn`, holding the workers' turn lock (``turns``, a file
    descriptor) when given: a worker waiting for another's commit wakes as it ends, rather
    than after SQLite's busy handler sleeps (1, 2, 5, 10 ms and more between tries)."""
    if turns is None:
        return commit_in_turn(conn, batch, dedup_ms)
    fcntl.flock(turns, fcntl.LOCK_EX)
    try:
        return commit_in_turn(conn, batch, dedup_ms)
    finally:
        fcntl.flock(turns, fcntl.LOCK_UN)


def commit_in_turn(
    conn: sqlite3.Connection, batch: list[QueuedWrite], dedup_ms: int = 0
) -> tuple[str, dict[int, Inserted], list[Any]]:
    """One transaction on the writer thread, the writes in queue order; the appends of a run
    of appends go in multi-row INSERTs, one group per partition (appends to different
    partitions are independent; every other write stays in its place between them).

    Returns the timestamp of the new events, the events inserted by partition key as
    (id, type, data) in id order (one writer holds the lock, so AUTOINCREMENT gives
    consecutive ids), and each write's result: an id, a statement's rows, a command's
    result, or the exception that failed that write alone (an IntegrityError, a refused
    command, a partition dropped meanwhile). An append whose key is stored within
    ``dedup_ms`` gets the stored id (see :mod:`..dedup`).
    """
    ts = utc_timestamp()
    inserted: dict[int, Inserted] = {}
    results: list[Any] = [None] * len(batch)
    conn.execute("BEGIN IMMEDIATE")
    try:
        index = 0
        while index < len(batch):
            item = batch[index]
            if isinstance(item, QueuedAppend):
                by_partition, index = _run_by_partition(batch, index, QueuedAppend)
                for placed in by_partition.values():
                    _append_run(conn, ts, placed, inserted, results, dedup_ms)
                continue
            if isinstance(item, QueuedDcbAppend):
                dcb_by_partition, index = _run_by_partition(batch, index, QueuedDcbAppend)
                for dcb_placed in dcb_by_partition.values():
                    _dcb_run(conn, ts, dcb_placed, inserted, results)
                continue
            if isinstance(item, QueuedStatement):
                try:
                    results[index] = conn.execute(item.sql, item.params).fetchall()
                except sqlite3.IntegrityError as exc:
                    results[index] = exc
            else:
                conn.execute("SAVEPOINT command")
                try:
                    result, events = item.apply(conn, ts)
                except Exception as exc:
                    conn.execute("ROLLBACK TO command")
                    results[index] = exc
                else:
                    inserted.setdefault(item.key, []).extend(events)
                    results[index] = result
                conn.execute("RELEASE command")
            index += 1
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return ts, inserted, results


def _run_by_partition(
    batch: list[QueuedWrite], index: int, kind: type[_Run]
) -> tuple[dict[int, list[tuple[int, _Run]]], int]:
    """The run of writes of ``kind`` that starts at ``index``, by partition key with each
    write's index (partitions are independent: each one's run goes in as one), and the
    index after the run."""
    by_partition: dict[int, list[tuple[int, _Run]]] = {}
    while index < len(batch):
        write = batch[index]
        if not isinstance(write, kind):
            break
        by_partition.setdefault(write.tables.key, []).append((index, write))
        index += 1
    return by_partition, index


def _append_run(
    conn: sqlite3.Connection,
    ts: str,
    placed: list[tuple[int, QueuedAppend]],
    inserted: dict[int, Inserted],
    results: list[Any],
    dedup_ms: int = 0,
) -> None:
    """Appends to one partition, with their places in the batch. Outside ``events``/0 (which
    always exists) they go in a savepoint: a partition dropped while appends to it were
    queued fails them alone."""
    tables = placed[0][1].tables
    if tables.key:
        conn.execute("SAVEPOINT appends")
        try:
            stored, first_id = _insert_run(conn, ts, tables, placed, dedup_ms, results)
        except sqlite3.OperationalError as exc:
            conn.execute("ROLLBACK TO appends")
            conn.execute("RELEASE appends")
            for index, _ in placed:
                results[index] = exc
            return
        conn.execute("RELEASE appends")
    else:
        stored, first_id = _insert_run(conn, ts, tables, placed, dedup_ms, results)
    events = inserted.setdefault(tables.key, [])
    for offset, (index, append) in enumerate(stored):
        events.append((first_id + offset, append.type, append.data))
        results[index] = EventId(first_id + offset)


def _insert_run(
    conn: sqlite3.Connection,
    ts: str,
    tables: Tables,
    placed: list[tuple[int, QueuedAppend]],
    dedup_ms: int,
    results: list[Any],
) -> tuple[list[tuple[int, QueuedAppend]], int]:
    """Insert a run's events, and their keys; those inserted and the first new id (the rest
    follow it). An append whose key is stored since the window's start gets the stored id
    in ``results`` and inserts nothing (a key stored before is taken over): see
    :mod:`.keys`."""
    appends = [append for _, append in placed]
    if all(a.key is None for a in appends):
        first_id = _insert_events(
            conn, tables.events, [(a.type, a.data, a.content_type, a.attrs) for a in appends], ts
        )
        _keep_extras(conn, tables.events, first_id, appends)
        return placed, first_id
    now_ms = int(time.time() * 1000)
    inserted_first = insert_keyed(conn, tables.events, _keyed_rows(appends, ts, now_ms))
    if inserted_first is None:
        # A key is stored: those stored since the window's start answer their events, the
        # others are taken over; the rest go in.
        found = stored_keys(conn, tables.events, run_keys([a.key for a in appends]))
        cutoff_ms = now_ms - dedup_ms
        known = {key: event_id for key, (event_id, at) in found.items() if at >= cutoff_ms}
        take_over_keys(conn, tables.events, [e for e, at in found.values() if at < cutoff_ms])
        for index, append in placed:
            if append.key in known:
                results[index] = EventId(known[append.key])
        placed = [(index, a) for index, a in placed if a.key not in known]
        if not placed:
            return placed, 0
        appends = [append for _, append in placed]
        inserted_first = insert_keyed(conn, tables.events, _keyed_rows(appends, ts, now_ms))
        if inserted_first is None:  # the writer holds the lock: no other commit came between
            raise sqlite3.IntegrityError("a key of the run was stored meanwhile")
    _keep_extras(conn, tables.events, inserted_first, appends)
    return placed, inserted_first


def _keyed_rows(appends: list[QueuedAppend], ts: str, now_ms: int) -> list[KeyedRow]:
    """The rows of a run of appends, some with keys (:func:`.keys.insert`)."""
    return [
        (
            a.type,
            a.data,
            ts,
            event_checksum(a.type, a.data, ts, a.content_type, a.attrs),
            None if a.key is None else a.key.writer,
            None if a.key is None else a.key.key,
            None if a.key is None else now_ms,
        )
        for a in appends
    ]


def _insert_events(
    conn: sqlite3.Connection, table: str, events: Sequence[StoredForm], ts: str
) -> int:
    """Insert events (type, data, content type, attrs) in multi-row statements, each with its
    checksum (the content type and attrs themselves are set by :func:`_keep_extras`); the
    first new id (the rest follow it)."""
    first_id = 0
    for start in range(0, len(events), _ROWS_PER_INSERT):
        chunk = events[start : start + _ROWS_PER_INSERT]
        sql = f"INSERT INTO {table} (type, data, ts, checksum) VALUES " + ",".join(
            ["(?, ?, ?, ?)"] * len(chunk)
        )
        cursor = conn.execute(
            sql, [v for t, d, c, a in chunk for v in (t, d, ts, event_checksum(t, d, ts, c, a))]
        )
        assert cursor.lastrowid is not None
        if start == 0:
            first_id = cursor.lastrowid - len(chunk) + 1
    return first_id


def _keep_extras(
    conn: sqlite3.Connection, table: str, first_id: int, appends: list[QueuedAppend]
) -> None:
    """The content types of the events that came as AMQP ``data`` sections, and the
    attributes of those that have them (few, and only they pay for it: the inserts stay
    four columns wide)."""
    kept = [
        (a.content_type, a.attrs, first_id + i)
        for i, a in enumerate(appends)
        if a.content_type is not None or a.attrs is not None
    ]
    if kept:
        conn.executemany(f"UPDATE {table} SET content_type = ?, attrs = ? WHERE id = ?", kept)


def _dcb_run(
    conn: sqlite3.Connection,
    ts: str,
    placed: list[tuple[int, QueuedDcbAppend]],
    inserted: dict[int, Inserted],
    results: list[Any],
) -> None:
    """DCB appends to one partition, with their places in the batch, in queue order: each
    one's retry and condition checked against what was written before it (the store's
    indexes for the events before the run, the run's own events in memory), then the
    accepted ones' events, tags and ids inserted in multi-row statements. A refused append
    (a failed condition, an id stored with other content) is refused alone. A run of one,
    or one whose insert fails (a partition dropped meanwhile; the run is undone), is
    written one append at a time."""
    tables = placed[0][1].tables
    if len(placed) == 1:
        _dcb_one_by_one(conn, ts, placed, inserted, results)
        return
    conn.execute("SAVEPOINT dcb_run")
    try:
        accepted = _dcb_checked(conn, tables, placed, results)
        if accepted:
            first_id = _insert_events(
                conn, tables.events, [(e.type, e.data_json, None, None) for _, e in accepted], ts
            )
            if first_id != accepted[0][0]:
                raise sqlite3.OperationalError(f"ids from {first_id}, not {accepted[0][0]}")
            _insert_dcb_rows(conn, tables, accepted)
    except sqlite3.Error as exc:
        logger.debug("DCB appends of one commit written one at a time: %s", exc)
        conn.execute("ROLLBACK TO dcb_run")
        conn.execute("RELEASE dcb_run")
        _dcb_one_by_one(conn, ts, placed, inserted, results)
        return
    conn.execute("RELEASE dcb_run")
    inserted.setdefault(tables.key, []).extend(
        (position, event.type, event.data_json) for position, event in accepted
    )


def _dcb_one_by_one(
    conn: sqlite3.Connection,
    ts: str,
    placed: list[tuple[int, QueuedDcbAppend]],
    inserted: dict[int, Inserted],
    results: list[Any],
) -> None:
    """Each append by :func:`_dcb_append_sync` in a savepoint: a failure undoes its own."""
    for index, dcb in placed:
        conn.execute("SAVEPOINT command")
        try:
            results[index], events = _dcb_append_sync(
                conn, ts, dcb.tables, dcb.events, dcb.condition
            )
        except Exception as failed:
            conn.execute("ROLLBACK TO command")
            results[index] = failed
        else:
            inserted.setdefault(dcb.tables.key, []).extend(events)
        conn.execute("RELEASE command")


def _dcb_checked(
    conn: sqlite3.Connection,
    tables: Tables,
    placed: list[tuple[int, QueuedDcbAppend]],
    results: list[Any],
) -> list[tuple[int, NewEvent]]:
    """The events of the appends of a run that may go in, with the positions they get (the
    run's writes are the next ones of the partition); each append's result set: its last
    position, a stored retry's, or why it is refused (see :func:`..sql.dcb.judge_batch`)."""
    (given,) = conn.execute(last_given_id_sql(tables)).fetchone()
    client_ids = [e.id for _, dcb in placed for e in dcb.events if e.id is not None]
    stored = _stored_rows(conn, tables, client_ids) if client_ids else []
    conflicts: list[int | None] = []
    for _, dcb in placed:
        conflict = None
        if dcb.condition is not None:
            query, after = dcb.condition.fail_if_events_match, dcb.condition.after
            row = conn.execute(*condition_sql(query, after, tables=tables)).fetchone()
            conflict = int(row[0]) if row is not None else None
        conflicts.append(conflict)
    appends = [(dcb.events, dcb.condition) for _, dcb in placed]
    accepted, outcomes = judge_batch(appends, int(given) + 1, stored, conflicts)
    for (index, _), outcome in zip(placed, outcomes, strict=True):
        results[index] = outcome
    return accepted


def _stored_rows(
    conn: sqlite3.Connection, tables: Tables, client_ids: list[str]
) -> list[tuple[Any, ...]]:
    """What :func:`..sql.dcb.stored_retry` compares, of the stored events with these ids."""
    rows: list[tuple[Any, ...]] = []
    for start in range(0, len(client_ids), _IDS_PER_LOOKUP):
        chunk = client_ids[start : start + _IDS_PER_LOOKUP]
        rows += conn.execute(
            "SELECT d.client_id, d.event_id, e.type, e.data, d.tags, d.is_bytes"
            f" FROM {tables.dcb_events} d JOIN {tables.events} e ON e.id = d.event_id"
            f" WHERE d.client_id IN ({','.join('?' * len(chunk))})",
            chunk,
        ).fetchall()
    return rows


#: Client ids looked up per statement (SQLite takes at most 32,766 parameters).
_IDS_PER_LOOKUP: Final = 1000


def _insert_dcb_rows(
    conn: sqlite3.Connection, tables: Tables, placed: Sequence[tuple[int, NewEvent]]
) -> None:
    """The DCB rows (client id, tags, opaque bytes) and the tag index of inserted events."""
    conn.executemany(
        f"INSERT INTO {tables.dcb_events} (event_id, client_id, tags, is_bytes)"
        " VALUES (?, ?, ?, ?)",
        [(p, e.id, encode_json(list(e.tags)), int(e.is_bytes)) for p, e in placed],
    )
    conn.executemany(
        f"INSERT INTO {tables.event_tags} (tag, event_id) VALUES (?, ?)",
        [(tag, p) for p, e in placed for tag in e.tags],
    )


def _dcb_append_sync(
    conn: sqlite3.Connection,
    ts: str,
    tables: Tables,
    events: Sequence[NewEvent],
    condition: AppendCondition | None,
) -> tuple[int, Inserted]:
    """One DCB append inside the writer's transaction: an idempotent retry returns the stored
    positions; a failed condition raises; else the events go in with their tags."""
    client_ids = [e.id for e in events if e.id is not None]
    if client_ids:
        rows = _stored_rows(conn, tables, client_ids)
        if rows:
            return stored_retry(events, rows), []
    if condition is not None:
        sql, params = condition_sql(condition.fail_if_events_match, condition.after, tables=tables)
        row = conn.execute(sql, params).fetchone()
        if row is not None:
            raise AppendConditionFailed(int(row[0]))
    first_id = _insert_events(
        conn, tables.events, [(e.type, e.data_json, None, None) for e in events], ts
    )
    placed = [(first_id + offset, event) for offset, event in enumerate(events)]
    _insert_dcb_rows(conn, tables, placed)
    return placed[-1][0], [(p, e.type, e.data_json) for p, e in placed]
