"""SQLite's writer: one task per store takes whatever writes are queued, to every partition,
and commits them in one transaction (group commit, :mod:`.transaction`) on the writer's own
thread, or, at ``NORMAL``, inline on the event loop; the WAL's checkpoints stay
on the thread (see :mod:`.store`). Also the database file as the writer opens it."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from ...domain.dcb import AppendCondition, NewEvent
from ...domain.stream import EventId, event_json, is_ftn18_type
from ...stats import WriteStats
from ..base import Durability, PeerNews, joined_count
from ..dedup import Queued, WriterKey, full_form
from ..errors import StoreClosed
from ..recent import RecentEvent
from ..sql.log import SqlPartitionLog
from ..thread import WorkerThread
from .schema import ensure_schema
from .transaction import (
    Inserted,
    QueuedAppend,
    QueuedCommand,
    QueuedDcbAppend,
    QueuedStatement,
    QueuedWrite,
    commit_in_turn,
    commit_sync,
)

logger = logging.getLogger(__name__)

#: Largest number of queued writes committed in one transaction.
MAX_WRITES_PER_COMMIT: Final = 4096
#: SQLite's busy timeout on the writer thread (ms); inline commits never wait (0).
BUSY_TIMEOUT_MS: Final = 10_000
#: At ``NORMAL``, a batch of at most this many writes commits on the event loop (no fsync:
#: the commit costs less than the two thread hops); a larger one, on the writer thread.
INLINE_MAX_WRITES: Final = 256
#: With inline commits, the writer checkpoints the WAL on its thread after this many commits
#: (SQLite's own checkpoint would run inside a commit, fsync and all, on the event loop);
#: a small commit adds 2-3 pages, so the WAL stays near SQLite's default of 1,000 pages.
CHECKPOINT_COMMITS: Final = 300
#: ... or after this many bytes of events.
CHECKPOINT_BYTES: Final = 2 << 20
#: A WAL of more pages than this is checkpointed by the writer between two commits.
CHECKPOINT_WAL_FRAMES: Final = 1000


@dataclass(slots=True)
class WriteQueue:
    items: deque[QueuedWrite] = field(default_factory=deque)
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
            logger.warning(
                "%s may be read by other users (mode %o): it holds password hashes;"
                " chmod 600 it and its -wal and -shm files",
                path,
                mode & 0o777,
            )
    except OSError:  # a directory that does not exist, say: sqlite3 says it best
        pass


def open_writer(path: Path, durability: Durability) -> sqlite3.Connection:
    _prepare_file(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={durability.value}")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if durability is Durability.NORMAL:  # the writer checkpoints on its thread instead
        conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA foreign_keys=ON")
    # A statement that may fail half-way (a multi-row insert under a unique index: the keys
    # of events) and a savepoint keep what they would undo in a sub-journal: in memory, not
    # in a temporary file opened, written and deleted for each commit.
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


def pragma(conn: sqlite3.Connection, pragma: str) -> None:
    """Run ``PRAGMA pragma`` to its end (an unread row would leave a statement open)."""
    conn.execute(f"PRAGMA {pragma}").fetchall()


def wal_checkpoint_sync(path: Path) -> int:
    """A passive checkpoint of the WAL with a connection of its own (it never waits for,
    nor holds up, the writers); returns the pages in the WAL."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        return wal_checkpoint(conn)
    finally:
        conn.close()


def wal_checkpoint(conn: sqlite3.Connection) -> int:
    """A passive checkpoint; the pages in the WAL."""
    _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames)


#: SQLite's result codes of a write lock held by another connection.
BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class WriterStore(Protocol):
    """What a partition's side of the writer uses of its store."""

    loop: asyncio.AbstractEventLoop

    def _enqueue(self, item: QueuedWrite) -> None: ...


class PartitionWriter(SqlPartitionLog):
    """A partition's log as the writer sees it: its appends and commands go through the
    store's one queue."""

    _store: WriterStore

    async def _submit(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run ``work(conn, ts, *args)`` inside the writer's transaction, in queue order."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._store._enqueue(
            QueuedCommand(lambda conn, ts: work(conn, ts, *args), future, self._key)
        )
        return await future

    def submit_append(
        self,
        event_type: str,
        data_json: str,
        content_type: str | None = None,
        key: WriterKey | None = None,
        attrs: str | None = None,
    ) -> asyncio.Future[EventId]:
        """Queue one event; the future gets its id once it is durable (the first event's,
        for its writer's key known within the window)."""
        self._check_writable()
        future: asyncio.Future[EventId] = self._store.loop.create_future()
        if key is None or not self._dedup_ms:
            self._store._enqueue(
                QueuedAppend(event_type, data_json, future, content_type, self._tables, attrs=attrs)
            )
        elif not self._keys.follows(key, future):
            self._store._enqueue(
                QueuedAppend(
                    event_type,
                    data_json,
                    future,
                    content_type,
                    self._tables,
                    False,
                    key,
                    self._keys,
                    attrs,
                )
            )
        return future

    def _enqueue_planned(self, queued: list[Queued]) -> None:
        for event, future, key, joined in queued:
            event_type, data_json, content_type, attrs = full_form(event)
            pending = self._keys if key is not None else None
            self._store._enqueue(
                QueuedAppend(
                    event_type,
                    data_json,
                    future,
                    content_type,
                    self._tables,
                    joined,
                    key,
                    pending,
                    attrs,
                )
            )

    def _queue_dcb(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        future: asyncio.Future[int] = self._store.loop.create_future()
        self._store._enqueue(QueuedDcbAppend(events, condition, future, self._tables))
        return future

    def _committed(self, ts: str, inserted: Inserted) -> int:
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


class GroupCommit:
    """The store's writer: its queue, the task that commits it, and the WAL's checkpoints."""

    path: Path
    _closing: bool
    _dedup_ms: int
    _peers: PeerNews | None
    _logs: Mapping[int, PartitionWriter]
    write_stats: WriteStats

    def _start_writing(
        self, writer: sqlite3.Connection, write_thread: WorkerThread, durability: Durability
    ) -> None:
        """The writer's state, and its task started."""
        self._writer = writer
        self._write_thread = write_thread
        #: Commits on the event loop (no fsync per commit at NORMAL).
        self._inline_commits = durability is Durability.NORMAL
        #: The writer's busy timeout as last set (inline commits set 0, the thread's 10 s).
        self._busy_ms = BUSY_TIMEOUT_MS
        #: Commits and bytes of events since the last checkpoint (with inline commits).
        self._unchecked = (0, 0)
        #: The checkpoint under way or done last, and the WAL's pages as it found them.
        self._wal_checkpoint: asyncio.Future[int] | None = None
        self._wal_frames = 0
        self._queue = WriteQueue()
        #: The file descriptor of the workers' turn lock (see :func:`.transaction.commit_sync`).
        self._turns: int | None = None
        #: The loop the store serves (asking for the running one costs a system call).
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._write_loop(), name="futoin-evt-writer")

    async def _write_statement(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        future: asyncio.Future[list[tuple[Any, ...]]] = asyncio.get_running_loop().create_future()
        self._enqueue(QueuedStatement(sql, params, future))
        return await future

    def _enqueue(self, item: QueuedWrite) -> None:
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
                logger.error("commit of %d writes failed: %s", len(batch), exc)
                results = [exc] * len(batch)
            for item, result in zip(batch, results, strict=True):
                if not item.future.done():
                    if isinstance(result, Exception):
                        item.future.set_exception(result)
                    else:
                        item.future.set_result(result)
                if type(item) is QueuedAppend and item.pending is not None:
                    assert item.key is not None
                    item.pending.answered(item.key, result)

    async def _commit(self, batch: list[QueuedWrite]) -> list[Any]:
        started = time.perf_counter()
        done = self._commit_inline(batch) if self._inline_commits else None
        if done is None:
            await self._set_busy_timeout(BUSY_TIMEOUT_MS)
            done = await self._write_thread.run(
                commit_sync, self._writer, batch, self._turns, self._dedup_ms
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
            await self._wal_checkpoint_now_and_then(size)
        return results

    def _commit_inline(
        self, batch: list[QueuedWrite]
    ) -> tuple[str, dict[int, Inserted], list[Any]] | None:
        """Commit ``batch`` here, on the event loop, when it holds no command and at most
        :data:`INLINE_MAX_WRITES` writes (without an fsync, the thread's two hops and its
        wake-ups cost more than the commit: measured, 0.74x-0.86x of the server's CPU per
        addEvent) and the file is free: the workers' turn lock taken without waiting,
        SQLite's write lock without a busy wait. None when the writer thread must do it."""
        if len(batch) > INLINE_MAX_WRITES or any(type(item) is QueuedCommand for item in batch):
            return None  # a command may run long: on the thread, as a large batch
        if self._turns is not None:
            try:
                fcntl.flock(self._turns, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another worker commits: wait for it on the thread
        try:
            if self._busy_ms:
                pragma(self._writer, "busy_timeout=0")
                self._busy_ms = 0
            try:
                return commit_in_turn(self._writer, batch, self._dedup_ms)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in BUSY_CODES or self._writer.in_transaction:
                    raise
                return None  # another process writes: wait for it on the thread
        finally:
            if self._turns is not None:
                fcntl.flock(self._turns, fcntl.LOCK_UN)

    async def _set_busy_timeout(self, ms: int) -> None:
        if self._busy_ms != ms:
            await self._write_thread.run(pragma, self._writer, f"busy_timeout={ms}")
            self._busy_ms = ms

    async def _wal_checkpoint_now_and_then(self, size: int) -> None:
        """After :data:`CHECKPOINT_COMMITS` commits or :data:`CHECKPOINT_BYTES` of events,
        checkpoint the WAL (the writer's own checkpoints are off) on the writer thread with
        a connection of its own: writers go on meanwhile, inline ones included. Writers that
        never pause keep such a checkpoint from ever being complete, so the WAL could not
        start over; past :data:`CHECKPOINT_WAL_FRAMES` the writer checkpoints between two
        commits instead."""
        commits, written = self._unchecked
        commits, written = commits + 1, written + size
        if (commits < CHECKPOINT_COMMITS and written < CHECKPOINT_BYTES) or (
            self._wal_checkpoint is not None and not self._wal_checkpoint.done()
        ):
            self._unchecked = (commits, written)
            return
        self._unchecked = (0, 0)
        if self._wal_frames <= CHECKPOINT_WAL_FRAMES:
            self._wal_checkpoint = self._write_thread.run(wal_checkpoint_sync, self.path)
            self._wal_checkpoint.add_done_callback(self._wal_checkpointed)
            return
        await self._set_busy_timeout(BUSY_TIMEOUT_MS)
        try:
            self._wal_frames = await self._write_thread.run(wal_checkpoint, self._writer)
        except sqlite3.Error as exc:  # the next one tries again
            logger.warning("checkpoint of the WAL failed: %s", exc)

    def _wal_checkpointed(self, done: asyncio.Future[int]) -> None:
        exc = None if done.cancelled() else done.exception()
        if exc is not None:  # the next one tries again
            logger.warning("checkpoint of the WAL failed: %s", exc)
        elif not done.cancelled():
            self._wal_frames = done.result()
