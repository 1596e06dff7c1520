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
connection on a thread of their own (:mod:`.reads`), one job per read with its rows
converted there, and never wait for the writer (WAL).

At ``NORMAL`` durability a commit writes the WAL without an fsync, so what is queued commits
inline, on the event loop, without the two thread hops (see
:meth:`.writer.GroupCommit._commit_inline`); the WAL's checkpoints (which fsync) stay on the
thread. The writer and its transaction are :mod:`.writer` and :mod:`.transaction`; what
every backend shares is :mod:`..sql`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from ...domain.dcb import Query, SequencedEvent
from ...domain.groups import GroupClaim, GroupHold
from ...domain.partition import DEFAULT_PARTITION, Partition, StreamInfo
from ...domain.stream import DEFAULT_DEDUP_WINDOW, UserId, utc_timestamp
from ..base import AggregateCopy, Durability, EventPage, EventRow, PeerNews
from ..dedup import window_ms
from ..errors import StoreUnavailable
from ..page_rows import event_rows
from ..pages import ReadDialect, read_dialect, rows_sql
from ..sql.access import BUMP_ACCESS, READ_ACCESS_VERSION, version_of
from ..sql.calls import Rows, Statement, Statements
from ..sql.dcb import READ_WIDTH, SQLITE_FTN18_TYPE, read_sql, stored_event
from ..sql.dialect import SQLITE
from ..sql.store import SqlStore
from ..tables import Step, Tables
from ..thread import WorkerThread
from .commands import (
    add_stream_sync,
    claim_group_sync,
    copy_sync,
    delete_events_sync,
    drop_stream_sync,
    grow_stream_sync,
    hold_groups_sync,
    registry_change_sync,
    run_sync,
)
from .reads import SqliteReader
from .transaction import last_given_id_sql
from .writer import GroupCommit, PartitionWriter, open_writer, pragma

logger = logging.getLogger(__name__)
_R = TypeVar("_R")


def _dialect(tables: Tables) -> ReadDialect:
    return read_dialect(
        SQLITE,
        tables,
        start_row="SELECT -1, NULL, NULL, NULL, NULL, NULL, {start}",
        page="SELECT * FROM ({inner} ORDER BY id LIMIT ?)",
        head_row="SELECT 0, NULL, NULL, NULL, NULL, NULL,"
        f" (SELECT COALESCE(MAX(id), 0) FROM {tables.events})",
        ftn18_type=SQLITE_FTN18_TYPE,
    )


#: DCB reads of at most this many events are read on the event loop (see
#: :meth:`SqlitePartitionLog._peek_rows`): the first step of a read
#: (:data:`futoin_evt.dcb.service.FIRST_PAGE_SIZE`).
INLINE_DCB_ROWS: Final = 50
#: SQLite's virtual machine steps a read on the event loop may take before it is interrupted
#: and read on the read thread (about a millisecond). Measured: the head 15 steps, a tag read
#: of 10 events 900, 50 events of a type and a tag 9,300.
PEEK_MAX_STEPS: Final = 50_000


class SqlitePartitionLog(PartitionWriter):
    """One partition's log in the store's file: its own tables, head and consumers (other
    processes' claims: only those of peer workers, see ``join_peers``). Writes go through
    the store's one writer (a group commit takes appends to every partition)."""

    dialect = SQLITE
    _store: SqliteStore

    def __init__(self, store: SqliteStore, partition: Partition) -> None:
        self._store = store
        super().__init__(partition, store.damage_stats, store._dedup_ms)

    _read_dialect = staticmethod(_dialect)
    _last_given_sql = staticmethod(last_given_id_sql)

    @property
    def _reader(self) -> SqliteReader:
        return self._store._reader_conn

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return await self._reader.fetchall(sql, params)

    async def _write(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return await self._store._write_statement(sql, params)

    async def _run(self, statements: Statements) -> list[Rows]:
        """One statement as any other write (inline when it may), several as one command."""
        if len(statements) == 1:
            return [await self._write(*statements[0])]
        results: list[Rows] = await self._submit(run_sync, statements)
        return results

    # -- events -------------------------------------------------------------------------------

    async def _page(
        self, sql: str, params: Sequence[Any], max_bytes: int, data_as_text: bool
    ) -> EventPage | None:
        return await self._reader.page(sql, params, max_bytes, data_as_text)

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        """Stored events as (id, type, data JSON, ts, content type, attrs)."""
        sql, params = rows_sql(SQLITE.mark, after_id, limit, types, self._tables.events)
        with self._checking():
            return await self._reader.rows(event_rows, sql, params)

    def _peek_rows(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
        """The rows of a small read, read here on the event loop (a tag read's handful of
        index entries and rows cost less than the hop to the read thread and back); None
        when the file is busy (never waited for) or the store closes: read on the thread."""
        if self._store._closing:
            return None
        try:
            return self._store._peek.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            logger.debug("a read of %s goes to its thread: %s", self.partition, exc)
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

    async def _claim_group(
        self, sql: str, user_id: UserId, group: str, epoch: int, hold_seconds: float
    ) -> GroupClaim:
        """A group taken is told to the other workers of the server."""
        params = (self._key, user_id, group, epoch, hold_seconds)
        claimed: GroupClaim = await self._submit(claim_group_sync, sql, params)
        if claimed.taken and self._store._peers is not None:
            self._store._peers.group_claimed(
                self._key, user_id, group, claimed.claim, claimed.epoch
            )
        return claimed

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        if not holds:
            return []
        lost: list[GroupHold] = await self._submit(
            hold_groups_sync, self._key, list(holds), hold_seconds
        )
        return lost

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """Delete at most ``limit`` of the oldest events with id <= ``up_to``; how many went.

        Nothing above the lowest position of a registered consumer goes, whatever ``up_to``
        says (read in the deleting transaction: another process's pass, or a consumer moved
        back, cannot make it delete what is not acknowledged). Ids are never reused
        (AUTOINCREMENT), so deleting never frees an id. Events appended through DCB are the
        system of record: they stay unless ``dcb_events``.
        """
        count, newest = await self._submit(
            delete_events_sync, self._tables, up_to, limit, dcb_events
        )
        if newest is not None:
            self.recent.forget_up_to(newest)
        return int(count)

    # -- DCB -----------------------------------------------------------------------------------

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[SequencedEvent], int]:
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


class SqliteStore(SqlitePartitionLog, SqlStore[SqlitePartitionLog], GroupCommit):
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
        self._start(dedup_window, str(path))
        self._reader_conn = reader
        #: A read-only connection used on the event loop, for :meth:`_committed_head` only.
        self._peek = peek
        super().__init__(self, DEFAULT_PARTITION)
        self._logs: dict[int, SqlitePartitionLog] = {0: self}
        #: The other workers of this server on this machine (see :meth:`join_peers`).
        self._peers: PeerNews | None = None
        self._start_writing(writer, write_thread, durability)

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
            writer = await write_thread.run(open_writer, path, durability)
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
        self._start_watching(interval)

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
        if self._wal_checkpoint is not None:
            await asyncio.wait([self._wal_checkpoint])
        await self._write_thread.run(self._writer.close)
        self._write_thread.stop()
        if self._turns is not None:
            os.close(self._turns)

    # -- streams ------------------------------------------------------------------------------

    def _open_log(self, partition: Partition) -> SqlitePartitionLog:
        return SqlitePartitionLog(self, partition)

    #: Other processes' changes are seen only by polling the version.
    hears_all_stream_changes = False

    async def _streams_changed(self) -> None:
        if self._peers is not None:
            self._peers.streams_changed()
        await self._streams_heard()

    async def _streams_heard(self) -> None:
        if self._streams_listeners:
            version = await self.streams_version()
            for callback in list(self._streams_listeners):
                callback(version)

    async def _add_stream(self, name: str, partitions: int, aggregate_of: str | None) -> StreamInfo:
        info: StreamInfo = await self._submit(add_stream_sync, name, partitions, aggregate_of)
        return info

    async def _grow_stream(self, name: str, partitions: int) -> StreamInfo:
        info: StreamInfo = await self._submit(grow_stream_sync, name, partitions)
        return info

    async def _drop_stream(self, name: str) -> list[int] | None:
        keys: list[int] | None = await self._submit(drop_stream_sync, name)
        return keys

    # -- aggregates ---------------------------------------------------------------------------

    async def _copy(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int
    ) -> AggregateCopy | None:
        """One command of the writer, so in a transaction that holds the file's write lock,
        which no other process's copying can enter meanwhile."""
        done: AggregateCopy | None = await self._submit(
            copy_sync, Tables.of(aggregate.key), holder, lease_seconds, limit, start
        )
        return done

    # -- the access version (see :mod:`..sql.access`) --------------------------------------

    async def _access_write(self, sql: str, params: Sequence[Any], *more: Statement) -> Rows:
        statements = [(sql, params), *more, (BUMP_ACCESS, ())]
        done: list[Rows] = await self._submit(run_sync, statements)
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
            rows = await self._reader.fetchall(READ_ACCESS_VERSION, ())
            version = version_of(list(rows))
        return version

    def peek_access_version(self) -> int | None:
        """Read here on the event loop (3 µs); None when the file is busy or closing."""
        rows = self._peek_rows(READ_ACCESS_VERSION, ())
        return None if rows is None else version_of(rows)

    # -- the schema registry ------------------------------------------------------------------

    async def _change_schemas(self, steps: Generator[Step, Any, _R], subject: str) -> _R:
        done: _R = await self._submit(registry_change_sync, steps)
        await self._streams_changed()
        return done


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


def _nothing() -> None:
    pass


def _open_peek(path: Path) -> sqlite3.Connection:
    """A read-only connection for the event loop: it never waits for a lock (busy: 0), and
    a statement that runs past :data:`PEEK_MAX_STEPS` is interrupted (the read goes to the
    read thread instead), so a query that scans more than it looked like never holds up
    the loop."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        pragma(conn, "query_only=1")
        pragma(conn, "busy_timeout=0")
        conn.set_progress_handler(_interrupt, PEEK_MAX_STEPS)
    except BaseException:
        conn.close()
        raise
    return conn


def _interrupt() -> int:
    """A progress handler that ends the statement it is called in."""
    return 1
