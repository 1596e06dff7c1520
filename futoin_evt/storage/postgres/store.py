"""The PostgreSQL event store: several futoin-evt processes on one database.

Commit-ordered ids across processes, per partition
--------------------------------------------------
Each partition has its own tables and id sequence (``events``/0 keeps ``events``). A
sequence alone does not keep the ordering rule of :mod:`futoin_evt.storage.base`:
transaction A takes id 10, B takes 11, B commits first, a reader moves past 11, and 10
appears later. Here every transaction that adds events to a partition first takes that
partition's transaction-scoped advisory lock (``pg_advisory_xact_lock``, see
:func:`.schema.append_lock_sql`), then draws its ids from the partition's sequence, then
commits. PostgreSQL releases transaction locks only after the commit is durable and visible
(``CommitTransaction`` marks the transaction committed before it releases its locks), so the
next holder draws larger ids only after the previous ids are visible: ids are handed out and
become visible in the same order, in every process and in the native API. A transaction that
rolls back leaves a gap, which readers simply never see. No lock spans partitions: writes to
different partitions never wait for each other.

Why a lock and not the visibility horizon (an ``xid8`` per row, readers stopping at
``pg_snapshot_xmin(pg_current_snapshot())``): the horizon orders rows by transaction id, not
by the id the producer gets back. Transaction T1 (older xid, e.g. an application's
transaction that wrote its business rows first) draws id 10 after T2 (newer xid) drew 9; T1
commits while T2 runs, the horizon passes T1's xid, a reader sees 10, and 9 appears later:
the rule breaks for ids from a sequence, and FTN18 positions are those ids. It would keep
the rule only with positions of (xid, id), which no door can give. Nor is it faster here:
measured side by side (``python -m bench.partitions --rows ordering``: two processes of
32-row one-statement commits into one partition's table, three runs of three in one
sitting, rows/s, lock against horizon), 10,810 / 10,929, 8,148 / 8,521 and 6,043 / 6,050.
Once a commit is one message, the lock is held for the server's own work and the WAL flush,
which the horizon's commits wait for too.

The lock makes appends to one partition one at a time across the cluster, so each process
batches: one writer task per partition per process takes whatever appends are queued (group
commit), and the batches of the partitions ready at the same moment go in ONE statement and
commit on the store's writer connection (:func:`.schema.combined_append_sql`): each
partition's lock taken with a try, its rows inserted only when taken. A partition whose
lock another process holds gets nothing and draws no ids; its batch then commits alone on a
pooled connection (:func:`.schema.append_sql`, the lock waited for), in a task of its own,
so no partition waits for another's commit. The commit rate, not the rows, is what bounds
appends here (a WAL flush each): with 32 appends in flight over 4 partitions, one commit per
partition carried 8 rows, and one commit for all of them made 2.1x to 2.9x the rows/s in raw
SQL (``--rows commits``) and 2.4x in the store (``--rows store``, against the store with a
commit per partition).

Wake-ups across processes
-------------------------
The commit sends ``NOTIFY futoin_evt_head, '<newest id>'`` (``'<key>:<newest id>'`` for a
partition other than ``events``/0; ``'streams:<version>'`` when the registry changes). A
NOTIFY takes a lock for the whole cluster through its commit, which serialises commits that
notify (``Lock:object`` in ``pg_stat_activity``); measured, it did not limit commits to
different tables (2 processes of 32-row commits to two tables: about 21,000 rows/s with the
NOTIFY in the transaction, 21,000 without it, 16,000-17,000 with it in a transaction of its
own after the commit; 8-row commits from 4 connections: within the noise), so it stays in
the transaction, and the combined commit sends one per partition in one commit. Every
process LISTENs on its own connection and advances the partition's
:class:`~futoin_evt.storage.head.HeadWatch`; a slow poll of the newest id covers a
notification lost with a broken connection. A claim of a consumer (a new epoch) goes out on
the same channel (``'claim <user id> <epoch> <component>'``, ``'claim.<key> ...'`` for a
partition other than ``events``/0), so a push stream on another process that held the
consumer stops within one wake-up (a lost one: at its next acknowledgement, which is fenced).
So does a claim of an AMQP consumer group (``'group <user id> <claim> <epoch> <group>'``,
``'group.<key> ...'``): the link that held it on another process is detached.

Outages
-------
A call that finds the database gone, or no pooled connection free within the pool's bound,
fails with :class:`~..errors.StoreUnreachable`. Nothing waits for the database to come back:
the writer reconnects on its next batch, the pool replaces broken connections, the listener
retries every second and then catches up with the newest id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ...domain.dcb import Query, SequencedEvent
from ...domain.groups import GroupClaim, GroupHold
from ...domain.partition import DEFAULT_PARTITION, Partition, StreamInfo
from ...domain.stream import DEFAULT_DEDUP_WINDOW, UserId, utc_timestamp
from ..base import DEFAULT_POOL, AggregateCopy, Durability, EventRow, PeerNews, PoolLimits
from ..dedup import window_ms
from ..errors import SchemaChanged, StoreUnreachable
from ..head import SharedLook
from ..page_rows import event_rows
from ..pages import ReadDialect, read_dialect, rows_sql
from ..sql.access import ACCESS_PAYLOAD_PREFIX, BUMP_ACCESS, READ_ACCESS_VERSION, version_of
from ..sql.aggregates import (
    add_sources_sql,
    aggregated_by_sql,
    check_aggregate,
    copied_up_to_sql,
    copy_steps,
    lease_sql,
)
from ..sql.calls import Rows, Statement, Statements
from ..sql.dcb import PG_FTN18_TYPE, read_sql, stored_event
from ..sql.dialect import POSTGRES
from ..sql.groups import holder_sql
from ..sql.store import SqlStore
from ..sql.streams import BUMP_STREAMS_VERSION, grows
from ..tables import STREAM_ROWS, Step, Tables, stream_infos
from .connect import (
    CONNECT_TIMEOUT,
    LINK_LOST,
    Connection,
    connect,
    first_line,
    link_settings,
    lost,
    safe_url,
)
from .listener import NotificationListener
from .schema import (
    CHANNEL,
    CLAIM_PAYLOAD,
    GROUP_CLAIM_PAYLOAD,
    STREAMS_PAYLOAD_PREFIX,
    append_lock_sql,
    drop_partition_tables_sql,
    ensure_schema,
    notify_head_sql,
    partition_tables_sql,
    try_retention_lock_sql,
)
from .writer import CombinedCommits, PartitionWriter

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Connections the writers of partitions other than ``events``/0 share (opened when needed).
WRITE_POOL_MAX: Final = 8
#: The writers' connection options at each durability.
WRITE_OPTIONS: Final = {Durability.FULL: "", Durability.NORMAL: "-c synchronous_commit=off"}
#: The write pool's too. Its statements (:func:`.schema.keyed_append_sql`,
#: :func:`.schema.append_sql`) are made to run one way whatever their parameters; left to
#: choose, PostgreSQL plans the keyed append anew at each run (its plan for the arrays given
#: looks cheaper than the generic one), which costs more than the rest of it.
WRITE_POOL_OPTIONS: Final = "-c plan_cache_mode=force_generic_plan"
#: The ring of recent events of a partition other than ``events``/0: a server may hold many.
_PARTITION_RING_DIVISOR: Final = 32


def _dialect(tables: Tables) -> ReadDialect:
    return read_dialect(
        POSTGRES,
        tables,
        start_row="SELECT -1::bigint, NULL::text, NULL::text, NULL::text, NULL::text,"
        " NULL::text, {start}::bigint",
        page="(SELECT * FROM ({inner} ORDER BY id LIMIT %s) AS page)",
        head_row=f"SELECT 0, NULL, NULL, NULL, NULL, NULL, (SELECT MAX(id) FROM {tables.events})",
        ftn18_type=PG_FTN18_TYPE,
    )


def _last_deleted_key(key: int) -> str:
    """The meta key that keeps the newest id given when all of a partition's are discarded."""
    return "last_deleted_id" if key == 0 else f"last_deleted_id.{key}"


def _last_given_id(tables: Tables) -> str:
    return (
        f"SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM {tables.events}),"
        " (SELECT COALESCE(MAX(value::bigint), 0) FROM meta"
        f" WHERE key = '{_last_deleted_key(tables.key)}'))"
    )


def _claim_kind(key: int, word: str = CLAIM_PAYLOAD) -> str:
    """The first word of a claim's payload on the channel (``word``: a consumer's claim, or
    :data:`GROUP_CLAIM_PAYLOAD`)."""
    return word if key == 0 else f"{word}.{key}"


class PostgresPartitionLog(PartitionWriter):
    """One partition's log: its own tables, sequence, head, consumers and writer tasks."""

    dialect = POSTGRES
    _store: PostgresStore

    def __init__(self, store: PostgresStore, partition: Partition) -> None:
        self._store = store
        super().__init__(partition, store.damage_stats, store._dedup_ms)
        #: The newest id read for the readers that ask at once (see :meth:`_committed_head`).
        self._newest_look = SharedLook(self.newest_event_id)

    # -- plumbing -------------------------------------------------------------------------

    _read_dialect = staticmethod(_dialect)
    _last_given_sql = staticmethod(_last_given_id)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """On a pooled connection (in autocommit: a write commits as it returns)."""
        try:
            async with self._store._pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return await cursor.fetchall() if cursor.description is not None else []
        except PoolTimeout:
            raise self._store._no_connection() from None
        except LINK_LOST as exc:
            raise lost(exc) from None

    _write = _fetch

    async def _run(self, statements: Statements) -> list[Rows]:
        """One statement on its own, or one transaction, its statements sent at once
        (psycopg's pipeline mode)."""
        if len(statements) == 1:
            return [await self._fetch(*statements[0])]
        async with self._transaction() as conn:
            async with conn.pipeline():
                cursors = [await conn.execute(sql, params) for sql, params in statements]
            return [await c.fetchall() if c.description is not None else [] for c in cursors]

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        """A pooled connection in a transaction, with the errors of :meth:`_fetch`."""
        try:
            async with self._store._pool.connection() as conn, conn.transaction():
                yield conn
        except PoolTimeout:
            raise self._store._no_connection() from None
        except LINK_LOST as exc:
            raise lost(exc) from None

    async def _fetch_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        rows = await self._fetch(sql, params)
        return rows[0]

    async def _fetch_page(self, sql: str, params: Sequence[Any]) -> Iterable[Sequence[Any]]:
        return await self._fetch(sql, params)

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        sql, params = rows_sql(POSTGRES.mark, after_id, limit, types, self._tables.events)
        rows = await self._fetch(sql, params)
        with self._checking():
            return event_rows(rows)

    async def _committed_head(self) -> int:
        """The newest id, in one query for all the readers that ask while it runs (the
        round trip is what costs: 190 µs of the server's CPU per read, measured)."""
        return await self._newest_look.get()

    # -- consumers ------------------------------------------------------------------------

    async def register_consumer(self, user_id: UserId, component: str) -> bool:
        now = utc_timestamp()
        # xmax = 0 only for a row this statement inserted (not one it updated).
        (created,) = await self._fetch_one(
            "INSERT INTO consumers (partition_key, user_id, component, position, registered_at,"
            " last_seen_at) VALUES (%s, %s, %s, 0, %s, %s)"
            " ON CONFLICT (partition_key, user_id, component)"
            " DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at RETURNING xmax = 0",
            (self._key, user_id, component, now, now),
        )
        return bool(created)

    async def claim_consumer(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """As the contract says; the claim goes out on the channel with the commit, so the
        stream that held the consumer on another process stops."""
        rows = await self._fetch(
            "WITH claimed AS (UPDATE consumers SET epoch = epoch + 1, last_seen_at = %s"
            " WHERE partition_key = %s AND user_id = %s AND component = %s"
            " RETURNING epoch, position)"
            f" SELECT epoch, position, pg_notify('{CHANNEL}',"
            f" concat_ws(' ', '{_claim_kind(self._key)}', %s::bigint, epoch, %s::text))"
            " FROM claimed",
            (utc_timestamp(), self._key, user_id, component, user_id, component),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    # -- AMQP consumer groups -------------------------------------------------------------

    async def _claim_group(
        self, sql: str, user_id: UserId, group: str, epoch: int, hold_seconds: float
    ) -> GroupClaim:
        """A group taken goes out on the channel with the commit, so the link that held it
        on another process is detached."""
        kind = _claim_kind(self._key, GROUP_CLAIM_PAYLOAD)
        rows = await self._fetch(
            f"WITH taken AS ({sql}) SELECT claim, epoch, pg_notify('{CHANNEL}',"
            f" concat_ws(' ', '{kind}', %s::bigint, claim, epoch, %s::text)) FROM taken",
            (self._key, user_id, group, epoch, hold_seconds, user_id, group),
        )
        if rows:
            return GroupClaim(True, int(rows[0][0]), int(rows[0][1]))
        held = await self._fetch(holder_sql(POSTGRES.mark), (self._key, user_id, group))
        if not held:  # gone with its user or stream meanwhile
            return GroupClaim(False, 0, 0)
        return GroupClaim(False, int(held[0][0]), int(held[0][1]))

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        """One statement for every hold."""
        if not holds:
            return []
        users, groups, claims = zip(*holds, strict=True)
        rows = await self._fetch(
            f"UPDATE amqp_groups a SET held_until = {POSTGRES.now} + %s"
            " FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS h(user_id, grp, claim)"
            " WHERE a.partition_key = %s AND a.user_id = h.user_id"
            " AND a.consumer_group = h.grp AND a.claim = h.claim"
            " RETURNING a.user_id, a.consumer_group, a.claim",
            (hold_seconds, list(users), list(groups), list(claims), self._key),
        )
        kept = {(int(user), str(group), int(claim)) for user, group, claim in rows}
        return [hold for hold in holds if hold not in kept]

    # -- retention ------------------------------------------------------------------------

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """As the contract says; also, across processes: only one process deletes from a
        partition at a time (the others' calls delete nothing and return 0), and nothing
        above the lowest position of a registered consumer, or of an aggregate copying the
        partition, goes, whatever ``up_to`` says."""
        t = self._tables
        async with self._transaction() as conn:
            cursor = await conn.execute(try_retention_lock_sql(self._key))
            locked = await cursor.fetchone()
            if locked is None or not locked[0]:
                return 0
            kept = "" if dcb_events else f" AND id NOT IN (SELECT event_id FROM {t.dcb_events})"
            cursor = await conn.execute(
                f"WITH gone AS (DELETE FROM {t.events} WHERE id IN (SELECT id FROM {t.events}"
                " WHERE id <= LEAST(%s, (SELECT MIN(position) FROM consumers"
                f" WHERE partition_key = %s), {copied_up_to_sql('%s')}){kept}"
                " ORDER BY id LIMIT %s) RETURNING id),"
                f" tags AS (DELETE FROM {t.event_tags} WHERE event_id IN (SELECT id FROM gone)),"
                f" dcb AS (DELETE FROM {t.dcb_events} WHERE event_id IN (SELECT id FROM gone))"
                " SELECT COUNT(*), MAX(id) FROM gone",
                (up_to, self._key, self._key, limit),
            )
            row = await cursor.fetchone()
            assert row is not None
            count, newest = int(row[0]), row[1]
            if newest is not None:
                await conn.execute(
                    "INSERT INTO meta (key, value) VALUES (%s, %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = GREATEST("
                    "meta.value::bigint, EXCLUDED.value::bigint)::text",
                    (_last_deleted_key(self._key), str(newest)),
                )
        if newest is not None:
            self.recent.forget_up_to(int(newest))
        return count

    # -- DCB ------------------------------------------------------------------------------

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[SequencedEvent], int]:
        # The head first: every event it covers is in the read that follows (a later
        # statement sees at least as much), so a condition at ``head`` misses nothing seen.
        head = await self.last_given_id()
        sql, params = read_sql(
            query, after=after, before=before, limit=limit, mark="%s", tables=self._tables
        )
        rows = await self._fetch(sql, params)
        with self._checking():
            return [stored_event(row) for row in rows], head


class PostgresStore(
    PostgresPartitionLog, CombinedCommits, SqlStore[PostgresPartitionLog], NotificationListener
):
    """Event, consumer, user and stream storage in PostgreSQL; as a log, the view of
    ``events``/0. Create with :meth:`open`."""

    def __init__(
        self,
        url: str,
        pool: AsyncConnectionPool[Connection],
        write_pool: AsyncConnectionPool[Connection],
        writer: Connection,
        listener: Connection,
        limits: PoolLimits = DEFAULT_POOL,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        self.url = url
        self._start(dedup_window, safe_url(url))
        self._pool = pool
        self._limits = limits
        self._write_pool = write_pool
        self._writer = writer
        #: The writers' connection options (the durability's).
        self._write_options = ""
        self._listener = listener
        super().__init__(self, DEFAULT_PARTITION)
        self._logs: dict[int, PostgresPartitionLog] = {0: self}
        self._access_listeners: set[Callable[[], None]] = set()
        self._listen_task = asyncio.create_task(self._listen(), name="futoin-evt-pg-listen")
        self._start_combining()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        durability: Durability = Durability.FULL,
        pool: PoolLimits = DEFAULT_POOL,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> PostgresStore:
        """Connect, create or migrate the schema; StoreUnavailable when that fails
        (StoreUnreachable when the database does not answer)."""
        window_ms(dedup_window)  # ValueError before anything is opened
        limits = pool
        link = limits.link_timeout
        writer = await connect(url, autocommit=False, link_timeout=link)
        listener: Connection | None = None
        pools: list[AsyncConnectionPool[Connection]] = []
        try:
            await ensure_schema(writer)
            await writer.set_autocommit(True)  # a group commit is one statement
            if durability is Durability.NORMAL:
                await writer.execute("SET synchronous_commit = off")
            listener = await connect(url, autocommit=True, link_timeout=link)
            await listener.execute(f"LISTEN {CHANNEL}")
            connections = AsyncConnectionPool(
                url,
                min_size=1,
                max_size=limits.size,
                kwargs={"autocommit": True, **link_settings(link)},
                timeout=limits.timeout,
                open=False,
            )
            pools.append(connections)
            await connections.open(wait=True, timeout=CONNECT_TIMEOUT)
            write_options = WRITE_OPTIONS[durability]
            pool_options = f"{write_options} {WRITE_POOL_OPTIONS}"
            write_kwargs = {"autocommit": True, **link_settings(link, pool_options)}
            write_pool = AsyncConnectionPool(
                url,
                min_size=0,
                max_size=WRITE_POOL_MAX,
                kwargs=write_kwargs,
                timeout=limits.timeout,
                open=False,
            )
            pools.append(write_pool)
            await write_pool.open()
        except BaseException as exc:
            await writer.close()
            if listener is not None:
                await listener.close()
            for opened in pools:
                await opened.close()
            if isinstance(exc, psycopg.OperationalError):  # lost during the setup
                raise StoreUnreachable(
                    f"cannot connect to the PostgreSQL database {safe_url(url)}: {first_line(exc)}"
                ) from None
            raise
        store = cls(url, connections, write_pool, writer, listener, limits, dedup_window)
        store._write_options = write_options
        store.head.advance(await store.newest_event_id())
        return store

    def join_peers(self, peers: PeerNews, turns: Path | None = None) -> None:
        """Nothing to tell: the notification channel carries heads, claims and stream changes
        to every process; writers lock per partition in the database."""
        return

    def watch_other_writers(self, interval: float = 1.0) -> None:
        """Poll the newest id every ``interval`` seconds while someone waits: the fallback
        for a lost notification (LISTEN wakes waiters at once)."""
        self._start_watching(interval)

    #: Every change is notified on the channel, and the listeners are called again after a
    #: lost connection is restored (a change may have gone by meanwhile).
    hears_all_stream_changes = True

    def _no_connection(self) -> StoreUnreachable:
        limits = self._limits
        return StoreUnreachable(
            f"no database connection within {limits.timeout:g} s (all {limits.size} of the pool"
            " busy, or the database unreachable)"
        )

    def pool_usage(self) -> tuple[int, int]:
        """(pooled connections in use, calls waiting for one)."""
        stats = self._pool.get_stats()
        in_use = stats.get("pool_size", 0) - stats.get("pool_available", 0)
        return in_use, stats.get("requests_waiting", 0)

    async def close(self) -> None:
        """Commit what is queued, then close. Appends queued after this call are refused."""
        if self._closing:
            return
        self._closing = True
        for partition_log in list(self._logs.values()):
            await partition_log._stop_writing()
        for task in (self._watcher, self._listen_task, self._group_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._listener.close()
        await self._writer.close()
        await self._write_pool.close()
        await self._pool.close()

    # -- streams --------------------------------------------------------------------------

    def _open_log(self, partition: Partition) -> PostgresPartitionLog:
        return PostgresPartitionLog(self, partition)

    async def _add_stream(self, name: str, partitions: int, aggregate_of: str | None) -> StreamInfo:
        async def add(conn: Connection) -> tuple[StreamInfo, bool]:
            if aggregate_of is not None:
                # the source's row locked: it cannot be dropped or grown meanwhile
                try:
                    source: StreamInfo | None = await _read_stream(conn, aggregate_of, lock=True)
                except KeyError:
                    source = None
                check_aggregate(name, partitions, source, aggregate_of)
            cursor = await conn.execute(
                "INSERT INTO streams (name, created_at, aggregate_of) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING RETURNING 1",
                (name, utc_timestamp(), aggregate_of),
            )
            if await cursor.fetchone() is None:
                raise KeyError(f"the stream {name} exists already")
            await _add_partitions(conn, name, range(partitions))
            return await _read_stream(conn, name, lock=False), True

        return await self._change_registry(add)

    async def _grow_stream(self, name: str, partitions: int) -> StreamInfo:
        async def grow(conn: Connection) -> tuple[StreamInfo, bool]:
            info = await _read_stream(conn, name, lock=True)
            if not grows(info, name, partitions):
                return info, False
            await _add_partitions(conn, name, range(len(info.partitions), partitions))
            return await _read_stream(conn, name, lock=False), True

        return await self._change_registry(grow)

    async def _drop_stream(self, name: str) -> list[int] | None:
        async def drop(conn: Connection) -> tuple[StreamInfo, bool]:
            info = await _read_stream(conn, name, lock=True)
            cursor = await conn.execute(aggregated_by_sql(POSTGRES.mark), (name,))
            aggregate = await cursor.fetchone()
            if aggregate is not None:
                raise ValueError(
                    f"the stream {aggregate[0]} aggregates {name}: drop {aggregate[0]} first"
                )
            for partition in info.partitions:
                for statement in drop_partition_tables_sql(partition.key):
                    await conn.execute(statement)
            await conn.execute(
                "DELETE FROM meta WHERE key = ANY(%s)",
                ([_last_deleted_key(p.key) for p in info.partitions],),
            )
            # partitions and their consumers go with the stream (ON DELETE CASCADE)
            await conn.execute("DELETE FROM streams WHERE name = %s", (name,))
            return info, True

        try:
            info = await self._change_registry(drop)
        except KeyError:
            return None
        return [partition.key for partition in info.partitions]

    async def _change_registry(
        self, work: Callable[[Connection], Awaitable[tuple[_T, bool]]]
    ) -> _T:
        """Run ``work(conn)`` in a transaction; when it says it changed the registry, the
        version moves on and every process is told, on commit."""
        async with self._transaction() as conn:
            result, changed = await work(conn)
            if changed:
                cursor = await conn.execute(BUMP_STREAMS_VERSION)
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(
                    "SELECT pg_notify(%s, %s)", (CHANNEL, f"{STREAMS_PAYLOAD_PREFIX}{row[0]}")
                )
        return result

    # -- aggregates -----------------------------------------------------------------------

    async def _copy(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int
    ) -> AggregateCopy | None:
        """In one transaction under the aggregate's append lock (the
        lease's row lock alone would order the copying; the append lock keeps the ids
        visible in their order for the aggregate's readers, as for any partition). The
        lease runs on the database's clock, which every process shares."""
        key = aggregate.key
        m, now = POSTGRES.mark, POSTGRES.now
        lease = (lease_sql(m, f"{now} + {m}", now), [key, holder, lease_seconds])
        steps = copy_steps(Tables.of(key), lease, limit, start, m)
        async with self._transaction() as conn:
            await conn.execute(append_lock_sql(key))
            done = await _run_steps(conn, steps)
            if done is not None and done.copied:
                await conn.execute(notify_head_sql(key))
        return done

    # -- the access version (see :mod:`..sql.access`) ---------------------------------

    async def _access_write(self, sql: str, params: Sequence[Any], *more: Statement) -> Rows:
        async with self._transaction() as conn:
            cursor = await conn.execute(sql, params)
            rows = await cursor.fetchall() if cursor.description is not None else []
            for more_sql, more_params in more:
                await conn.execute(more_sql, more_params)
            await _bump_access(conn)
        return rows

    #: Every change is notified on the channel (and the listeners are called again after a
    #: lost connection is restored).
    hears_all_access_changes = True

    async def access_version(self) -> int:
        return version_of(await self._fetch(READ_ACCESS_VERSION))

    def peek_access_version(self) -> int | None:
        """Never at once (a read goes over the network): every change is heard anyway."""
        return None

    # -- the schema registry --------------------------------------------------------------

    async def _change_schemas(self, steps: Generator[Step, Any, _T], subject: str) -> _T:
        async def change(conn: Connection) -> tuple[_T, bool]:
            done = await _run_steps(conn, steps)
            await _bump_access(conn)
            return done, True

        try:
            return await self._change_registry(change)
        except psycopg.errors.UniqueViolation:  # a registration of the same moment
            raise SchemaChanged(subject) from None


async def _bump_access(conn: Connection) -> None:
    """Move the access version on and tell every process, on commit."""
    cursor = await conn.execute(BUMP_ACCESS)
    row = await cursor.fetchone()
    assert row is not None
    payload = f"{ACCESS_PAYLOAD_PREFIX}{row[0]}"
    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


async def _run_steps(conn: Connection, steps: Generator[Step, Any, _T]) -> _T:
    """Run the statements ``steps`` yields in ``conn``'s transaction, sending each one's
    rows back; what it returns."""
    try:
        sql, params = next(steps)
        while True:
            cursor = await conn.execute(sql, params)
            rows = await cursor.fetchall() if cursor.description is not None else []
            sql, params = steps.send(list(rows))
    except StopIteration as stop:
        result: _T = stop.value
        return result


async def _read_stream(conn: Connection, name: str, *, lock: bool) -> StreamInfo:
    """The stream in ``conn``'s transaction (``lock``: its row locked until the end, so
    changes to one stream go one at a time); KeyError when there is none."""
    if lock:
        await conn.execute(f"SELECT 1 FROM streams WHERE name = %s{POSTGRES.lock_rows}", (name,))
    cursor = await conn.execute(STREAM_ROWS + " WHERE s.name = %s ORDER BY p.number", (name,))
    infos = stream_infos(await cursor.fetchall())
    if not infos:
        raise KeyError(f"no stream {name}")
    return infos[0]


async def _add_partitions(conn: Connection, name: str, numbers: range) -> None:
    for number in numbers:
        cursor = await conn.execute(
            "INSERT INTO partitions (stream, number) VALUES (%s, %s) RETURNING key",
            (name, number),
        )
        row = await cursor.fetchone()
        assert row is not None
        key = int(row[0])
        for statement in partition_tables_sql(key):
            await conn.execute(statement)
        as_source, as_aggregate = add_sources_sql(POSTGRES.mark)
        await conn.execute(as_source, (key,))
        await conn.execute(as_aggregate, (key, name))
