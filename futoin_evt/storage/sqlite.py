"""The embedded event store: one SQLite file in WAL mode.

All writes go through one writer task. It takes whatever writes are queued, commits them in
one transaction (group commit) and only then resolves each caller's future, so:

- event ids are allocated and committed in the same order (a reader at ``id > position``
  never skips an id that commits late);
- an ``append`` that returned is durable (``synchronous=FULL`` by default);
- producers that arrive together share one fsync instead of paying one each.

The whole transaction runs as one call on the writer's own thread. aiosqlite would hop to
its thread and back once per statement, and under load each hop waits for a full turn of
the event loop: four hops per commit cost ten times the commit itself. Reads run on a second
connection on a thread of their own (:mod:`.sqlite_reads`), one job per read with its rows
converted there, and never wait for the writer (WAL).

At ``NORMAL`` durability a commit writes the WAL without an fsync, so a write that is alone
in the queue commits inline, on the event loop, without the two thread hops (see
:meth:`SqliteStore._commit_inline`); the WAL's checkpoints (which fsync) stay on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from ..domain.dcb import (
    AppendCondition,
    AppendConditionFailed,
    NewEvent,
    Query,
    StoredEvent,
)
from ..domain.groups import GroupClaim, GroupHold
from ..domain.partition import (
    DEFAULT_PARTITION,
    DEFAULT_STREAM,
    Partition,
    StreamInfo,
    check_partition_count,
    check_stream_name,
)
from ..domain.schemas import SchemaRow
from ..domain.stream import DEFAULT_DEDUP_WINDOW, EventId, UserId, event_json, utc_timestamp
from ..ftn3.messages import encode_json
from ..stats import DamageStats, WriteStats
from . import changes_sql, grants_sql, groups_sql, schemas_sql, sqlite_keys
from .aggregate_sql import (
    add_sources_sql,
    aggregated_by_sql,
    check_aggregate,
    copied_up_to_sql,
    copy_steps,
    lease_sql,
    note_aggregates,
    positions_sql,
    release_sql,
)
from .base import (
    AggregateCopy,
    ConsumerRow,
    DiscardLimits,
    Durability,
    EventPage,
    EventRow,
    GrantRow,
    NotWritable,
    PeerNews,
    StoreClosed,
    StoreUnavailable,
    StreamBounds,
    User,
    joined_count,
)
from .checkpoints import CheckpointTables
from .checksums import event_checksum
from .dcb_sql import (
    READ_WIDTH,
    SQLITE_FTN18_TYPE,
    condition_sql,
    is_ftn18_type,
    judge_batch,
    read_sql,
    stored_event,
    stored_retry,
)
from .dedup import PendingKeys, Queued, WriterKey, plan_appends, window_ms
from .head import ClaimWatch, HeadWatch
from .page_rows import event_rows
from .pages import (
    PagedReads,
    ReadDialect,
    consumer_counts_sql,
    consumer_lags_sql,
    consumer_rows,
    rows_sql,
)
from .recent import DEFAULT_CAPACITY, DEFAULT_MAX_BYTES, RecentEvent, RecentEvents
from .schema import drop_partition_tables_sql, ensure_schema, partition_tables_sql
from .sessions_sql import ConsoleSessionTables
from .sqlite_reads import SqliteReader
from .tables import DEFAULT_TABLES, STREAM_ROWS, Step, Tables, stream_infos
from .termini_sql import Statements, TerminiTables
from .thread import WorkerThread

log = logging.getLogger(__name__)

#: Largest number of queued writes committed in one transaction.
MAX_WRITES_PER_COMMIT: Final = 4096
#: Rows per INSERT statement: one sqlite3_step (and one GIL round trip) for many events.
_ROWS_PER_INSERT: Final = 500
#: SQLite's busy timeout on the writer thread (ms); inline commits never wait (0).
_BUSY_TIMEOUT_MS: Final = 10_000
#: With inline commits, the writer checkpoints the WAL on its thread after this many commits
#: (SQLite's own checkpoint would run inside a commit, fsync and all, on the event loop);
#: a small commit adds 2-3 pages, so the WAL stays near SQLite's default of 1,000 pages.
CHECKPOINT_COMMITS: Final = 300
#: ... or after this many bytes of events.
CHECKPOINT_BYTES: Final = 2 << 20
#: A WAL of more pages than this is checkpointed by the writer between two commits.
CHECKPOINT_WAL_FRAMES: Final = 1000


#: The clock of :mod:`.groups_sql` and :mod:`.termini_sql` in SQLite: seconds since the epoch
#: (every process on the file shares this machine's clock).
_NOW: Final = "((julianday('now') - 2440587.5) * 86400.0)"


def _dialect(tables: Tables) -> ReadDialect:
    events, key = tables.events, tables.key
    consumer = f"FROM consumers WHERE partition_key = {key} AND user_id = ? AND component = ?"
    return ReadDialect(
        mark="?",
        start_row="SELECT -1, NULL, NULL, NULL, NULL, {start}",
        events=f"SELECT id, type, data, ts, content_type, checksum FROM {events} WHERE 1",
        page="SELECT * FROM ({inner} ORDER BY id LIMIT ?)",
        head_row=f"SELECT 0, NULL, NULL, NULL, NULL, (SELECT COALESCE(MAX(id), 0) FROM {events})",
        ftn18_type=SQLITE_FTN18_TYPE,
        types_as_array=False,
        consumer_start=f"(SELECT MAX(position, ?) {consumer})",
        consumer_position=f"(SELECT position {consumer})",
    )


def _last_given_id(tables: Tables) -> str:
    """The newest id ever given to an event (AUTOINCREMENT keeps it after a discard)."""
    return (
        "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence"
        f" WHERE name = '{tables.events}'"  # a name made of an integer key: see Tables
    )


#: DCB reads of at most this many events are read on the event loop (see
#: :meth:`SqlitePartitionLog._peek_rows`): the first step of a read
#: (:data:`futoin_evt.dcb.service.FIRST_PAGE_SIZE`).
INLINE_DCB_ROWS: Final = 50
#: SQLite's virtual machine steps a read on the event loop may take before it is interrupted
#: and read on the read thread (about a millisecond). Measured: the head 15 steps, a tag read
#: of 10 events 900, 50 events of a type and a tag 9,300.
PEEK_MAX_STEPS: Final = 50_000

#: The ring of recent events of a partition other than ``events``/0: a server may hold many.
_PARTITION_RING_DIVISOR: Final = 32


@dataclass(slots=True)
class _Append:
    type: str
    data: str
    future: asyncio.Future[EventId]
    content_type: str | None = None
    tables: Tables = DEFAULT_TABLES
    #: The next queued append belongs with this one: they are committed together.
    joined: bool = False
    #: The producer's key with its writer (see :mod:`.dedup`), and who answers the appends
    #: that follow it.
    key: WriterKey | None = None
    pending: PendingKeys | None = None


@dataclass(slots=True)
class _Statement:
    sql: str
    params: Sequence[Any]
    future: asyncio.Future[list[tuple[Any, ...]]]


#: Events a write inserted: (id, type, data), in id order.
_Inserted = list[tuple[int, str, str]]
_R = TypeVar("_R")


@dataclass(slots=True)
class _Command:
    """Work that runs inside the writer's transaction, in queue order, on the writer thread:
    ``apply(conn, ts)`` returns its result and the events it inserted into ``key``'s
    partition or raises; a failure undoes only its own writes (a savepoint)."""

    apply: Callable[[sqlite3.Connection, str], tuple[Any, _Inserted]]
    future: asyncio.Future[Any]
    key: int = 0


@dataclass(slots=True)
class _DcbAppend:
    """A DCB append: its condition is checked in the writer's transaction, after every
    write before it in the queue (the DCB appends of one commit included)."""

    events: Sequence[NewEvent]
    condition: AppendCondition | None
    future: asyncio.Future[Any]
    tables: Tables = DEFAULT_TABLES


_Write = _Append | _Statement | _Command | _DcbAppend


@dataclass(slots=True)
class _Queue:
    items: deque[_Write] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


def _prepare_file(path: Path) -> None:
    """Create the file readable by its owner only (it holds password hashes; SQLite gives
    its ``-wal`` and ``-shm`` the same mode), switch it to WAL (a persistent setting) and
    create or check the schema."""
    create_private(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            ensure_schema(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 when it does not exist; warn once when an
    existing database file may be read by others."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        mode = path.stat().st_mode
        if mode & 0o077 and path.is_file():
            log.warning(
                "%s may be read by other users (mode %o): it holds password hashes;"
                " chmod 600 it and its -wal and -shm files",
                path,
                mode & 0o777,
            )
    except OSError:  # a directory that does not exist, say: sqlite3 says it best
        pass


class SqlitePartitionLog(PagedReads):
    """One partition's log in the store's file: its own tables, head and consumers. Writes go
    through the store's one writer (a group commit takes appends to every partition)."""

    def __init__(self, store: SqliteStore, partition: Partition) -> None:
        self._store = store
        self.partition = partition
        #: (stream, partition number) as the metrics label it.
        self.labels = (partition.stream, str(partition.number))
        self._tables = Tables.of(partition.key)
        self._key = partition.key
        self.read_dialect = _dialect(self._tables)
        self.damage_stats = store.damage_stats
        self._last_given = _last_given_id(self._tables)
        self._newest = f"SELECT COALESCE(MAX(id), 0) FROM {self._tables.events}"
        #: Its stream was dropped by this process: appends are refused.
        self._retired = False
        #: Its stream aggregates this one (its events come only by copying).
        self._aggregate_of: str | None = None
        self.head = HeadWatch()
        #: Other processes' claims of a consumer: only those of peer workers (join_peers).
        self.claims = ClaimWatch()
        #: Keys of this partition's appends in flight.
        self._keys = PendingKeys()
        if partition.key:
            self.recent = RecentEvents(
                DEFAULT_CAPACITY // _PARTITION_RING_DIVISOR,
                DEFAULT_MAX_BYTES // _PARTITION_RING_DIVISOR,
            )
        else:
            self.recent = RecentEvents()

    @property
    def _reader(self) -> SqliteReader:
        return self._store._reader_conn

    async def _write(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return await self._store._write_statement(sql, params)

    async def _submit(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run ``work(conn, ts, *args)`` inside the writer's transaction, in queue order."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._store._enqueue(_Command(lambda conn, ts: work(conn, ts, *args), future, self._key))
        return await future

    # -- events -------------------------------------------------------------------------------

    async def append(self, event_type: str, data_json: str) -> EventId:
        """Store one event (type and data already checked); return its id once durable.

        Cancelling the caller does not cancel the write: the event may still be stored.
        """
        return await self.submit_append(event_type, data_json)

    def submit_append(
        self,
        event_type: str,
        data_json: str,
        content_type: str | None = None,
        key: WriterKey | None = None,
    ) -> asyncio.Future[EventId]:
        """Queue one event; the future gets its id once it is durable (the first event's,
        for its writer's key known within the window)."""
        self._check_writable()
        future: asyncio.Future[EventId] = self._store.loop.create_future()
        if key is None or not self._store._dedup_ms:
            self._store._enqueue(_Append(event_type, data_json, future, content_type, self._tables))
        elif not self._keys.follows(key, future):
            self._store._enqueue(
                _Append(
                    event_type,
                    data_json,
                    future,
                    content_type,
                    self._tables,
                    False,
                    key,
                    self._keys,
                )
            )
        return future

    def submit_appends(
        self,
        events: Sequence[tuple[str, str, str | None]],
        keys: Sequence[WriterKey | None] | None = None,
    ) -> asyncio.Future[list[EventId]]:
        """Queue events that are committed together or not at all."""
        self._check_writable()
        queued, answers = plan_appends(self._keys if self._store._dedup_ms else None, events, keys)
        self._enqueue_planned(queued)
        return asyncio.gather(*answers)

    def _enqueue_planned(self, queued: list[Queued]) -> None:
        for (event_type, data_json, content_type), future, key, joined in queued:
            pending = self._keys if key is not None else None
            self._store._enqueue(
                _Append(
                    event_type, data_json, future, content_type, self._tables, joined, key, pending
                )
            )

    def _check_writable(self) -> None:
        if self._retired:
            raise StoreClosed(f"the stream {self.partition.stream} was dropped")
        if self._aggregate_of is not None:
            raise NotWritable(self.partition, self._aggregate_of)

    async def _page(
        self, sql: str, params: Sequence[Any], max_bytes: int, data_as_text: bool
    ) -> EventPage | None:
        return await self._reader.page(sql, params, max_bytes, data_as_text)

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        """Stored events as (id, type, data JSON, ts, content type)."""
        sql, params = rows_sql("?", after_id, limit, types, self._tables.events)
        with self._checking():
            return await self._reader.rows(event_rows, sql, params)

    async def last_given_id(self) -> int:
        """The newest id ever given to an event, even if that event is discarded."""
        rows = await self._reader.fetchall(self._last_given)
        return int(next(iter(rows))[0])

    async def stream_id(self) -> str:
        rows = await self._reader.fetchall("SELECT value FROM meta WHERE key = 'stream_id'")
        name = str(next(iter(rows))[0])
        return f"{name}-{self._key}" if self._key else name

    async def newest_event_id(self) -> int:
        rows = await self._reader.fetchall(self._newest)
        return int(next(iter(rows))[0])

    def _peek_rows(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
        """The rows of a small read, read here on the event loop (a tag read's handful of
        index entries and rows cost less than the hop to the read thread and back); None
        when the file is busy (never waited for) or the store closes: read on the thread."""
        if self._store._closing:
            return None
        try:
            return self._store._peek.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            log.debug("a read of %s goes to its thread: %s", self.partition, exc)
            return None

    async def _committed_head(self) -> int:
        """The newest id, read here on the event loop: the last key of the events' B-tree
        is a few microseconds away (measured: 15 µs of the server's CPU per read, against 42
        for the hop to the reader's thread and back), and never waited for (a busy file is
        read on the thread)."""
        rows = self._peek_rows(self._newest, ())
        if rows is not None:
            return int(rows[0][0])
        return await self.newest_event_id()

    # -- consumers ----------------------------------------------------------------------------

    async def register_consumer(self, user_id: UserId, component: str) -> bool:
        """Register (idempotent); True when it was new. A new consumer starts before the
        oldest retained event."""
        now = utc_timestamp()
        created = await self._write(
            "INSERT INTO consumers (partition_key, user_id, component, position,"
            " registered_at, last_seen_at) VALUES (?, ?, ?, 0, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (self._key, user_id, component, now, now),
        )
        if not created:
            await self._write(
                "UPDATE consumers SET last_seen_at = ?"
                " WHERE partition_key = ? AND user_id = ? AND component = ?",
                (now, self._key, user_id, component),
            )
        return bool(created)

    async def acknowledge(
        self, user_id: UserId, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        """Durably move a consumer's position forward to ``up_to`` (never back).

        Returns the position after the update, or None when the consumer is not registered
        (or, with ``epoch``, claimed by another stream since).
        """
        fence = " AND epoch = ?" if epoch is not None else ""
        rows = await self._write(
            "UPDATE consumers SET position = MAX(position, ?), last_seen_at = ?"
            f" WHERE partition_key = ? AND user_id = ? AND component = ?{fence}"
            " RETURNING position",
            (up_to, utc_timestamp(), self._key, user_id, component, *([epoch] if fence else [])),
        )
        return int(rows[0][0]) if rows else None

    async def claim_consumer(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        rows = await self._write(
            "UPDATE consumers SET epoch = epoch + 1, last_seen_at = ?"
            " WHERE partition_key = ? AND user_id = ? AND component = ?"
            " RETURNING epoch, position",
            (utc_timestamp(), self._key, user_id, component),
        )
        if not rows:
            return None
        epoch = int(rows[0][0])
        if self._store._peers is not None:
            self._store._peers.claimed(self._key, user_id, component, epoch)
        return epoch, int(rows[0][1])

    # -- AMQP consumer groups -----------------------------------------------------------------

    async def claim_group(
        self,
        user_id: UserId,
        group: str,
        epoch: int | None,
        *,
        hold_seconds: float,
        equal_takes_over: bool = False,
        free_only: bool = False,
    ) -> GroupClaim:
        """As the contract says; the claim is told to the other workers of the server."""
        sql = groups_sql.claim_sql(
            "?",
            _NOW,
            epoch=epoch is not None,
            equal_takes_over=equal_takes_over,
            free_only=free_only,
        )
        params = (self._key, user_id, group, epoch or 0, hold_seconds)
        claimed: GroupClaim = await self._submit(_claim_group_sync, sql, params)
        if claimed.taken and self._store._peers is not None:
            self._store._peers.group_claimed(
                self._key, user_id, group, claimed.claim, claimed.epoch
            )
        return claimed

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        if not holds:
            return []
        lost: list[GroupHold] = await self._submit(
            _hold_groups_sync, self._key, list(holds), hold_seconds
        )
        return lost

    async def release_group(self, user_id: UserId, group: str, claim: int) -> None:
        await self._write(groups_sql.release_sql("?"), (self._key, user_id, group, claim))

    async def acknowledge_group(
        self, user_id: UserId, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        key = self._key
        rows = await self._write(
            groups_sql.acknowledge_sql("?", "MAX"),
            (up_to, utc_timestamp(), key, user_id, component, key, user_id, group, claim),
        )
        return int(rows[0][0]) if rows else None

    async def position(self, user_id: UserId, component: str) -> int | None:
        rows = await self._reader.fetchall(
            "SELECT position FROM consumers"
            " WHERE partition_key = ? AND user_id = ? AND component = ?",
            (self._key, user_id, component),
        )
        for (position,) in rows:
            return int(position)
        return None

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """(position, newest event id) in one snapshot; None when it is not registered.
        The newest id is the last one ever given, even when it has been discarded."""
        rows = await self._reader.fetchall(
            f"SELECT position, ({self._last_given}) FROM consumers"
            " WHERE partition_key = ? AND user_id = ? AND component = ?",
            (self._key, user_id, component),
        )
        for position, head_id in rows:
            return int(position), int(head_id)
        return None

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        """Put a consumer's position anywhere (an operator's seek, not an acknowledgement)."""
        rows = await self._write(
            "UPDATE consumers SET position = ?, last_seen_at = ?"
            " WHERE partition_key = ? AND user_id = ? AND component = ? RETURNING 1",
            (position, utc_timestamp(), self._key, user_id, component),
        )
        return bool(rows)

    async def drop_consumer(self, user_id: UserId, component: str) -> bool:
        rows = await self._write(
            "DELETE FROM consumers WHERE partition_key = ? AND user_id = ? AND component = ?"
            " RETURNING 1",
            (self._key, user_id, component),
        )
        return bool(rows)

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        """Registered consumers (of one user, or all) with how far behind each is."""
        events = self._tables.events
        sql = (
            "SELECT u.name, c.user_id, c.component, c.position, c.registered_at, c.last_seen_at,"
            f" (SELECT COUNT(*) FROM {events} WHERE id > c.position),"
            f" (SELECT ts FROM {events} WHERE id > c.position ORDER BY id LIMIT 1)"
            " FROM consumers c JOIN users u ON u.id = c.user_id WHERE c.partition_key = ?"
        )
        params: list[Any] = [self._key]
        if user_id is not None:
            sql += " AND c.user_id = ?"
            params.append(user_id)
        sql += " ORDER BY u.name, c.component"
        rows = await self._reader.fetchall(sql, params)
        return [ConsumerRow(*row) for row in rows]

    async def consumer_lags(self, limit: int) -> list[ConsumerRow]:
        """What :meth:`consumers` returns, for the first ``limit`` consumers by user id and
        component, read in one pass (its cost grows with the events after the lowest
        position, not with their product by the consumers)."""
        sql = consumer_lags_sql("?", self._tables.events)
        return consumer_rows(await self._reader.fetchall(sql, [self._key, limit]))

    async def count_consumers(self) -> int:
        rows = await self._reader.fetchall(
            "SELECT COUNT(*) FROM consumers WHERE partition_key = ?", [self._key]
        )
        return int(next(iter(rows))[0])

    async def stream_bounds(self) -> StreamBounds:
        events = self._tables.events
        rows = await self._reader.fetchall(
            f"SELECT (SELECT id FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT id FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT COUNT(*) FROM {events})"
        )
        return StreamBounds(*next(iter(rows)))

    async def id_before(self, ts: str) -> int | None:
        """The newest id before the first event at or after ``ts``; None when that is the
        oldest retained event (or there are no events)."""
        events = self._tables.events
        rows = await self._reader.fetchall(
            f"SELECT (SELECT MAX(id) FROM {events} WHERE ts < ?), (SELECT MIN(id) FROM {events})",
            (ts,),
        )
        before, first = next(iter(rows))
        if before is not None:
            return int(before)
        return int(first) - 1 if first is not None and first > 1 else None

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        """What bounds discarding, read in one snapshot."""
        events = self._tables.events
        keep_sql = f"(SELECT MAX(id) FROM {events} WHERE ts < ?)" if keep_since_ts else "NULL"
        params: list[Any] = [self._key]
        if keep_since_ts:
            params.append(keep_since_ts)
        params.append(self._key)
        rows = await self._reader.fetchall(
            "SELECT (SELECT MIN(position) FROM consumers WHERE partition_key = ?),"
            f" (SELECT COALESCE(MAX(id), 0) FROM {events}),"
            f" (SELECT COALESCE(MIN(id), 0) FROM {events}),"
            f" {keep_sql}, {copied_up_to_sql('?')}",
            params,
        )
        return DiscardLimits(*next(iter(rows)))

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """Delete at most ``limit`` of the oldest events with id <= ``up_to``; how many went.

        Nothing above the lowest position of a registered consumer goes, whatever ``up_to``
        says (read in the deleting transaction: another process's pass, or a consumer moved
        back, cannot make it delete what is not acknowledged). Ids are never reused
        (AUTOINCREMENT), so deleting never frees an id. Events appended through DCB are the
        system of record: they stay unless ``dcb_events``.
        """
        count, newest = await self._submit(
            _delete_events_sync, self._tables, up_to, limit, dcb_events
        )
        if newest is not None:
            self.recent.forget_up_to(newest)
        return int(count)

    # -- DCB -----------------------------------------------------------------------------------

    async def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> int:
        if self._aggregate_of is not None:
            raise NotWritable(self.partition, self._aggregate_of)
        if self._retired:
            raise StoreClosed(f"the stream {self.partition.stream} was dropped")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._store._enqueue(_DcbAppend(events, condition, future, self._tables))
        return await future

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[StoredEvent], int]:
        sql, params = read_sql(query, after=after, before=before, limit=limit, tables=self._tables)
        # one statement, one snapshot: the head rides on every row, and on a marker row
        sql = f"SELECT * FROM ({sql}) UNION ALL SELECT {', '.join(['NULL'] * READ_WIDTH)}"
        sql = f"SELECT r.*, ({self._last_given}) FROM ({sql}) AS r"
        rows = self._peek_rows(sql, params) if limit <= INLINE_DCB_ROWS else None
        if rows is None:
            rows = await self._reader.fetchall(sql, params)
        with self._checking():
            events = [stored_event(r) for r in rows if r[0] is not None]
        if before is not None:
            events.sort(key=lambda e: -e.position)
        else:
            events.sort(key=lambda e: e.position)
        head = int(next(iter(rows))[READ_WIDTH]) if rows else await self.last_given_id()
        return events, head

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        """Drop consumers not seen since ``seen_before``; returns (user, component) of each."""
        rows = await self._write(
            "DELETE FROM consumers WHERE partition_key = ? AND last_seen_at < ?"
            " RETURNING (SELECT name FROM users WHERE id = user_id), component",
            (self._key, seen_before),
        )
        return [(str(user), str(component)) for user, component in rows]

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        """Mark consumers as seen now (push streams that are connected but idle)."""
        if not keys:
            return
        pairs = ",".join(["(?, ?)"] * len(keys))
        await self._write(  # one statement for all of them
            "UPDATE consumers SET last_seen_at = ? WHERE partition_key = ?"
            f" AND (user_id, component) IN (VALUES {pairs})",
            [utc_timestamp(), self._key, *(v for key in keys for v in key)],
        )

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        """(user, user id, component) of the consumer with the lowest position."""
        rows = await self._reader.fetchall(
            "SELECT u.name, c.user_id, c.component FROM consumers c"
            " JOIN users u ON u.id = c.user_id WHERE c.partition_key = ?"
            " ORDER BY c.position LIMIT 1",
            (self._key,),
        )
        for name, user_id, component in rows:
            return str(name), UserId(user_id), str(component)
        return None

    def _committed(self, ts: str, inserted: _Inserted) -> int:
        """After a commit: the events this partition got, for readers at the tail; returns
        their size as JSON (bytes)."""
        recent = []
        total = 0
        for event_id, event_type, data in inserted:
            text = event_json(event_id, event_type, data, ts)
            size = len(text) if text.isascii() else len(text.encode())
            total += size
            recent.append(RecentEvent(event_id, event_type, text, size, is_ftn18_type(event_type)))
        self.recent.extend(recent)
        self.head.advance(inserted[-1][0])
        return total


class SqliteStore(SqlitePartitionLog, CheckpointTables, TerminiTables, ConsoleSessionTables):
    """Event, consumer, user and stream storage; as a log, the view of ``events``/0.
    Create with :meth:`open`; close with :meth:`close`."""

    def __init__(
        self,
        path: Path,
        writer: sqlite3.Connection,
        write_thread: WorkerThread,
        reader: SqliteReader,
        peek: sqlite3.Connection,
        durability: Durability = Durability.FULL,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        self.path = path
        #: Seconds a producer's key is remembered (0: keys are ignored), and in milliseconds.
        self.dedup_window = dedup_window
        self._dedup_ms = window_ms(dedup_window)
        #: A lone write commits on the event loop (no fsync per commit at NORMAL).
        self._inline_commits = durability is Durability.NORMAL
        #: The writer's busy timeout as last set (inline commits set 0, the thread's 10 s).
        self._busy_ms = _BUSY_TIMEOUT_MS
        #: The last batch was one write: a lone write now commits inline only after one.
        self._lone = False
        #: Commits and bytes of events since the last checkpoint (with inline commits).
        self._unchecked = (0, 0)
        #: The checkpoint under way or done last, and the WAL's pages as it found them.
        self._checkpoint: asyncio.Future[int] | None = None
        self._wal_frames = 0
        self.description = str(path)
        self._writer = writer
        self._write_thread = write_thread
        self._reader_conn = reader
        #: A read-only connection used on the event loop, for :meth:`_committed_head` only.
        self._peek = peek
        self._queue = _Queue()
        self._closing = False
        #: The damaged events reads found (read by the metrics).
        self.damage_stats = DamageStats()
        super().__init__(self, DEFAULT_PARTITION)
        self._logs: dict[int, SqlitePartitionLog] = {0: self}
        #: Partition keys of aggregated streams, with their sources.
        self._aggregates: dict[int, str] = {}
        self._streams_listeners: set[Callable[[int], None]] = set()
        #: What group commit did (read by the metrics).
        self.write_stats = WriteStats()
        #: The loop the store serves (asking for the running one costs a system call).
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._write_loop(), name="futoin-evt-writer")
        self._watcher: asyncio.Task[None] | None = None
        #: The other workers of this server on this machine (see :meth:`join_peers`).
        self._peers: PeerNews | None = None
        #: The file descriptor of the workers' turn lock (see :func:`_commit_sync`).
        self._turns: int | None = None

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        durability: Durability = Durability.FULL,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> SqliteStore:
        window_ms(dedup_window)  # ValueError before anything is opened
        path = Path(path)
        write_thread = WorkerThread("futoin-evt-writer")
        try:
            writer = await write_thread.run(_open_writer, path, durability)
        except (sqlite3.Error, OSError) as exc:
            write_thread.stop()
            raise StoreUnavailable(f"cannot open the database {path}: {exc}") from None
        except BaseException:
            write_thread.stop()
            raise
        try:
            reader = await SqliteReader.open(path)
        except BaseException:
            await write_thread.run(writer.close)
            write_thread.stop()
            raise
        try:
            peek = _open_peek(path)
        except BaseException:
            await reader.close()
            await write_thread.run(writer.close)
            write_thread.stop()
            raise
        store = cls(path, writer, write_thread, reader, peek, durability, dedup_window)
        store.head.advance(await store.newest_event_id())
        return store

    def watch_other_writers(self, interval: float = 0.2) -> None:
        """Notice events other processes commit (the native API) within ``interval`` seconds.

        Only looks while someone waits for new events.
        """
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(interval), name="futoin-evt-watch")

    async def _watch(self, interval: float) -> None:
        while not self._closing:
            await asyncio.sleep(interval)
            for log_ in list(self._logs.values()):
                if log_.head.waiting:
                    try:
                        log_.head.advance(await log_.newest_event_id())
                    except Exception as exc:  # the store is closing, or the file is busy
                        log.debug("checking for new events failed: %s", exc)

    def join_peers(self, peers: PeerNews, turns: Path | None = None) -> PeerNews:
        """Tell ``peers`` of each commit's heads, each claim and each change of the streams;
        the news heard from them wakes this process's readers and push streams alike.
        Commits take turns with the peers' through an exclusive ``flock`` of ``turns``."""
        self._peers = peers
        if turns is not None and self._turns is None:
            self._turns = os.open(turns, os.O_RDWR | os.O_CREAT, 0o600)
        return _HeardFromPeers(self)

    async def close(self) -> None:
        """Commit what is queued, then close. Writes queued after this call are refused."""
        if self._closing:
            return
        self._closing = True
        self._queue.ready.set()
        await self._task
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._reader_conn.close()
        self._peek.close()
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        await self._write_thread.run(self._writer.close)
        self._write_thread.stop()
        if self._turns is not None:
            os.close(self._turns)

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- streams ------------------------------------------------------------------------------

    def partition_log(self, partition: Partition) -> SqlitePartitionLog:
        found = self._logs.get(partition.key)
        if found is None:
            found = self._logs[partition.key] = SqlitePartitionLog(self, partition)
            found._aggregate_of = self._aggregates.get(partition.key)
        return found

    def _known(self, infos: list[StreamInfo]) -> list[StreamInfo]:
        return note_aggregates(infos, self._aggregates, self._logs)

    #: Other processes' changes are seen only by polling the version.
    hears_all_stream_changes = False

    def listen_streams(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Changes this process makes; other processes' are seen by polling the version."""
        self._streams_listeners.add(callback)
        return lambda: self._streams_listeners.discard(callback)

    async def _streams_changed(self) -> None:
        if self._peers is not None:
            self._peers.streams_changed()
        await self._streams_heard()

    async def _streams_heard(self) -> None:
        if self._streams_listeners:
            version = await self.streams_version()
            for callback in list(self._streams_listeners):
                callback(version)

    async def add_stream(
        self, name: str, partitions: int, *, aggregate_of: str | None = None
    ) -> StreamInfo:
        check_stream_name(name)
        check_partition_count(partitions)
        info: StreamInfo = await self._submit(_add_stream_sync, name, partitions, aggregate_of)
        self._known([info])
        await self._streams_changed()
        return info

    async def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        check_partition_count(partitions)
        info: StreamInfo = await self._submit(_grow_stream_sync, name, partitions)
        await self._streams_changed()
        return info

    async def drop_stream(self, name: str) -> bool:
        if name == DEFAULT_STREAM:
            raise ValueError(f"the stream {DEFAULT_STREAM} cannot be dropped")
        keys: list[int] | None = await self._submit(_drop_stream_sync, name)
        for key in keys or ():
            dropped = self._logs.pop(key, None)
            if dropped is not None:
                dropped._retired = True
        if keys is not None:
            await self._streams_changed()
        return keys is not None

    async def streams(self) -> list[StreamInfo]:
        rows = await self._reader.fetchall(STREAM_ROWS + " ORDER BY s.name, p.number")
        return self._known(stream_infos(rows))

    async def stream(self, name: str) -> StreamInfo | None:
        rows = await self._reader.fetchall(
            STREAM_ROWS + " WHERE s.name = ? ORDER BY p.number", (name,)
        )
        infos = self._known(stream_infos(rows))
        return infos[0] if infos else None

    async def streams_version(self) -> int:
        rows = await self._reader.fetchall("SELECT value FROM meta WHERE key = 'streams_version'")
        return int(next(iter(rows))[0])

    # -- aggregates ---------------------------------------------------------------------------

    async def copy_into_aggregate(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int = 0
    ) -> AggregateCopy | None:
        """As the contract says: one command of the writer, so in a transaction that holds
        the file's write lock, which no other process's copying can enter meanwhile."""
        done: AggregateCopy | None = await self._submit(
            _copy_sync, Tables.of(aggregate.key), holder, lease_seconds, limit, start
        )
        if done is not None and done.copied:
            self.partition_log(aggregate).head.advance(done.head)
        return done

    async def release_aggregate(self, aggregate: Partition, holder: str) -> None:
        await self._write(release_sql("?"), (aggregate.key, holder))

    async def aggregate_sources(self, aggregate: Partition) -> list[tuple[int, int]]:
        rows = await self._reader.fetchall(positions_sql("?"), (aggregate.key,))
        return [(int(key), int(position)) for key, position in rows]

    async def consumer_counts(self, user_id: UserId | None = None) -> dict[int, int]:
        sql = consumer_counts_sql("?", user_id is not None)
        rows = await self._reader.fetchall(sql, [] if user_id is None else [user_id])
        return {int(key): int(count) for key, count in rows}

    # -- producers' keys ------------------------------------------------------------------------

    async def forget_keys(self, limit: int) -> int:
        """One chunk, in the writer's queue (it holds the file's write lock briefly), when
        the reader finds a key to forget: most turns find none and write nothing."""
        cutoff_ms = int(time.time() * 1000) - self._dedup_ms
        oldest = await self._reader.fetchall(sqlite_keys.OLDEST_SQL)
        if not oldest or oldest[0][0] >= cutoff_ms:
            return 0
        count: int = await self._submit(_forget_keys_sync, cutoff_ms, limit)
        return count

    # -- the Event Hubs checkpoint store ------------------------------------------------------

    async def _checkpoint_read(self, sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return list(await self._reader.fetchall(sql, params))

    async def _checkpoint_write(self, sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return await self._write(sql, params)

    # -- kept AMQP link termini ---------------------------------------------------------------

    _termini_now = _NOW

    async def _termini_run(self, statements: Statements) -> list[list[tuple[Any, ...]]]:
        """One statement as any other write (inline when it may), several as one command."""
        if len(statements) == 1:
            return [await self._write(*statements[0])]
        results: list[list[tuple[Any, ...]]] = await self._submit(_run_sync, statements)
        return results

    _termini_read = _checkpoint_read

    # -- the console's sessions (read and written as the checkpoint store's rows) -------------

    _session_read = _checkpoint_read
    _session_write = _checkpoint_write

    # -- users --------------------------------------------------------------------------------

    async def add_user(self, name: str, password_hash: str, *, is_admin: bool = False) -> UserId:
        rows = await self._access_write(
            "INSERT INTO users (name, password_hash, is_admin, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (name) DO NOTHING RETURNING id",
            (name, password_hash, int(is_admin), utc_timestamp()),
        )
        if not rows:
            raise KeyError(f"user {name} exists already")
        return UserId(rows[0][0])

    async def set_password(self, name: str, password_hash: str) -> bool:
        """Also ends the user's console sessions (see :mod:`.changes_sql`)."""
        rows = await self._access_write(
            "UPDATE users SET password_hash = ? WHERE name = ? RETURNING id",
            (password_hash, name),
            (changes_sql.end_sessions_sql("?"), (name,)),
        )
        return bool(rows)

    async def remove_user(self, name: str) -> bool:
        """Remove a user and their consumers (of every partition)."""
        rows = await self._access_write("DELETE FROM users WHERE name = ? RETURNING id", (name,))
        return bool(rows)

    async def get_user(self, name: str) -> User | None:
        rows = await self._reader.fetchall(
            "SELECT id, name, password_hash, is_admin FROM users WHERE name = ?", (name,)
        )
        for row in rows:
            return User(UserId(row[0]), row[1], row[2], bool(row[3]))
        return None

    async def list_users(self) -> list[User]:
        rows = await self._reader.fetchall(
            "SELECT id, name, password_hash, is_admin FROM users ORDER BY name"
        )
        return [User(UserId(r[0]), r[1], r[2], bool(r[3])) for r in rows]

    # -- grants -------------------------------------------------------------------------------

    async def grant(self, user_id: UserId, pattern: str, rights: int) -> None:
        await self._access_write(grants_sql.grant_sql("?"), (user_id, pattern, rights))

    async def revoke(self, user_id: UserId, pattern: str, rights: int) -> bool:
        rows = await self._access_write(
            grants_sql.revoke_sql("?"),
            (rights, user_id, pattern, rights),
            (grants_sql.forget_empty_sql("?"), (user_id, pattern)),
        )
        return bool(rows)

    # -- the access version (see :mod:`.changes_sql`) --------------------------------------

    async def _access_write(
        self, sql: str, params: Sequence[Any], *more: tuple[str, Sequence[Any]]
    ) -> list[tuple[Any, ...]]:
        """``sql``'s rows; ``more`` statements, and the access version moved on, in the same
        transaction."""
        statements = [(sql, params), *more, (_BUMP_ACCESS, ())]
        done: list[list[tuple[Any, ...]]] = await self._submit(_run_sync, statements)
        return done[0]

    #: Other processes' changes are seen only by reading the version.
    hears_all_access_changes = False

    def listen_access(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Nothing is heard on SQLite (the version is read): returns how to stop."""
        return _nothing

    async def access_version(self) -> int:
        """Read on the event loop when the file is not busy (a few microseconds)."""
        version = self.peek_access_version()
        if version is None:
            rows = await self._reader.fetchall(changes_sql.READ_ACCESS_VERSION, ())
            version = changes_sql.version_of(list(rows))
        return version

    def peek_access_version(self) -> int | None:
        """Read here on the event loop (3 µs); None when the file is busy or closing."""
        rows = self._peek_rows(changes_sql.READ_ACCESS_VERSION, ())
        return None if rows is None else changes_sql.version_of(rows)

    async def list_grants(self) -> list[GrantRow]:
        rows = await self._reader.fetchall(grants_sql.LIST_GRANTS, ())
        return [GrantRow(UserId(r[0]), r[1], r[2]) for r in rows]

    # -- the schema registry ------------------------------------------------------------------

    async def schema_rows(
        self, *, subject: str | None = None, schema_id: int | None = None, guid: str | None = None
    ) -> list[SchemaRow]:
        by, value = schemas_sql.rows_key(subject, schema_id, guid)
        rows = await self._reader.fetchall(schemas_sql.rows_sql("?", by), value)
        return [schemas_sql.schema_row(row) for row in rows]

    async def latest_schemas(self) -> list[SchemaRow]:
        rows = await self._reader.fetchall(schemas_sql.LATEST_SQL, ())
        return [schemas_sql.schema_row(row) for row in rows]

    async def add_schema_version(
        self, stream: str, subject: str, text: str, fingerprint: str, *, after: int
    ) -> SchemaRow:
        steps = schemas_sql.register_steps(
            stream, subject, text, fingerprint, str(uuid.uuid4()), after, "?"
        )
        row: SchemaRow = await self._submit(_registry_change_sync, steps)
        await self._streams_changed()
        return row

    async def delete_schema_versions(
        self, subject: str, versions: Sequence[int], *, permanent: bool
    ) -> None:
        steps = schemas_sql.delete_steps(subject, versions, permanent, "?")
        await self._submit(_registry_change_sync, steps)
        await self._streams_changed()

    async def schema_levels(self) -> dict[str, str]:
        rows = await self._reader.fetchall(schemas_sql.CONFIGS_SQL, ())
        return {str(subject): str(level) for subject, level in rows}

    async def set_schema_level(self, subject: str, stream: str | None, level: str | None) -> None:
        for sql, params in schemas_sql.set_config_steps(subject, stream, level, "?"):
            await self._write(sql, params)

    # -- the writer ---------------------------------------------------------------------------

    async def _write_statement(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        future: asyncio.Future[list[tuple[Any, ...]]] = asyncio.get_running_loop().create_future()
        self._enqueue(_Statement(sql, params, future))
        return await future

    def _enqueue(self, item: _Write) -> None:
        if self._closing:
            raise StoreClosed("the event store is closed")
        self._queue.items.append(item)
        self._queue.ready.set()

    async def _write_loop(self) -> None:
        queue = self._queue
        while True:
            if not queue.items:
                if self._closing:
                    return
                queue.ready.clear()
                await queue.ready.wait()
                continue
            count = joined_count(queue.items, MAX_WRITES_PER_COMMIT)
            batch = [queue.items.popleft() for _ in range(count)]
            try:
                results = await self._commit(batch)
            except Exception as exc:
                log.error("commit of %d writes failed: %s", len(batch), exc)
                results = [exc] * len(batch)
            for item, result in zip(batch, results, strict=True):
                if not item.future.done():
                    if isinstance(result, Exception):
                        item.future.set_exception(result)
                    else:
                        item.future.set_result(result)
                if type(item) is _Append and item.pending is not None:
                    assert item.key is not None
                    item.pending.answered(item.key, result)

    async def _commit(self, batch: list[_Write]) -> list[Any]:
        started = time.perf_counter()
        done = self._commit_inline(batch) if self._inline_commits else None
        if done is None:
            await self._set_busy_timeout(_BUSY_TIMEOUT_MS)
            done = await self._write_thread.run(
                _commit_sync, self._writer, batch, self._turns, self._dedup_ms
            )
        ts, inserted, results = done
        seconds = time.perf_counter() - started
        stats = self.write_stats
        size = 0
        for key, events in inserted.items():
            partition_log = self._logs.get(key)
            if partition_log is not None and events:
                bytes_ = partition_log._committed(ts, events)
                stats.appended_to(partition_log.labels, len(events), bytes_)
                size += bytes_
        stats.committed(len(batch), seconds)
        if self._peers is not None:
            for key, events in inserted.items():
                if events:
                    self._peers.committed(key, events[-1][0])
        if self._inline_commits:
            await self._checkpoint_now_and_then(size)
        return results

    def _commit_inline(
        self, batch: list[_Write]
    ) -> tuple[str, dict[int, _Inserted], list[Any]] | None:
        """Commit ``batch`` here, on the event loop, when it is one append or statement and
        so was the batch before (lone writes: nobody to share a commit with, so the thread
        hops would be all its cost) and the file is free: the workers' turn lock taken
        without waiting, SQLite's write lock without a busy wait. None when the writer
        thread must do it."""
        lone, self._lone = self._lone, len(batch) == 1
        if not (lone and self._lone) or isinstance(batch[0], _Command):
            return None  # others wait, or just did: group commit on the thread shares more
        if self._turns is not None:
            try:
                fcntl.flock(self._turns, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another worker commits: wait for it on the thread
        try:
            if self._busy_ms:
                _pragma(self._writer, "busy_timeout=0")
                self._busy_ms = 0
            try:
                return _commit_in_turn(self._writer, batch, self._dedup_ms)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _BUSY_CODES or self._writer.in_transaction:
                    raise
                return None  # another process writes: wait for it on the thread
        finally:
            if self._turns is not None:
                fcntl.flock(self._turns, fcntl.LOCK_UN)

    async def _set_busy_timeout(self, ms: int) -> None:
        if self._busy_ms != ms:
            await self._write_thread.run(_pragma, self._writer, f"busy_timeout={ms}")
            self._busy_ms = ms

    async def _checkpoint_now_and_then(self, size: int) -> None:
        """After :data:`CHECKPOINT_COMMITS` commits or :data:`CHECKPOINT_BYTES` of events,
        checkpoint the WAL (the writer's own checkpoints are off) on the writer thread with
        a connection of its own: writers go on meanwhile, inline ones included. Writers that
        never pause keep such a checkpoint from ever being complete, so the WAL could not
        start over; past :data:`CHECKPOINT_WAL_FRAMES` the writer checkpoints between two
        commits instead."""
        commits, written = self._unchecked
        commits, written = commits + 1, written + size
        if (commits < CHECKPOINT_COMMITS and written < CHECKPOINT_BYTES) or (
            self._checkpoint is not None and not self._checkpoint.done()
        ):
            self._unchecked = (commits, written)
            return
        self._unchecked = (0, 0)
        if self._wal_frames <= CHECKPOINT_WAL_FRAMES:
            self._checkpoint = self._write_thread.run(_checkpoint_sync, self.path)
            self._checkpoint.add_done_callback(self._checkpointed)
            return
        await self._set_busy_timeout(_BUSY_TIMEOUT_MS)
        try:
            self._wal_frames = await self._write_thread.run(_wal_checkpoint, self._writer)
        except sqlite3.Error as exc:  # the next one tries again
            log.warning("checkpoint of the WAL failed: %s", exc)

    def _checkpointed(self, done: asyncio.Future[int]) -> None:
        exc = None if done.cancelled() else done.exception()
        if exc is not None:  # the next one tries again
            log.warning("checkpoint of the WAL failed: %s", exc)
        elif not done.cancelled():
            self._wal_frames = done.result()


class _HeardFromPeers:
    """Another worker's news (:class:`PeerNews`), applied to the partitions open here."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._tasks: set[asyncio.Task[None]] = set()

    def committed(self, key: int, head: int) -> None:
        found = self._store._logs.get(key)
        if found is not None:
            found.head.advance(head)

    def claimed(self, key: int, user_id: UserId, component: str, epoch: int) -> None:
        found = self._store._logs.get(key)
        if found is not None:
            found.claims.claimed(user_id, component, epoch)

    def group_claimed(self, key: int, user_id: UserId, group: str, claim: int, epoch: int) -> None:
        found = self._store._logs.get(key)
        if found is not None:
            found.claims.group_claimed(user_id, group, claim, epoch)

    def streams_changed(self) -> None:
        if self._store._streams_listeners and not self._store._closing:
            task = asyncio.create_task(self._store._streams_heard())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


def _claim_group_sync(
    conn: sqlite3.Connection, _ts: str, sql: str, params: Sequence[Any]
) -> tuple[GroupClaim, _Inserted]:
    row = conn.execute(sql, params).fetchone()
    if row is not None:
        return GroupClaim(True, int(row[0]), int(row[1])), []
    held = conn.execute(groups_sql.holder_sql("?"), params[:3]).fetchone()
    return GroupClaim(False, int(held[0]), int(held[1])), []  # the upsert found its row


def _hold_groups_sync(
    conn: sqlite3.Connection, _ts: str, key: int, holds: list[GroupHold], hold_seconds: float
) -> tuple[list[GroupHold], _Inserted]:
    sql = groups_sql.hold_sql("?", _NOW)
    lost = [
        hold for hold in holds if conn.execute(sql, (hold_seconds, key, *hold)).fetchone() is None
    ]
    return lost, []


def _run_sync(
    conn: sqlite3.Connection, _ts: str, statements: Statements
) -> tuple[list[list[tuple[Any, ...]]], _Inserted]:
    return [conn.execute(sql, params).fetchall() for sql, params in statements], []


def _registry_change_sync(
    conn: sqlite3.Connection, _ts: str, steps: Generator[Step, Any, Any]
) -> tuple[Any, _Inserted]:
    """A change of the schema registry's versions (:mod:`.schemas_sql`'s steps) that moves
    the registry's version on."""
    done = _run_steps_sync(conn, steps)
    _bump_streams_version(conn)
    conn.execute(_BUMP_ACCESS)
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


#: Moves the access version on (see :mod:`.changes_sql`).
_BUMP_ACCESS: Final = changes_sql.bump_sql(postgres=False)


def _nothing() -> None:
    pass


def _bump_streams_version(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'streams_version'")


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
        as_source, as_aggregate = add_sources_sql("?")
        conn.execute(as_source, (cursor.lastrowid,))
        conn.execute(as_aggregate, (cursor.lastrowid, name))


def _add_stream_sync(
    conn: sqlite3.Connection, ts: str, name: str, partitions: int, aggregate_of: str | None
) -> tuple[StreamInfo, _Inserted]:
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


def _grow_stream_sync(
    conn: sqlite3.Connection, _ts: str, name: str, partitions: int
) -> tuple[StreamInfo, _Inserted]:
    info = _read_stream(conn, name)
    if info is None:
        raise KeyError(f"no stream {name}")
    if info.aggregate_of is not None and partitions != 1:
        raise ValueError(f"the stream {name} aggregates {info.aggregate_of}: it has one partition")
    if partitions < len(info.partitions):
        raise ValueError(
            f"the stream {name} has {len(info.partitions)} partitions: it can only grow"
        )
    if partitions > len(info.partitions):
        _add_partitions(conn, name, range(len(info.partitions), partitions))
        _bump_streams_version(conn)
        info = _read_stream(conn, name)
        assert info is not None
    return info, []


def _drop_stream_sync(
    conn: sqlite3.Connection, _ts: str, name: str
) -> tuple[list[int] | None, _Inserted]:
    info = _read_stream(conn, name)
    if info is None:
        return None, []
    aggregate = conn.execute(aggregated_by_sql("?"), (name,)).fetchone()
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


def _copy_sync(
    conn: sqlite3.Connection,
    _ts: str,
    aggregate: Tables,
    holder: str,
    lease_seconds: float,
    limit: int,
    start: int,
) -> tuple[AggregateCopy | None, _Inserted]:
    """The copying transaction's statements (:func:`.aggregate_sql.copy_steps`), run inside
    the writer's; the lease in this machine's clock (every process on the file shares it)."""
    now = time.time()
    lease = (lease_sql("?", "?", "?"), [aggregate.key, holder, now + lease_seconds, now])
    return _run_steps_sync(conn, copy_steps(aggregate, lease, limit, start, "?")), []


def _open_writer(path: Path, durability: Durability) -> sqlite3.Connection:
    _prepare_file(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={durability.value}")
    conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    if durability is Durability.NORMAL:  # the writer checkpoints on its thread instead
        conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA foreign_keys=ON")
    # A statement that may fail half-way (a multi-row insert under a unique index: the keys
    # of events) and a savepoint keep what they would undo in a sub-journal: in memory, not
    # in a temporary file opened, written and deleted for each commit.
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


def _open_peek(path: Path) -> sqlite3.Connection:
    """A read-only connection for the event loop: it never waits for a lock (busy: 0), and
    a statement that runs past :data:`PEEK_MAX_STEPS` is interrupted (the read goes to the
    read thread instead), so a query that scans more than it looked like never holds up
    the loop."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _pragma(conn, "query_only=1")
        _pragma(conn, "busy_timeout=0")
        conn.set_progress_handler(_interrupt, PEEK_MAX_STEPS)
    except BaseException:
        conn.close()
        raise
    return conn


def _interrupt() -> int:
    """A progress handler that ends the statement it is called in."""
    return 1


def _pragma(conn: sqlite3.Connection, pragma: str) -> None:
    """Run ``PRAGMA pragma`` to its end (an unread row would leave a statement open)."""
    conn.execute(f"PRAGMA {pragma}").fetchall()


def _checkpoint_sync(path: Path) -> int:
    """A passive checkpoint of the WAL with a connection of its own (it never waits for,
    nor holds up, the writers); returns the pages in the WAL."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        return _wal_checkpoint(conn)
    finally:
        conn.close()


def _wal_checkpoint(conn: sqlite3.Connection) -> int:
    """A passive checkpoint; the pages in the WAL."""
    _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames)


#: SQLite's result codes of a write lock held by another connection.
_BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def _commit_sync(
    conn: sqlite3.Connection, batch: list[_Write], turns: int | None = None, dedup_ms: int = 0
) -> tuple[str, dict[int, _Inserted], list[Any]]:
    """:func:`_commit_in_turn`, holding the workers' turn lock (``turns``, a file
    descriptor) when given: a worker waiting for another's commit wakes as it ends, rather
    than after SQLite's busy handler sleeps (1, 2, 5, 10 ms and more between tries)."""
    if turns is None:
        return _commit_in_turn(conn, batch, dedup_ms)
    fcntl.flock(turns, fcntl.LOCK_EX)
    try:
        return _commit_in_turn(conn, batch, dedup_ms)
    finally:
        fcntl.flock(turns, fcntl.LOCK_UN)


def _commit_in_turn(
    conn: sqlite3.Connection, batch: list[_Write], dedup_ms: int = 0
) -> tuple[str, dict[int, _Inserted], list[Any]]:
    """One transaction on the writer thread, the writes in queue order; the appends of a run
    of appends go in multi-row INSERTs, one group per partition (appends to different
    partitions are independent; every other write stays in its place between them).

    Returns the timestamp of the new events, the events inserted by partition key as
    (id, type, data) in id order (one writer holds the lock, so AUTOINCREMENT gives
    consecutive ids), and each write's result: an id, a statement's rows, a command's
    result, or the exception that failed that write alone (an IntegrityError, a refused
    command, a partition dropped meanwhile). An append whose key is stored within
    ``dedup_ms`` gets the stored id (see :mod:`.dedup`).
    """
    ts = utc_timestamp()
    inserted: dict[int, _Inserted] = {}
    results: list[Any] = [None] * len(batch)
    conn.execute("BEGIN IMMEDIATE")
    try:
        index = 0
        while index < len(batch):
            item = batch[index]
            if isinstance(item, _Append):
                by_partition: dict[int, list[tuple[int, _Append]]] = {}
                while index < len(batch):
                    append = batch[index]
                    if not isinstance(append, _Append):
                        break
                    by_partition.setdefault(append.tables.key, []).append((index, append))
                    index += 1
                for placed in by_partition.values():
                    _append_run(conn, ts, placed, inserted, results, dedup_ms)
                continue
            if isinstance(item, _DcbAppend):
                dcb_by_partition: dict[int, list[tuple[int, _DcbAppend]]] = {}
                while index < len(batch):
                    dcb = batch[index]
                    if not isinstance(dcb, _DcbAppend):
                        break
                    dcb_by_partition.setdefault(dcb.tables.key, []).append((index, dcb))
                    index += 1
                for dcb_placed in dcb_by_partition.values():
                    _dcb_run(conn, ts, dcb_placed, inserted, results)
                continue
            if isinstance(item, _Statement):
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


def _append_run(
    conn: sqlite3.Connection,
    ts: str,
    placed: list[tuple[int, _Append]],
    inserted: dict[int, _Inserted],
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
    placed: list[tuple[int, _Append]],
    dedup_ms: int,
    results: list[Any],
) -> tuple[list[tuple[int, _Append]], int]:
    """Insert a run's events, and their keys; those inserted and the first new id (the rest
    follow it). An append whose key is stored since the window's start gets the stored id
    in ``results`` and inserts nothing (a key stored before is taken over): see
    :mod:`.sqlite_keys`."""
    appends = [append for _, append in placed]
    if all(a.key is None for a in appends):
        first_id = _insert_events(
            conn, tables.events, [(a.type, a.data, a.content_type) for a in appends], ts
        )
        _keep_content_types(conn, tables.events, first_id, appends)
        return placed, first_id
    now_ms = int(time.time() * 1000)
    key_list = [a.key for a in appends]
    keys, count = sqlite_keys.run_keys(key_list), len(key_list) - key_list.count(None)
    first_id = _insert_events(
        conn, tables.events, [(a.type, a.data, a.content_type) for a in appends], ts
    )
    if sqlite_keys.insert_new(conn, tables.key, first_id, now_ms, keys, count):
        _keep_content_types(conn, tables.events, first_id, appends)
        return placed, first_id
    # A key is stored: undo the run (its events are the newest ids, its keys those of
    # them), then look the keys up and insert the rest. Without a savepoint, whose two
    # statements every keyed commit would pay.
    sqlite_keys.undo_new(conn, tables.key, keys, first_id)
    conn.execute(f"DELETE FROM {tables.events} WHERE id >= ?", (first_id,))
    conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (first_id - 1, tables.events))
    known = sqlite_keys.stored(conn, tables.key, keys, now_ms - dedup_ms)
    for index, append in placed:
        if append.key in known:
            results[index] = EventId(known[append.key])
    placed = [(index, a) for index, a in placed if a.key not in known]
    if not placed:
        return placed, 0
    appends = [append for _, append in placed]
    first_id = _insert_events(
        conn, tables.events, [(a.type, a.data, a.content_type) for a in appends], ts
    )
    _keep_content_types(conn, tables.events, first_id, appends)
    sqlite_keys.take_over(
        conn, tables.key, first_id, now_ms, sqlite_keys.run_keys([a.key for a in appends])
    )
    return placed, first_id


def _forget_keys_sync(
    conn: sqlite3.Connection, _ts: str, cutoff_ms: int, limit: int
) -> tuple[int, _Inserted]:
    """One chunk of :meth:`SqliteStore.forget_keys`."""
    return sqlite_keys.forget(conn, cutoff_ms, limit), []


def _insert_events(
    conn: sqlite3.Connection, table: str, events: Sequence[tuple[str, str, str | None]], ts: str
) -> int:
    """Insert events (type, data, content type) in multi-row statements, each with its
    checksum (the content type itself is set by :func:`_keep_content_types`); the first new
    id (the rest follow it)."""
    first_id = 0
    for start in range(0, len(events), _ROWS_PER_INSERT):
        chunk = events[start : start + _ROWS_PER_INSERT]
        sql = f"INSERT INTO {table} (type, data, ts, checksum) VALUES " + ",".join(
            ["(?, ?, ?, ?)"] * len(chunk)
        )
        cursor = conn.execute(
            sql, [v for t, d, c in chunk for v in (t, d, ts, event_checksum(t, d, ts, c))]
        )
        assert cursor.lastrowid is not None
        if start == 0:
            first_id = cursor.lastrowid - len(chunk) + 1
    return first_id


def _keep_content_types(
    conn: sqlite3.Connection, table: str, first_id: int, appends: list[_Append]
) -> None:
    """The content types of the events that came as AMQP ``data`` sections (few, and only
    they pay for it: the inserts stay three columns wide)."""
    kept = [
        (a.content_type, first_id + i) for i, a in enumerate(appends) if a.content_type is not None
    ]
    if kept:
        conn.executemany(f"UPDATE {table} SET content_type = ? WHERE id = ?", kept)


def _dcb_run(
    conn: sqlite3.Connection,
    ts: str,
    placed: list[tuple[int, _DcbAppend]],
    inserted: dict[int, _Inserted],
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
                conn, tables.events, [(e.type, e.data_json, None) for _, e in accepted], ts
            )
            if first_id != accepted[0][0]:
                raise sqlite3.OperationalError(f"ids from {first_id}, not {accepted[0][0]}")
            _insert_dcb_rows(conn, tables, accepted)
    except sqlite3.Error as exc:
        log.debug("DCB appends of one commit written one at a time: %s", exc)
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
    placed: list[tuple[int, _DcbAppend]],
    inserted: dict[int, _Inserted],
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
    placed: list[tuple[int, _DcbAppend]],
    results: list[Any],
) -> list[tuple[int, NewEvent]]:
    """The events of the appends of a run that may go in, with the positions they get (the
    run's writes are the next ones of the partition); each append's result set: its last
    position, a stored retry's, or why it is refused (see :func:`.dcb_sql.judge_batch`)."""
    (given,) = conn.execute(_last_given_id(tables)).fetchone()
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
    """What :func:`.dcb_sql.stored_retry` compares, of the stored events with these ids."""
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
) -> tuple[int, _Inserted]:
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
        conn, tables.events, [(e.type, e.data_json, None) for e in events], ts
    )
    placed = [(first_id + offset, event) for offset, event in enumerate(events)]
    _insert_dcb_rows(conn, tables, placed)
    return placed[-1][0], [(p, e.type, e.data_json) for p, e in placed]


def _delete_events_sync(
    conn: sqlite3.Connection, _ts: str, tables: Tables, up_to: int, limit: int, dcb_events: bool
) -> tuple[tuple[int, int | None], _Inserted]:
    """(count, newest id deleted) of one chunk of :meth:`SqlitePartitionLog.delete_events`."""
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
