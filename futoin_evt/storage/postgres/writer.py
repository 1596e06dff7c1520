"""PostgreSQL's writers: per partition and process, one task takes whatever appends are
queued (group commit) and one the DCB appends; the batches of the partitions ready at the
same moment commit in one statement on the store's writer connection, a partition whose
lock another process holds alone on a pooled one (see :mod:`.store`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ...domain.dcb import AppendCondition, NewEvent
from ...domain.partition import Partition
from ...domain.stream import EventId, event_json, is_ftn18_type, utc_timestamp
from ...ftn3.messages import encode_json
from ...stats import DamageStats, WriteStats
from ..base import PoolLimits, joined_count
from ..checksums import event_checksum
from ..dedup import PendingKeys, Queued, WriterKey, full_form
from ..errors import StoreClosed, StoreUnavailable, StoreUnreachable
from ..recent import RecentEvent
from ..sql.dcb import DcbAppend, condition_sql, judge_batch
from ..sql.log import SqlPartitionLog
from ..tables import Tables
from .connect import LINK_LOST, Connection, connect, first_line, lost
from .schema import (
    KEY_STORED_STATE,
    append_lock_sql,
    append_sql,
    combined_append_sql,
    keyed_append_sql,
    notify_head_sql,
)

logger = logging.getLogger(__name__)

#: Tries of a keyed batch that finds a key stored by another process meanwhile or past the
#: window (each try after the first sees what raced it, so a third rarely comes).
_KEYED_ATTEMPTS: Final = 5
#: Largest number of queued appends committed in one transaction.
MAX_APPENDS_PER_COMMIT: Final = 4096

#: Parameters per statement of DCB condition checks (PostgreSQL takes at most 65,535).
_CHECK_PARAMS: Final = 30_000


class _IdsMoved(Exception):
    """The ids a DCB batch drew are not the ones it was judged with."""

    def __init__(self, first: int, expected: int) -> None:
        super().__init__(f"ids from {first}, not {expected}")


def _dcb_checks(tables: Tables, appends: Sequence[DcbAppend]) -> list[tuple[str, list[Any]]]:
    """Statements of one row each: the first has the id the partition's sequence gives
    next, then, over them all, the first stored position each conditional append's query
    matches (NULL: none), in order."""
    sequence = f"pg_get_serial_sequence('{tables.events}', 'id')::regclass"
    columns = [f"COALESCE(pg_sequence_last_value({sequence}), 0) + 1"]
    params: list[Any] = []
    statements: list[tuple[str, list[Any]]] = []
    for _, condition in appends:
        if condition is None:
            continue
        sql, more = condition_sql(condition.fail_if_events_match, condition.after, "%s", tables)
        if params and len(params) + len(more) > _CHECK_PARAMS:
            statements.append(("SELECT " + ", ".join(columns), params))
            columns, params = [], []
        columns.append(f"({sql})")
        params += more
    if columns:
        statements.append(("SELECT " + ", ".join(columns), params))
    return statements


def _dcb_insert(
    tables: Tables, ts: str, accepted: Sequence[tuple[int, NewEvent]]
) -> tuple[str, list[Any]]:
    """One statement: the events, in order, then their DCB rows and tags with the ids they
    drew; its row is the array of those ids, ascending."""
    events = [event for _, event in accepted]
    tagged = [(tag, n) for n, event in enumerate(events, 1) for tag in event.tags]
    sql = (
        f"WITH e AS (INSERT INTO {tables.events} (type, data, ts, checksum)"
        " SELECT t, d, %s, s FROM unnest(%s::text[], %s::text[], %s::bigint[]) WITH ORDINALITY"
        " AS u(t, d, s, ord) ORDER BY ord RETURNING id),"
        " n AS (SELECT id, row_number() OVER (ORDER BY id) AS ord FROM e),"
        f" r AS (INSERT INTO {tables.dcb_events} (event_id, client_id, tags, is_bytes)"
        " SELECT n.id, u.c, u.g, u.b FROM n JOIN unnest(%s::text[], %s::text[], %s::boolean[])"
        " WITH ORDINALITY AS u(c, g, b, ord) ON u.ord = n.ord),"
        f" g AS (INSERT INTO {tables.event_tags} (tag, event_id)"
        " SELECT u.tag, n.id FROM n JOIN unnest(%s::text[], %s::bigint[]) AS u(tag, ord)"
        " ON u.ord = n.ord)"
        " SELECT array_agg(id ORDER BY id) FROM n"
    )
    params = [
        ts,
        [e.type for e in events],
        [e.data_json for e in events],
        [event_checksum(e.type, e.data_json, ts) for e in events],
        [e.id for e in events],
        [encode_json(list(e.tags)) for e in events],
        [e.is_bytes for e in events],
        [tag for tag, _ in tagged],
        [n for _, n in tagged],
    ]
    return sql, params


@dataclass(slots=True)
class QueuedAppend:
    type: str
    data: str
    future: asyncio.Future[EventId]
    content_type: str | None = None
    #: The next queued append belongs with this one: they are committed together.
    joined: bool = False
    #: The producer's key with its writer (see :mod:`..dedup`), and who answers the appends
    #: that follow it.
    key: WriterKey | None = None
    pending: PendingKeys | None = None
    #: Its attributes' JSON (:mod:`futoin_evt.domain.attrs`), when it has them.
    attrs: str | None = None


@dataclass(slots=True)
class AppendQueue:
    items: deque[QueuedAppend] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class QueuedDcbAppend:
    events: Sequence[NewEvent]
    condition: AppendCondition | None
    future: asyncio.Future[int]


#: A partition's batch for the combined commit, and where its (ids, ts) go.
Grouped = tuple["PartitionWriter", list[QueuedAppend], "asyncio.Future[tuple[list[int], str]]"]
#: Combined statements kept, by the partitions they take (cleared when full).
_COMBINED_SQL_KEPT: Final = 256


def planned(queued: list[Queued], pending: PendingKeys) -> list[QueuedAppend]:
    appends = []
    for event, future, key, joined in queued:
        event_type, data_json, content_type, attrs = full_form(event)
        appends.append(
            QueuedAppend(
                event_type,
                data_json,
                future,
                content_type,
                joined,
                key,
                pending if key else None,
                attrs,
            )
        )
    return appends


def _append_params(batch: list[QueuedAppend], ts: str) -> tuple[bool, list[Any]]:
    """Whether a batch has content types or attributes, and the parameters of its append
    (:func:`.schema.append_sql`): every event's checksum made here, once."""
    params: list[Any] = [
        ts,
        [item.type for item in batch],
        [item.data for item in batch],
        [event_checksum(item.type, item.data, ts, item.content_type, item.attrs) for item in batch],
    ]
    extras = any(item.content_type is not None or item.attrs is not None for item in batch)
    if extras:
        params.append([item.content_type for item in batch])
        params.append([item.attrs for item in batch])
    return extras, params


class WriterStore(Protocol):
    """What a partition's writer uses of its store."""

    _closing: bool
    write_stats: WriteStats
    _write_pool: AsyncConnectionPool[Connection]

    def _no_connection(self) -> StoreUnreachable: ...

    def _group_commit(
        self, partition_log: PartitionWriter, batch: list[QueuedAppend]
    ) -> asyncio.Future[tuple[list[int], str]]: ...

    async def _restore_writer(self) -> None: ...


class PartitionWriter(SqlPartitionLog):
    """A partition's log as its writers see it: its queues, their tasks, and its commits."""

    _store: WriterStore

    def __init__(self, partition: Partition, damage_stats: DamageStats, dedup_ms: int) -> None:
        super().__init__(partition, damage_stats, dedup_ms)
        self._lock_sql = append_lock_sql(partition.key)
        self._notify_sql = notify_head_sql(partition.key)
        self._append_sql = (
            append_sql(partition.key, extras=False),
            append_sql(partition.key, extras=True),
        )
        self._keyed_sql = (
            keyed_append_sql(partition.key),
            keyed_append_sql(partition.key, take_over=True),
        )
        self._queue = AppendQueue()
        #: The writer; it ends once its queue is empty when the stream is dropped.
        self._task: asyncio.Task[None] | None = None
        #: Its lock was held by another process at the last combined commit: the next batch
        #: waits for it alone.
        self._contended = False
        #: DCB appends waiting for the partition's DCB writer, and that writer.
        self._dcb_queue: deque[QueuedDcbAppend] = deque()
        self._dcb_ready = asyncio.Event()
        self._dcb_task: asyncio.Task[None] | None = None

    def _transaction(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """A pooled connection in a transaction."""
        raise NotImplementedError

    def submit_append(
        self,
        event_type: str,
        data_json: str,
        content_type: str | None = None,
        key: WriterKey | None = None,
        attrs: str | None = None,
    ) -> asyncio.Future[EventId]:
        self._check_writable()
        future: asyncio.Future[EventId] = asyncio.get_running_loop().create_future()
        if key is None or not self._dedup_ms:
            self._enqueue([QueuedAppend(event_type, data_json, future, content_type, attrs=attrs)])
        elif not self._keys.follows(key, future):
            self._enqueue(
                [
                    QueuedAppend(
                        event_type, data_json, future, content_type, False, key, self._keys, attrs
                    )
                ]
            )
        return future

    def _check_writable(self) -> None:
        if self._store._closing:
            raise StoreClosed("the event store is closed")
        super()._check_writable()

    def _enqueue_planned(self, queued: list[Queued]) -> None:
        self._enqueue(planned(queued, self._keys))

    def _enqueue(self, appends: list[QueuedAppend]) -> None:
        """Queue checked appends (:meth:`_check_writable`)."""
        if not appends:
            return
        self._queue.items.extend(appends)
        self._queue.ready.set()
        if self._task is None:
            self._task = asyncio.create_task(
                self._write_loop(), name=f"futoin-evt-pg-writer-{self._key}"
            )

    async def _write_loop(self) -> None:
        queue = self._queue
        while True:
            if not queue.items:
                if self._store._closing or self._retired:
                    return
                queue.ready.clear()
                await queue.ready.wait()
                continue
            count = joined_count(queue.items, MAX_APPENDS_PER_COMMIT)
            batch = [queue.items.popleft() for _ in range(count)]
            started = time.perf_counter()
            try:
                ids, ts, known = await self._commit_batch(batch)
            except Exception as exc:
                logger.error(
                    "commit of %d events to %s failed: %s", len(batch), self.partition, exc
                )
                if isinstance(exc, LINK_LOST):
                    exc = lost(exc)
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                    if item.pending is not None:
                        assert item.key is not None
                        item.pending.answered(item.key, exc)
                await self._store._restore_writer()
                continue
            seconds = time.perf_counter() - started
            if known is not None:  # a batch with keys
                batch, ids = self._answer_keyed(batch, ids, known)
                if not batch:
                    self._store.write_stats.committed(len(known), seconds)
                    continue
            recent = []
            total = 0
            for event_id, item in zip(ids, batch, strict=True):
                text = event_json(event_id, item.type, item.data, ts)
                size = len(text) if text.isascii() else len(text.encode())
                total += size
                recent.append(
                    RecentEvent(event_id, item.type, text, size, is_ftn18_type(item.type))
                )
                if not item.future.done():
                    item.future.set_result(EventId(event_id))
            self.recent.extend(recent)
            self.head.advance(ids[-1])
            stats = self._store.write_stats
            stats.committed(len(batch) + len(known or ()), seconds)
            stats.appended_to(self.labels, len(ids), total)

    @staticmethod
    def _answer_keyed(
        batch: list[QueuedAppend], ids: list[int], known: dict[int, int]
    ) -> tuple[list[QueuedAppend], list[int]]:
        """Answer a batch with keys (and the appends that followed each key); the appends
        inserted (not at the indexes of ``known``: answered by a stored key), and their
        ids."""
        for item, event_id in zip(batch, ids, strict=True):
            if not item.future.done():
                item.future.set_result(EventId(event_id))
            if item.pending is not None:
                assert item.key is not None
                item.pending.answered(item.key, event_id)
        if not known:
            return batch, ids
        fresh = [i for i in range(len(batch)) if i not in known]
        return [batch[i] for i in fresh], [ids[i] for i in fresh]

    def _retire(self) -> None:
        super()._retire()
        self._queue.ready.set()
        self._dcb_ready.set()

    async def _stop_writing(self) -> None:
        """Once the store is closing: commit what is queued."""
        self._queue.ready.set()
        self._dcb_ready.set()
        if self._task is not None:
            await self._task
        if self._dcb_task is not None:
            await self._dcb_task

    async def _commit_batch(
        self, batch: list[QueuedAppend]
    ) -> tuple[list[int], str, dict[int, int] | None]:
        """(each append's id, the ts, the indexes of those answered by a stored key with
        their ids: None when no append has a key)."""
        if any(item.key is not None for item in batch):
            return await self._commit_keyed(batch)
        ids, ts = await self._store._group_commit(self, batch)
        return ids, ts, None

    async def _commit_keyed(
        self, batch: list[QueuedAppend]
    ) -> tuple[list[int], str, dict[int, int] | None]:
        """A batch with keys: one statement (:func:`.schema.keyed_append_sql`) on a pooled
        writer connection, the partition's lock waited for; tried again, taking keys over,
        when one of its keys was stored by another process meanwhile (it is found then) or
        is past the window."""
        ts = utc_timestamp()
        window = self._dedup_ms
        params = (
            [item.type for item in batch],
            [item.data for item in batch],
            [item.content_type for item in batch],
            [item.attrs for item in batch],
            [None if item.key is None else item.key.key for item in batch],
            [None if item.key is None else item.key.writer for item in batch],
            [
                event_checksum(item.type, item.data, ts, item.content_type, item.attrs)
                for item in batch
            ],
            window,
            ts,
        )
        for attempt in itertools.count(1):
            take_over = attempt > 1
            try:
                async with self._store._write_pool.connection() as conn:
                    cursor = await conn.execute(self._keyed_sql[take_over], params)
                    row = await cursor.fetchone()
            except PoolTimeout:
                raise self._store._no_connection() from None
            except psycopg.Error as exc:
                if exc.sqlstate != KEY_STORED_STATE or attempt >= _KEYED_ATTEMPTS:
                    raise
                logger.debug("%s: a key was stored meanwhile; trying again", self.partition)
                continue
            assert row is not None
            if take_over or not row[4]:  # else keys past the window: nothing was inserted
                break
        assert row is not None
        added, known_ords, known_ids, _notified, _past_window = row
        known = {int(o) - 1: int(i) for o, i in zip(known_ords or (), known_ids or (), strict=True)}
        new_ids = iter(added or ())
        ids = [known[i] if i in known else int(next(new_ids)) for i in range(len(batch))]
        return ids, ts, known

    async def _commit_alone(self, batch: list[QueuedAppend]) -> tuple[list[int], str]:
        """Under the partition's lock, waited for, on a pooled writer connection."""
        try:
            async with self._store._write_pool.connection() as conn:
                return await self._commit(conn, batch)
        except PoolTimeout:
            raise self._store._no_connection() from None

    async def _commit(self, conn: Connection, batch: list[QueuedAppend]) -> tuple[list[int], str]:
        ts = utc_timestamp()
        with_content, params = _append_params(batch, ts)
        cursor = await conn.execute(self._append_sql[with_content], params)
        row = await cursor.fetchone()
        assert row is not None
        return list(row[0]), ts

    def _queue_dcb(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        """For this partition's DCB writer, which commits the appends queued together in one
        transaction (group commit; see :meth:`_dcb_commit`)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._dcb_queue.append(QueuedDcbAppend(events, condition, future))
        self._dcb_ready.set()
        if self._dcb_task is None:
            self._dcb_task = asyncio.create_task(
                self._dcb_loop(), name=f"futoin-evt-pg-dcb-{self._key}"
            )
        return future

    async def _dcb_loop(self) -> None:
        queue = self._dcb_queue
        while True:
            if not queue:
                if self._store._closing or self._retired:
                    return
                self._dcb_ready.clear()
                await self._dcb_ready.wait()
                continue
            batch = [queue.popleft() for _ in range(min(len(queue), MAX_APPENDS_PER_COMMIT))]
            try:
                results, newest = await self._dcb_commit(batch)
            except Exception as exc:
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            if newest:
                self.head.advance(newest)
            for item, result in zip(batch, results, strict=True):
                if item.future.done():
                    continue
                if isinstance(result, Exception):
                    item.future.set_exception(result)
                else:
                    item.future.set_result(result)

    async def _dcb_commit(self, batch: list[QueuedDcbAppend]) -> tuple[list[int | Exception], int]:
        """One transaction under the partition's append lock that orders every append to
        it, so each condition is checked against everything committed before, in any
        process, and against the batch's appends before it; nothing can commit between a
        check and its insert. A refused append (a failed condition, an id stored with other
        content) is refused alone. A fixed number of round trips whatever the batch: the
        lock and every condition's check of the store in one pipeline, the judging here
        (:func:`..sql.dcb.judge_batch`), the accepted events, their DCB rows and tags in one
        statement. Returns each append's position or refusal, and the newest position
        written (0: none). Should the database refuse a statement, or the ids drawn not be
        the ones the batch was judged with, each append of a batch of several is committed
        alone."""
        ts = utc_timestamp()
        t = self._tables
        appends = [(item.events, item.condition) for item in batch]
        client_ids = [e.id for events, _ in appends for e in events if e.id is not None]
        try:
            async with self._transaction() as conn:
                async with conn.pipeline():
                    await conn.execute(self._lock_sql)
                    checks = [
                        await conn.execute(sql, params) for sql, params in _dcb_checks(t, appends)
                    ]
                    retries = None
                    if client_ids:
                        retries = await conn.execute(
                            "SELECT d.client_id, d.event_id, e.type, e.data, d.tags, d.is_bytes"
                            f" FROM {t.dcb_events} d JOIN {t.events} e ON e.id = d.event_id"
                            " WHERE d.client_id = ANY(%s)",
                            (client_ids,),
                        )
                found = [value for cursor in checks for value in await cursor.fetchone() or ()]
                stored = await retries.fetchall() if retries is not None else []
                next_id, seen = int(found[0]), iter(found[1:])
                conflicts = [None if c is None else next(seen) for _, c in appends]
                accepted, results = judge_batch(appends, next_id, stored, conflicts)
                if not accepted:
                    return results, 0
                cursor = await conn.execute(*_dcb_insert(t, ts, accepted))
                row = await cursor.fetchone()
                assert row is not None
                drawn = [int(i) for i in row[0]]
                if drawn != [position for position, _ in accepted]:
                    if len(batch) > 1:
                        raise _IdsMoved(drawn[0], accepted[0][0])
                    results = [drawn[-1]]  # alone, its result is what it got
                await conn.execute(self._notify_sql)
        except (psycopg.Error, _IdsMoved) as exc:
            if len(batch) == 1:
                raise
            logger.debug("DCB appends of one batch committed one at a time: %s", first_line(exc))
            results, newest = [], 0
            for item in batch:
                try:
                    alone, its_newest = await self._dcb_commit([item])
                except psycopg.Error as failed:
                    results.append(failed)
                    continue
                results.extend(alone)
                newest = max(newest, its_newest)
            return results, newest
        return results, drawn[-1]


class CombinedCommits:
    """The store's commit of the batches of the partitions ready at the same moment, in one
    statement on its writer connection (:func:`.schema.combined_append_sql`)."""

    url: str
    _limits: PoolLimits
    _writer: Connection
    #: The writers' connection options (the durability's).
    _write_options: str

    def _start_combining(self) -> None:
        #: The partitions' batches waiting for the next combined commit.
        self._grouped: list[Grouped] = []
        self._group_ready = asyncio.Event()
        self._group_task: asyncio.Task[None] | None = None
        self._alone: set[asyncio.Task[None]] = set()
        self._combined_sql: dict[tuple[tuple[int, bool], ...], str] = {}

    def _group_commit(
        self, partition_log: PartitionWriter, batch: list[QueuedAppend]
    ) -> asyncio.Future[tuple[list[int], str]]:
        """Commit ``batch`` with the batches of other partitions ready at the same time."""
        future: asyncio.Future[tuple[list[int], str]] = asyncio.get_running_loop().create_future()
        self._grouped.append((partition_log, batch, future))
        self._group_ready.set()
        if self._group_task is None:
            self._group_task = asyncio.create_task(self._group_loop(), name="futoin-evt-pg-group")
        return future

    async def _group_loop(self) -> None:
        while True:
            if not self._grouped:
                self._group_ready.clear()
                await self._group_ready.wait()
                continue
            await asyncio.sleep(0)  # the partitions' writers ready now join this commit
            entries, self._grouped = self._grouped, []
            together = []
            for entry in entries:
                if entry[0]._contended:
                    self._start_alone(entry)
                else:
                    together.append(entry)
            if together:
                await self._commit_together(together)

    async def _commit_together(self, entries: list[Grouped]) -> None:
        ts = utc_timestamp()
        parts: list[tuple[int, bool]] = []
        params: list[Any] = []
        for partition_log, batch, _future in entries:
            with_content, its_params = _append_params(batch, ts)
            parts.append((partition_log._key, with_content))
            params += its_params
        shape = tuple(parts)
        sql = self._combined_sql.get(shape)
        if sql is None:
            if len(self._combined_sql) >= _COMBINED_SQL_KEPT:
                self._combined_sql.clear()
            sql = self._combined_sql[shape] = combined_append_sql(parts)
        try:
            cursor = await self._writer.execute(sql, params)
            row = await cursor.fetchone()
            assert row is not None
        except LINK_LOST as exc:
            # The commit may or may not have happened: no second try, the callers are told.
            for _log, _batch, future in entries:
                if not future.done():
                    future.set_exception(exc)
            return
        except psycopg.Error as exc:  # refused as a whole (a partition dropped meanwhile)
            logger.debug("a combined commit failed, each partition alone: %s", first_line(exc))
            for entry in entries:
                self._start_alone(entry)
            return
        for n, entry in enumerate(entries):
            partition_log, _batch, future = entry
            ids = row[2 * n]
            if ids is None:  # its lock is held by another process's commit
                partition_log._contended = True
                self._start_alone(entry)
            elif not future.done():
                future.set_result((list(ids), ts))

    def _start_alone(self, entry: Grouped) -> None:
        """Commit one partition's batch in a task of its own (it waits for the partition's
        lock, and nothing else waits for it)."""
        partition_log, batch, future = entry

        async def commit() -> None:
            try:
                result = await partition_log._commit_alone(batch)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            partition_log._contended = False
            if not future.done():
                future.set_result(result)

        task = asyncio.create_task(commit(), name=f"futoin-evt-pg-alone-{partition_log._key}")
        self._alone.add(task)
        task.add_done_callback(self._alone.discard)

    async def _restore_writer(self) -> None:
        if not self._writer.broken:
            return
        with contextlib.suppress(StoreUnavailable):
            self._writer = await connect(
                self.url,
                autocommit=True,
                link_timeout=self._limits.link_timeout,
                options=self._write_options,
            )
