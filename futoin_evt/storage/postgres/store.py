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
fails with :class:`~..base.StoreUnreachable`. Nothing waits for the database to come back:
the writer reconnects on its next batch, the pool replaces broken connections, the listener
retries every second and then catches up with the newest id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ...domain.dcb import (
    AppendCondition,
    NewEvent,
    Query,
    StoredEvent,
)
from ...domain.groups import GroupClaim, GroupHold
from ...domain.partition import (
    DEFAULT_PARTITION,
    DEFAULT_STREAM,
    Partition,
    StreamInfo,
    check_partition_count,
    check_stream_name,
)
from ...domain.schemas import SchemaRow
from ...domain.stream import DEFAULT_DEDUP_WINDOW, EventId, UserId, event_json, utc_timestamp
from ...ftn3.messages import encode_json
from ...stats import DamageStats, WriteStats
from .. import changes_sql, grants_sql, groups_sql, schemas_sql
from ..aggregate_sql import (
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
from ..base import (
    DEFAULT_POOL,
    AggregateCopy,
    ConsumerRow,
    DiscardLimits,
    Durability,
    EventRow,
    GrantRow,
    NotWritable,
    PeerNews,
    PoolLimits,
    SchemaChanged,
    StoreClosed,
    StoreUnavailable,
    StoreUnreachable,
    StreamBounds,
    User,
    joined_count,
)
from ..checkpoints import CheckpointTables
from ..checksums import event_checksum
from ..dcb_sql import (
    PG_FTN18_TYPE,
    DcbAppend,
    condition_sql,
    is_ftn18_type,
    judge_batch,
    read_sql,
    stored_event,
)
from ..dedup import PendingKeys, Queued, WriterKey, plan_appends, window_ms
from ..head import ClaimWatch, HeadWatch, SharedLook
from ..page_rows import event_rows
from ..pages import (
    PagedReads,
    ReadDialect,
    consumer_counts_sql,
    consumer_lags_sql,
    consumer_rows,
    rows_sql,
)
from ..recent import DEFAULT_CAPACITY, DEFAULT_MAX_BYTES, RecentEvent, RecentEvents
from ..sessions_sql import ConsoleSessionTables
from ..tables import STREAM_ROWS, Step, Tables, stream_infos
from ..termini_sql import Statements, TerminiTables
from .schema import (
    CHANNEL,
    CLAIM_PAYLOAD,
    FORGET_KEYS_SQL,
    GROUP_CLAIM_PAYLOAD,
    KEYS_RACED_STATE,
    STREAMS_PAYLOAD_PREFIX,
    append_lock_sql,
    append_sql,
    combined_append_sql,
    drop_partition_tables_sql,
    ensure_schema,
    keyed_append_sql,
    notify_head_sql,
    partition_tables_sql,
    try_retention_lock_sql,
)

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[TupleRow]
_T = TypeVar("_T")

#: Tries of a keyed batch that finds its keys stored by another process meanwhile (each
#: try after the first sees what raced it, so a second rarely fails).
_KEYED_ATTEMPTS: Final = 5
#: Largest number of queued appends committed in one transaction.
MAX_APPENDS_PER_COMMIT: Final = 4096
#: Seconds to wait for a connection when opening.
CONNECT_TIMEOUT: Final = 10.0
#: Connections the writers of partitions other than ``events``/0 share (opened when needed).
WRITE_POOL_MAX: Final = 8
#: The writers' connection options at each durability.
WRITE_OPTIONS: Final = {Durability.FULL: "", Durability.NORMAL: "-c synchronous_commit=off"}
#: Seconds between attempts to restore a lost LISTEN connection.
RELISTEN_SECONDS: Final = 1.0
#: The ring of recent events of a partition other than ``events``/0: a server may hold many.
_PARTITION_RING_DIVISOR: Final = 32


def _dialect(tables: Tables) -> ReadDialect:
    events, key = tables.events, tables.key
    consumer = f"FROM consumers WHERE partition_key = {key} AND user_id = %s AND component = %s"
    return ReadDialect(
        mark="%s",
        start_row="SELECT -1::bigint, NULL::text, NULL::text, NULL::text, NULL::text,"
        " {start}::bigint",
        events=f"SELECT id, type, data, ts, content_type, checksum FROM {events} WHERE true",
        page="(SELECT * FROM ({inner} ORDER BY id LIMIT %s) AS page)",
        head_row=f"SELECT 0, NULL, NULL, NULL, NULL, (SELECT MAX(id) FROM {events})",
        ftn18_type=PG_FTN18_TYPE,
        types_as_array=True,
        consumer_start=f"(SELECT GREATEST(position, %s::bigint) {consumer})",
        consumer_position=f"(SELECT position {consumer})",
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


def safe_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


@dataclass(slots=True)
class _Append:
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


@dataclass(slots=True)
class _Queue:
    items: deque[_Append] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _DcbAppend:
    events: Sequence[NewEvent]
    condition: AppendCondition | None
    future: asyncio.Future[int]


#: A partition's batch for the combined commit, and where its (ids, ts) go.
_Grouped = tuple["PostgresPartitionLog", list[_Append], "asyncio.Future[tuple[list[int], str]]"]
#: Combined statements kept, by the partitions they take (cleared when full).
_COMBINED_SQL_KEPT: Final = 256


def _planned(queued: list[Queued], pending: PendingKeys) -> list[_Append]:
    return [
        _Append(event_type, data_json, future, content_type, joined, key, pending if key else None)
        for (event_type, data_json, content_type), future, key, joined in queued
    ]


def _append_params(batch: list[_Append], ts: str) -> tuple[bool, list[Any]]:
    """Whether a batch has content types, and the parameters of its append
    (:func:`.schema.append_sql`): every event's checksum made here, once."""
    content_types = [item.content_type for item in batch]
    params: list[Any] = [
        ts,
        [item.type for item in batch],
        [item.data for item in batch],
        [event_checksum(item.type, item.data, ts, item.content_type) for item in batch],
    ]
    with_content = any(c is not None for c in content_types)
    if with_content:
        params.append(content_types)
    return with_content, params


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def link_settings(link_timeout: float, options: str = "") -> dict[str, Any]:
    """The connection parameters that make a connection whose packets stop getting through
    (a cut cable, a firewall dropping them, a host paused) fail within about
    ``link_timeout`` seconds, at both ends, instead of the kernel's 15 minutes of
    retransmissions: libpq's keepalives and ``tcp_user_timeout`` here, and the same settings
    for the server's end of the session, with ``idle_in_transaction_session_timeout``, so a
    session whose client stopped inside a transaction gives up its locks (``options``: more
    server settings, as ``-c name=value``)."""
    idle = max(1, round(link_timeout / 2))
    interval = max(1, round(link_timeout / 6))
    count = 3
    ms = max(1, round(link_timeout * 1000))
    server = (
        f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval}"
        f" -c tcp_keepalives_count={count} -c tcp_user_timeout={ms}"
        f" -c idle_in_transaction_session_timeout={ms}"
    )
    return {
        "connect_timeout": max(2, round(min(CONNECT_TIMEOUT, link_timeout))),
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": ms,
        "options": f"{server} {options}".strip(),
    }


async def _connect(
    url: str, *, autocommit: bool, link_timeout: float, options: str = ""
) -> Connection:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=autocommit, **link_settings(link_timeout, options)
        )
    except (psycopg.Error, ValueError) as exc:
        unavailable = (
            StoreUnreachable if isinstance(exc, psycopg.OperationalError) else StoreUnavailable
        )
        raise unavailable(
            f"cannot connect to the PostgreSQL database {safe_url(url)}: {_first_line(exc)}"
        ) from None


#: A connection that broke: the database went away or restarts, the link stopped carrying
#: packets, or the server ended a session it found idle inside a transaction (its client
#: was stopped or cut off longer than the link timeout).
_LINK_LOST: Final = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.IdleInTransactionSessionTimeout,
)


def _lost(exc: psycopg.Error) -> StoreUnreachable:
    """A connection that failed during a call: the database went away, or is restarting."""
    return StoreUnreachable(f"the database connection failed: {_first_line(exc)}")


def _claim_kind(key: int, word: str = CLAIM_PAYLOAD) -> str:
    """The first word of a claim's payload on the channel (``word``: a consumer's claim, or
    :data:`GROUP_CLAIM_PAYLOAD`)."""
    return word if key == 0 else f"{word}.{key}"


#: The database's clock in :mod:`..groups_sql`: every process on the database shares it.
_NOW: Final = "extract(epoch FROM clock_timestamp())"


class PostgresPartitionLog(PagedReads):
    """One partition's log: its own tables, sequence, head, consumers and writer task."""

    def __init__(self, store: PostgresStore, partition: Partition) -> None:
        self._store = store
        self.partition = partition
        #: (stream, partition number) as the metrics label it.
        self.labels = (partition.stream, str(partition.number))
        self._tables = Tables.of(partition.key)
        self._key = partition.key
        self.read_dialect = _dialect(self._tables)
        self.damage_stats = store.damage_stats
        self._last_given = _last_given_id(self._tables)
        self._lock_sql = append_lock_sql(partition.key)
        self._notify_sql = notify_head_sql(partition.key)
        self._append_sql = (
            append_sql(partition.key, content_type=False),
            append_sql(partition.key, content_type=True),
        )
        self._keyed_sql = keyed_append_sql(partition.key)
        #: Keys of this partition's appends in flight.
        self._keys = PendingKeys()
        self.head = HeadWatch()
        #: The newest id read for the readers that ask at once (see :meth:`_committed_head`).
        self._newest_look = SharedLook(self.newest_event_id)
        self.claims = ClaimWatch()
        if partition.key:
            self.recent = RecentEvents(
                DEFAULT_CAPACITY // _PARTITION_RING_DIVISOR,
                DEFAULT_MAX_BYTES // _PARTITION_RING_DIVISOR,
            )
        else:
            self.recent = RecentEvents()
        self._queue = _Queue()
        self._task: asyncio.Task[None] | None = None
        #: Its stream was dropped by this process: the writer ends once its queue is empty.
        self._retired = False
        #: Its stream aggregates this one (its events come only by copying).
        self._aggregate_of: str | None = None
        #: Its lock was held by another process at the last combined commit: the next batch
        #: waits for it alone.
        self._contended = False
        #: DCB appends waiting for the partition's DCB writer, and that writer.
        self._dcb_queue: deque[_DcbAppend] = deque()
        self._dcb_ready = asyncio.Event()
        self._dcb_task: asyncio.Task[None] | None = None

    # -- plumbing -------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            async with self._store._pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return await cursor.fetchall() if cursor.description is not None else []
        except PoolTimeout:
            raise self._store._no_connection() from None
        except _LINK_LOST as exc:
            raise _lost(exc) from None

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        """A pooled connection in a transaction, with the errors of :meth:`_fetch`."""
        try:
            async with self._store._pool.connection() as conn, conn.transaction():
                yield conn
        except PoolTimeout:
            raise self._store._no_connection() from None
        except _LINK_LOST as exc:
            raise _lost(exc) from None

    async def _fetch_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        rows = await self._fetch(sql, params)
        return rows[0]

    # -- events ---------------------------------------------------------------------------

    async def append(self, event_type: str, data_json: str) -> EventId:
        return await self.submit_append(event_type, data_json)

    def submit_append(
        self,
        event_type: str,
        data_json: str,
        content_type: str | None = None,
        key: WriterKey | None = None,
    ) -> asyncio.Future[EventId]:
        self._check_writable()
        future: asyncio.Future[EventId] = asyncio.get_running_loop().create_future()
        if key is None or not self._store._dedup_ms:
            self._enqueue([_Append(event_type, data_json, future, content_type)])
        elif not self._keys.follows(key, future):
            self._enqueue(
                [_Append(event_type, data_json, future, content_type, False, key, self._keys)]
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
        self._enqueue(_planned(queued, self._keys))
        return asyncio.gather(*answers)

    def _check_writable(self) -> None:
        if self._store._closing:
            raise StoreClosed("the event store is closed")
        if self._retired:
            raise StoreClosed(f"the stream {self.partition.stream} was dropped")
        if self._aggregate_of is not None:
            raise NotWritable(self.partition, self._aggregate_of)

    def _enqueue(self, appends: list[_Append]) -> None:
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
                log.error("commit of %d events to %s failed: %s", len(batch), self.partition, exc)
                if isinstance(exc, _LINK_LOST):
                    exc = _lost(exc)
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
        batch: list[_Append], ids: list[int], known: dict[int, int]
    ) -> tuple[list[_Append], list[int]]:
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
        self._retired = True
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
        self, batch: list[_Append]
    ) -> tuple[list[int], str, dict[int, int] | None]:
        """(each append's id, the ts, the indexes of those answered by a stored key with
        their ids: None when no append has a key)."""
        if any(item.key is not None for item in batch):
            return await self._commit_keyed(batch)
        ids, ts = await self._store._group_commit(self, batch)
        return ids, ts, None

    async def _commit_keyed(
        self, batch: list[_Append]
    ) -> tuple[list[int], str, dict[int, int] | None]:
        """A batch with keys: one statement (:func:`.schema.keyed_append_sql`) on a pooled
        writer connection, the partition's lock waited for; tried again when another
        process stored one of its keys meanwhile (it is found then)."""
        ts = utc_timestamp()
        window = self._store._dedup_ms
        params = (
            [item.type for item in batch],
            [item.data for item in batch],
            [item.content_type for item in batch],
            [None if item.key is None else item.key.key for item in batch],
            [None if item.key is None else item.key.writer for item in batch],
            [event_checksum(item.type, item.data, ts, item.content_type) for item in batch],
            window,
            ts,
            window,
        )
        for attempt in itertools.count(1):
            try:
                async with self._store._write_pool.connection() as conn:
                    cursor = await conn.execute(self._keyed_sql, params)
                    row = await cursor.fetchone()
                break
            except PoolTimeout:
                raise self._store._no_connection() from None
            except psycopg.Error as exc:
                if exc.sqlstate != KEYS_RACED_STATE or attempt >= _KEYED_ATTEMPTS:
                    raise
                log.debug("%s: a key was stored meanwhile; trying again", self.partition)
        assert row is not None
        added, known_ords, known_ids, _notified, _checked = row
        known = {int(o) - 1: int(i) for o, i in zip(known_ords or (), known_ids or (), strict=True)}
        new_ids = iter(added or ())
        ids = [known[i] if i in known else int(next(new_ids)) for i in range(len(batch))]
        return ids, ts, known

    async def _commit_alone(self, batch: list[_Append]) -> tuple[list[int], str]:
        """Under the partition's lock, waited for, on a pooled writer connection."""
        try:
            async with self._store._write_pool.connection() as conn:
                return await self._commit(conn, batch)
        except PoolTimeout:
            raise self._store._no_connection() from None

    async def _commit(self, conn: Connection, batch: list[_Append]) -> tuple[list[int], str]:
        ts = utc_timestamp()
        with_content, params = _append_params(batch, ts)
        cursor = await conn.execute(self._append_sql[with_content], params)
        row = await cursor.fetchone()
        assert row is not None
        return list(row[0]), ts

    async def _fetch_page(self, sql: str, params: Sequence[Any]) -> Iterable[Sequence[Any]]:
        return await self._fetch(sql, params)

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        sql, params = rows_sql("%s", after_id, limit, types, self._tables.events)
        rows = await self._fetch(sql, params)
        with self._checking():
            return event_rows(rows)

    async def last_given_id(self) -> int:
        return int((await self._fetch_one(self._last_given))[0])

    async def stream_id(self) -> str:
        name = str((await self._fetch_one("SELECT value FROM meta WHERE key = 'stream_id'"))[0])
        return f"{name}-{self._key}" if self._key else name

    async def newest_event_id(self) -> int:
        return int(
            (await self._fetch_one(f"SELECT COALESCE(MAX(id), 0) FROM {self._tables.events}"))[0]
        )

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

    async def acknowledge(
        self, user_id: UserId, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        fence = " AND epoch = %s" if epoch is not None else ""
        rows = await self._fetch(
            "UPDATE consumers SET position = GREATEST(position, %s), last_seen_at = %s"
            f" WHERE partition_key = %s AND user_id = %s AND component = %s{fence}"
            " RETURNING position",
            (up_to, utc_timestamp(), self._key, user_id, component, *([epoch] if fence else [])),
        )
        return int(rows[0][0]) if rows else None

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
        """As the contract says; a group taken goes out on the channel with the commit, so
        the link that held it on another process is detached."""
        claim = groups_sql.claim_sql(
            "%s",
            _NOW,
            epoch=epoch is not None,
            equal_takes_over=equal_takes_over,
            free_only=free_only,
        )
        kind = _claim_kind(self._key, GROUP_CLAIM_PAYLOAD)
        rows = await self._fetch(
            f"WITH taken AS ({claim}) SELECT claim, epoch, pg_notify('{CHANNEL}',"
            f" concat_ws(' ', '{kind}', %s::bigint, claim, epoch, %s::text)) FROM taken",
            (self._key, user_id, group, epoch or 0, hold_seconds, user_id, group),
        )
        if rows:
            return GroupClaim(True, int(rows[0][0]), int(rows[0][1]))
        held = await self._fetch(groups_sql.holder_sql("%s"), (self._key, user_id, group))
        if not held:  # gone with its user or stream meanwhile
            return GroupClaim(False, 0, 0)
        return GroupClaim(False, int(held[0][0]), int(held[0][1]))

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        """One statement for every hold."""
        if not holds:
            return []
        users, groups, claims = zip(*holds, strict=True)
        rows = await self._fetch(
            f"UPDATE amqp_groups a SET held_until = {_NOW} + %s"
            " FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS h(user_id, grp, claim)"
            " WHERE a.partition_key = %s AND a.user_id = h.user_id"
            " AND a.consumer_group = h.grp AND a.claim = h.claim"
            " RETURNING a.user_id, a.consumer_group, a.claim",
            (hold_seconds, list(users), list(groups), list(claims), self._key),
        )
        kept = {(int(user), str(group), int(claim)) for user, group, claim in rows}
        return [hold for hold in holds if hold not in kept]

    async def release_group(self, user_id: UserId, group: str, claim: int) -> None:
        await self._fetch(groups_sql.release_sql("%s"), (self._key, user_id, group, claim))

    async def acknowledge_group(
        self, user_id: UserId, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        """As the contract says: the group's row is locked (shared) for the update, so a
        claim that commits meanwhile waits for it or fences it off."""
        key = self._key
        rows = await self._fetch(
            groups_sql.acknowledge_sql("%s", "GREATEST", " FOR SHARE"),
            (up_to, utc_timestamp(), key, user_id, component, key, user_id, group, claim),
        )
        return int(rows[0][0]) if rows else None

    async def position(self, user_id: UserId, component: str) -> int | None:
        rows = await self._fetch(
            "SELECT position FROM consumers"
            " WHERE partition_key = %s AND user_id = %s AND component = %s",
            (self._key, user_id, component),
        )
        return int(rows[0][0]) if rows else None

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        rows = await self._fetch(
            f"SELECT position, ({self._last_given}) FROM consumers"
            " WHERE partition_key = %s AND user_id = %s AND component = %s",
            (self._key, user_id, component),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        rows = await self._fetch(
            "UPDATE consumers SET position = %s, last_seen_at = %s"
            " WHERE partition_key = %s AND user_id = %s AND component = %s RETURNING 1",
            (position, utc_timestamp(), self._key, user_id, component),
        )
        return bool(rows)

    async def drop_consumer(self, user_id: UserId, component: str) -> bool:
        rows = await self._fetch(
            "DELETE FROM consumers WHERE partition_key = %s AND user_id = %s AND component = %s"
            " RETURNING 1",
            (self._key, user_id, component),
        )
        return bool(rows)

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        events = self._tables.events
        sql = (
            "SELECT u.name, c.user_id, c.component, c.position, c.registered_at, c.last_seen_at,"
            f" (SELECT COUNT(*) FROM {events} WHERE id > c.position),"
            f" (SELECT ts FROM {events} WHERE id > c.position ORDER BY id LIMIT 1)"
            " FROM consumers c JOIN users u ON u.id = c.user_id WHERE c.partition_key = %s"
        )
        params: list[Any] = [self._key]
        if user_id is not None:
            sql += " AND c.user_id = %s"
            params.append(user_id)
        sql += " ORDER BY u.name, c.component"
        rows = await self._fetch(sql, params)
        return [
            ConsumerRow(r[0], UserId(r[1]), r[2], int(r[3]), r[4], r[5], int(r[6]), r[7])
            for r in rows
        ]

    async def consumer_lags(self, limit: int) -> list[ConsumerRow]:
        """What :meth:`consumers` returns, for the first ``limit`` consumers by user id and
        component, read in one pass (its cost grows with the events after the lowest
        position, not with their product by the consumers)."""
        sql = consumer_lags_sql("%s", self._tables.events)
        return consumer_rows(await self._fetch(sql, [self._key, limit]))

    async def count_consumers(self) -> int:
        rows = await self._fetch(
            "SELECT COUNT(*) FROM consumers WHERE partition_key = %s", (self._key,)
        )
        return int(rows[0][0])

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        if not keys:
            return
        await self._fetch(
            "UPDATE consumers SET last_seen_at = %s WHERE partition_key = %s"
            " AND (user_id, component) IN (SELECT * FROM unnest(%s::bigint[], %s::text[]))",
            (utc_timestamp(), self._key, [k[0] for k in keys], [k[1] for k in keys]),
        )

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        rows = await self._fetch(
            "DELETE FROM consumers c WHERE partition_key = %s AND last_seen_at < %s"
            " RETURNING (SELECT name FROM users WHERE id = c.user_id), component",
            (self._key, seen_before),
        )
        return [(str(user), str(component)) for user, component in rows]

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        rows = await self._fetch(
            "SELECT u.name, c.user_id, c.component FROM consumers c"
            " JOIN users u ON u.id = c.user_id WHERE c.partition_key = %s"
            " ORDER BY c.position LIMIT 1",
            (self._key,),
        )
        for name, user_id, component in rows:
            return str(name), UserId(user_id), str(component)
        return None

    # -- retention ------------------------------------------------------------------------

    async def stream_bounds(self) -> StreamBounds:
        events = self._tables.events
        row = await self._fetch_one(
            f"SELECT (SELECT id FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT id FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT COUNT(*) FROM {events})"
        )
        return StreamBounds(row[0], row[1], row[2], row[3], int(row[4]))

    async def id_before(self, ts: str) -> int | None:
        events = self._tables.events
        before, first = await self._fetch_one(
            f"SELECT (SELECT MAX(id) FROM {events} WHERE ts < %s), (SELECT MIN(id) FROM {events})",
            (ts,),
        )
        if before is not None:
            return int(before)
        return int(first) - 1 if first is not None and first > 1 else None

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        events = self._tables.events
        keep_sql = f"(SELECT MAX(id) FROM {events} WHERE ts < %s)" if keep_since_ts else "NULL"
        params: list[Any] = [self._key]
        if keep_since_ts:
            params.append(keep_since_ts)
        params.append(self._key)
        row = await self._fetch_one(
            "SELECT (SELECT MIN(position) FROM consumers WHERE partition_key = %s),"
            f" (SELECT COALESCE(MAX(id), 0) FROM {events}),"
            f" (SELECT COALESCE(MIN(id), 0) FROM {events}),"
            f" {keep_sql}::bigint, {copied_up_to_sql('%s')}",
            params,
        )
        return DiscardLimits(*row)

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

    async def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> int:
        """Queued for this partition's DCB writer, which commits the appends queued together
        in one transaction (group commit; see :meth:`_dcb_commit`)."""
        if self._aggregate_of is not None:
            raise NotWritable(self.partition, self._aggregate_of)
        if self._store._closing:
            raise StoreClosed("the event store is closed")
        if self._retired:  # its DCB writer has ended
            raise StoreClosed(f"the stream {self.partition.stream} was dropped")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._dcb_queue.append(_DcbAppend(events, condition, future))
        self._dcb_ready.set()
        if self._dcb_task is None:
            self._dcb_task = asyncio.create_task(
                self._dcb_loop(), name=f"futoin-evt-pg-dcb-{self._key}"
            )
        return await future

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

    async def _dcb_commit(self, batch: list[_DcbAppend]) -> tuple[list[int | Exception], int]:
        """One transaction under the partition's append lock that orders every append to
        it, so each condition is checked against everything committed before, in any
        process, and against the batch's appends before it; nothing can commit between a
        check and its insert. A refused append (a failed condition, an id stored with other
        content) is refused alone. A fixed number of round trips whatever the batch: the
        lock and every condition's check of the store in one pipeline, the judging here
        (:func:`.dcb_sql.judge_batch`), the accepted events, their DCB rows and tags in one
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
            log.debug("DCB appends of one batch committed one at a time: %s", _first_line(exc))
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

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[StoredEvent], int]:
        # The head first: every event it covers is in the read that follows (a later
        # statement sees at least as much), so a condition at ``head`` misses nothing seen.
        head = await self.last_given_id()
        sql, params = read_sql(
            query, after=after, before=before, limit=limit, mark="%s", tables=self._tables
        )
        rows = await self._fetch(sql, params)
        with self._checking():
            return [stored_event(row) for row in rows], head


class PostgresStore(PostgresPartitionLog, CheckpointTables, TerminiTables, ConsoleSessionTables):
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
        #: Seconds a producer's key is remembered (0: keys are ignored), and in milliseconds.
        self.dedup_window = dedup_window
        self._dedup_ms = window_ms(dedup_window)
        self.description = safe_url(url)
        self._pool = pool
        self._limits = limits
        self._write_pool = write_pool
        self._writer = writer
        #: The writers' connection options (the durability's).
        self._write_options = ""
        self._listener = listener
        self._closing = False
        #: The damaged events reads found (read by the metrics).
        self.damage_stats = DamageStats()
        super().__init__(self, DEFAULT_PARTITION)
        self._logs: dict[int, PostgresPartitionLog] = {0: self}
        #: Partition keys of aggregated streams, with their sources.
        self._aggregates: dict[int, str] = {}
        #: What group commit did (read by the metrics).
        self.write_stats = WriteStats()
        self._streams_listeners: set[Callable[[int], None]] = set()
        self._access_listeners: set[Callable[[], None]] = set()
        self._listen_task = asyncio.create_task(self._listen(), name="futoin-evt-pg-listen")
        #: The partitions' batches waiting for the next combined commit.
        self._grouped: list[_Grouped] = []
        self._group_ready = asyncio.Event()
        self._group_task: asyncio.Task[None] | None = None
        self._alone: set[asyncio.Task[None]] = set()
        self._combined_sql: dict[tuple[tuple[int, bool], ...], str] = {}
        self._watcher: asyncio.Task[None] | None = None

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
        writer = await _connect(url, autocommit=False, link_timeout=link)
        listener: Connection | None = None
        pools: list[AsyncConnectionPool[Connection]] = []
        try:
            await ensure_schema(writer)
            await writer.set_autocommit(True)  # a group commit is one statement
            if durability is Durability.NORMAL:
                await writer.execute("SET synchronous_commit = off")
            listener = await _connect(url, autocommit=True, link_timeout=link)
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
            write_kwargs = {"autocommit": True, **link_settings(link, write_options)}
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
                    f"cannot connect to the PostgreSQL database {safe_url(url)}: {_first_line(exc)}"
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

    # -- the combined commit ------------------------------------------------------------

    def _group_commit(
        self, partition_log: PostgresPartitionLog, batch: list[_Append]
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

    async def _commit_together(self, entries: list[_Grouped]) -> None:
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
        except _LINK_LOST as exc:
            # The commit may or may not have happened: no second try, the callers are told.
            for _log, _batch, future in entries:
                if not future.done():
                    future.set_exception(exc)
            return
        except psycopg.Error as exc:  # refused as a whole (a partition dropped meanwhile)
            log.debug("a combined commit failed, each partition alone: %s", _first_line(exc))
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

    def _start_alone(self, entry: _Grouped) -> None:
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

    def watch_other_writers(self, interval: float = 1.0) -> None:
        """Poll the newest id every ``interval`` seconds while someone waits: the fallback
        for a lost notification (LISTEN wakes waiters at once)."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(interval), name="futoin-evt-watch")

    async def _watch(self, interval: float) -> None:
        while not self._closing:
            await asyncio.sleep(interval)
            for partition_log in list(self._logs.values()):
                if partition_log.head.waiting:
                    try:
                        partition_log.head.advance(await partition_log.newest_event_id())
                    except Exception as exc:
                        log.debug("checking for new events failed: %s", exc)

    #: Every change is notified on the channel, and the listeners are called again after a
    #: lost connection is restored (a change may have gone by meanwhile).
    hears_all_stream_changes = True

    def listen_streams(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(version)`` when another process (or this one) changes the
        registry; returns the function that stops it."""
        self._streams_listeners.add(callback)
        return lambda: self._streams_listeners.discard(callback)

    def _no_connection(self) -> StoreUnreachable:
        limits = self._limits
        return StoreUnreachable(
            f"no database connection within {limits.timeout:g} s (all {limits.size} of the pool"
            " busy, or the database unreachable)"
        )

    def _notified(self, payload: str) -> None:
        if payload.startswith(CLAIM_PAYLOAD):
            self._heard_claim(payload)
            return
        if payload.startswith(GROUP_CLAIM_PAYLOAD):
            self._heard_group_claim(payload)
            return
        if payload.startswith(changes_sql.ACCESS_PAYLOAD_PREFIX):
            for access_callback in list(self._access_listeners):
                access_callback()
            return
        key_text, _, id_text = payload.rpartition(":")
        with contextlib.suppress(ValueError):
            if key_text == STREAMS_PAYLOAD_PREFIX[:-1]:
                for callback in list(self._streams_listeners):
                    callback(int(id_text))
                return
            partition_log = self._logs.get(int(key_text) if key_text else 0)
            if partition_log is not None:
                partition_log.head.advance(int(id_text))

    def _heard_claim(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        word, dot, key_text = kind.partition(".")
        if word != CLAIM_PAYLOAD:
            return
        with contextlib.suppress(ValueError):  # not a claim this version sends
            partition_log = self._logs.get(int(key_text) if dot else 0)
            user_id, epoch, component = rest.split(" ", 2)
            if partition_log is not None:  # else no stream here holds it
                partition_log.claims.claimed(UserId(int(user_id)), component, int(epoch))

    def _heard_group_claim(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        word, dot, key_text = kind.partition(".")
        if word != GROUP_CLAIM_PAYLOAD:
            return
        with contextlib.suppress(ValueError):  # not a group claim this version sends
            partition_log = self._logs.get(int(key_text) if dot else 0)
            user_id, claim, epoch, group = rest.split(" ", 3)
            if partition_log is not None:  # else no link here holds it
                partition_log.claims.group_claimed(
                    UserId(int(user_id)), group, int(claim), int(epoch)
                )

    async def _listen(self) -> None:
        while not self._closing:
            try:
                async for notify in self._listener.notifies():
                    self._notified(notify.payload)
            except psycopg.Error as exc:
                if self._closing:
                    return
                log.warning("lost the notification connection: %s", exc)
            await asyncio.sleep(RELISTEN_SECONDS)
            with contextlib.suppress(StoreUnavailable, psycopg.Error):
                await self._listener.close()
                self._listener = await _connect(
                    self.url, autocommit=True, link_timeout=self._limits.link_timeout
                )
                await self._listener.execute(f"LISTEN {CHANNEL}")
                for partition_log in list(self._logs.values()):
                    partition_log.head.advance(await partition_log.newest_event_id())
                version = await self.streams_version()
                for callback in list(self._streams_listeners):
                    callback(version)
                for access_callback in list(self._access_listeners):
                    access_callback()  # a change may have gone by meanwhile

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

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _restore_writer(self) -> None:
        if not self._writer.broken:
            return
        with contextlib.suppress(StoreUnavailable):
            self._writer = await _connect(
                self.url,
                autocommit=True,
                link_timeout=self._limits.link_timeout,
                options=self._write_options,
            )

    # -- producers' keys -------------------------------------------------------------------

    async def forget_keys(self, limit: int) -> int:
        """One chunk; any process may run it (a row another one deletes first is skipped)."""
        async with self._transaction() as conn:
            params = (self._dedup_ms, self._dedup_ms, limit)
            cursor = await conn.execute(FORGET_KEYS_SQL, params)
            return cursor.rowcount

    # -- streams --------------------------------------------------------------------------

    def partition_log(self, partition: Partition) -> PostgresPartitionLog:
        found = self._logs.get(partition.key)
        if found is None:
            found = self._logs[partition.key] = PostgresPartitionLog(self, partition)
            found._aggregate_of = self._aggregates.get(partition.key)
        return found

    def _known(self, infos: list[StreamInfo]) -> list[StreamInfo]:
        return note_aggregates(infos, self._aggregates, self._logs)

    async def add_stream(
        self, name: str, partitions: int, *, aggregate_of: str | None = None
    ) -> StreamInfo:
        check_stream_name(name)
        check_partition_count(partitions)

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

        return self._known([await self._change_registry(add)])[0]

    async def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        check_partition_count(partitions)

        async def grow(conn: Connection) -> tuple[StreamInfo, bool]:
            info = await _read_stream(conn, name, lock=True)
            if info.aggregate_of is not None and partitions != 1:
                raise ValueError(
                    f"the stream {name} aggregates {info.aggregate_of}: it has one partition"
                )
            if partitions < len(info.partitions):
                raise ValueError(
                    f"the stream {name} has {len(info.partitions)} partitions: it can only grow"
                )
            if partitions == len(info.partitions):
                return info, False
            await _add_partitions(conn, name, range(len(info.partitions), partitions))
            return await _read_stream(conn, name, lock=False), True

        return await self._change_registry(grow)

    async def drop_stream(self, name: str) -> bool:
        if name == DEFAULT_STREAM:
            raise ValueError(f"the stream {DEFAULT_STREAM} cannot be dropped")

        async def drop(conn: Connection) -> tuple[StreamInfo, bool]:
            info = await _read_stream(conn, name, lock=True)
            cursor = await conn.execute(aggregated_by_sql("%s"), (name,))
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
            return False
        for partition in info.partitions:
            dropped = self._logs.pop(partition.key, None)
            if dropped is not None:
                dropped._retire()
        return True

    async def _change_registry(
        self, work: Callable[[Connection], Awaitable[tuple[_T, bool]]]
    ) -> _T:
        """Run ``work(conn)`` in a transaction; when it says it changed the registry, the
        version moves on and every process is told, on commit."""
        async with self._transaction() as conn:
            result, changed = await work(conn)
            if changed:
                cursor = await conn.execute(
                    "UPDATE meta SET value = (value::bigint + 1)::text"
                    " WHERE key = 'streams_version' RETURNING value"
                )
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(
                    "SELECT pg_notify(%s, %s)", (CHANNEL, f"{STREAMS_PAYLOAD_PREFIX}{row[0]}")
                )
        return result

    async def streams(self) -> list[StreamInfo]:
        rows = await self._fetch(STREAM_ROWS + " ORDER BY s.name, p.number")
        return self._known(stream_infos(rows))

    async def stream(self, name: str) -> StreamInfo | None:
        rows = await self._fetch(STREAM_ROWS + " WHERE s.name = %s ORDER BY p.number", (name,))
        infos = self._known(stream_infos(rows))
        return infos[0] if infos else None

    async def streams_version(self) -> int:
        row = await self._fetch_one("SELECT value FROM meta WHERE key = 'streams_version'")
        return int(row[0])

    # -- aggregates -----------------------------------------------------------------------

    async def copy_into_aggregate(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int = 0
    ) -> AggregateCopy | None:
        """As the contract says, in one transaction under the aggregate's append lock (the
        lease's row lock alone would order the copying; the append lock keeps the ids
        visible in their order for the aggregate's readers, as for any partition). The
        lease runs on the database's clock, which every process shares."""
        key = aggregate.key
        now = "extract(epoch FROM clock_timestamp())"
        lease = (lease_sql("%s", f"{now} + %s", now), [key, holder, lease_seconds])
        steps = copy_steps(Tables.of(key), lease, limit, start, "%s")
        async with self._transaction() as conn:
            await conn.execute(append_lock_sql(key))
            done = await _run_steps(conn, steps)
            if done is not None and done.copied:
                await conn.execute(notify_head_sql(key))
        if done is not None and done.copied:
            self.partition_log(aggregate).head.advance(done.head)
        return done

    async def release_aggregate(self, aggregate: Partition, holder: str) -> None:
        await self._fetch(release_sql("%s"), (aggregate.key, holder))

    async def aggregate_sources(self, aggregate: Partition) -> list[tuple[int, int]]:
        rows = await self._fetch(positions_sql("%s"), (aggregate.key,))
        return [(int(key), int(position)) for key, position in rows]

    async def consumer_counts(self, user_id: UserId | None = None) -> dict[int, int]:
        sql = consumer_counts_sql("%s", user_id is not None)
        rows = await self._fetch(sql, [] if user_id is None else [user_id])
        return {int(key): int(count) for key, count in rows}

    # -- the Event Hubs checkpoint store --------------------------------------------------

    _mark = "%s"

    async def _checkpoint_read(self, sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return await self._fetch(sql, params)

    _checkpoint_write = _checkpoint_read

    # -- kept AMQP link termini -----------------------------------------------------------

    _termini_now = _NOW
    _termini_read = _checkpoint_read

    async def _termini_run(self, statements: Statements) -> list[list[tuple[Any, ...]]]:
        """One statement on its own, or one transaction, its statements sent at once
        (psycopg's pipeline mode)."""
        if len(statements) == 1:
            return [await self._fetch(*statements[0])]
        async with self._transaction() as conn:
            async with conn.pipeline():
                cursors = [await conn.execute(sql, params) for sql, params in statements]
            return [await c.fetchall() if c.description is not None else [] for c in cursors]

    # -- the console's sessions -----------------------------------------------------------

    _session_read = _checkpoint_read
    _session_write = _checkpoint_read

    # -- users ----------------------------------------------------------------------------

    async def add_user(self, name: str, password_hash: str, *, is_admin: bool = False) -> UserId:
        rows = await self._access_write(
            "INSERT INTO users (name, password_hash, is_admin, created_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING id",
            (name, password_hash, is_admin, utc_timestamp()),
        )
        if not rows:
            raise KeyError(f"user {name} exists already")
        return UserId(rows[0][0])

    async def set_password(self, name: str, password_hash: str) -> bool:
        """Also ends the user's console sessions (see :mod:`..changes_sql`)."""
        rows = await self._access_write(
            "UPDATE users SET password_hash = %s WHERE name = %s RETURNING id",
            (password_hash, name),
            (changes_sql.end_sessions_sql("%s"), (name,)),
        )
        return bool(rows)

    async def remove_user(self, name: str) -> bool:
        """Remove a user and their consumers (of every partition)."""
        rows = await self._access_write("DELETE FROM users WHERE name = %s RETURNING id", (name,))
        return bool(rows)

    async def get_user(self, name: str) -> User | None:
        rows = await self._fetch(
            "SELECT id, name, password_hash, is_admin FROM users WHERE name = %s", (name,)
        )
        for row in rows:
            return User(UserId(row[0]), row[1], row[2], bool(row[3]))
        return None

    async def list_users(self) -> list[User]:
        rows = await self._fetch(
            "SELECT id, name, password_hash, is_admin FROM users ORDER BY name"
        )
        return [User(UserId(r[0]), r[1], r[2], bool(r[3])) for r in rows]

    # -- grants -------------------------------------------------------------------------------

    async def grant(self, user_id: UserId, pattern: str, rights: int) -> None:
        await self._access_write(grants_sql.grant_sql("%s"), (user_id, pattern, rights))

    async def revoke(self, user_id: UserId, pattern: str, rights: int) -> bool:
        rows = await self._access_write(
            grants_sql.revoke_sql("%s"),
            (rights, user_id, pattern, rights),
            (grants_sql.forget_empty_sql("%s"), (user_id, pattern)),
        )
        return bool(rows)

    # -- the access version (see :mod:`..changes_sql`) ---------------------------------

    async def _access_write(
        self, sql: str, params: Sequence[Any], *more: tuple[str, Sequence[Any]]
    ) -> list[tuple[Any, ...]]:
        """``sql``'s rows; ``more`` statements, and the access version moved on (every
        process told, on commit), in the same transaction."""
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

    def listen_access(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when any process changes users, grants or schemas."""
        self._access_listeners.add(callback)
        return lambda: self._access_listeners.discard(callback)

    async def access_version(self) -> int:
        return changes_sql.version_of(await self._fetch(changes_sql.READ_ACCESS_VERSION))

    def peek_access_version(self) -> int | None:
        """Never at once (a read goes over the network): every change is heard anyway."""
        return None

    async def list_grants(self) -> list[GrantRow]:
        rows = await self._fetch(grants_sql.LIST_GRANTS)
        return [GrantRow(UserId(r[0]), r[1], r[2]) for r in rows]

    # -- the schema registry --------------------------------------------------------------

    async def schema_rows(
        self, *, subject: str | None = None, schema_id: int | None = None, guid: str | None = None
    ) -> list[SchemaRow]:
        by, value = schemas_sql.rows_key(subject, schema_id, guid)
        rows = await self._fetch(schemas_sql.rows_sql("%s", by), value)
        return [schemas_sql.schema_row(row) for row in rows]

    async def latest_schemas(self) -> list[SchemaRow]:
        return [schemas_sql.schema_row(row) for row in await self._fetch(schemas_sql.LATEST_SQL)]

    async def add_schema_version(
        self, stream: str, subject: str, text: str, fingerprint: str, *, after: int
    ) -> SchemaRow:
        guid = str(uuid.uuid4())
        steps = schemas_sql.register_steps(stream, subject, text, fingerprint, guid, after, "%s")

        async def register(conn: Connection) -> tuple[SchemaRow, bool]:
            row = await _run_steps(conn, steps)
            await _bump_access(conn)
            return row, True

        try:
            return await self._change_registry(register)
        except psycopg.errors.UniqueViolation:  # a registration of the same moment
            raise SchemaChanged(subject) from None

    async def delete_schema_versions(
        self, subject: str, versions: Sequence[int], *, permanent: bool
    ) -> None:
        steps = schemas_sql.delete_steps(subject, versions, permanent, "%s")

        async def delete(conn: Connection) -> tuple[None, bool]:
            await _run_steps(conn, steps)
            await _bump_access(conn)
            return None, True

        await self._change_registry(delete)

    async def schema_levels(self) -> dict[str, str]:
        rows = await self._fetch(schemas_sql.CONFIGS_SQL)
        return {str(subject): str(level) for subject, level in rows}

    async def set_schema_level(self, subject: str, stream: str | None, level: str | None) -> None:
        for sql, params in schemas_sql.set_config_steps(subject, stream, level, "%s"):
            await self._fetch(sql, params)


async def _bump_access(conn: Connection) -> None:
    """Move the access version on and tell every process, on commit."""
    cursor = await conn.execute(_BUMP_ACCESS)
    row = await cursor.fetchone()
    assert row is not None
    payload = f"{changes_sql.ACCESS_PAYLOAD_PREFIX}{row[0]}"
    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


#: Moves the access version on (see :mod:`..changes_sql`).
_BUMP_ACCESS: Final = changes_sql.bump_sql(postgres=True)


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
        await conn.execute("SELECT 1 FROM streams WHERE name = %s FOR UPDATE", (name,))
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
        as_source, as_aggregate = add_sources_sql("%s")
        await conn.execute(as_source, (key,))
        await conn.execute(as_aggregate, (key, name))
