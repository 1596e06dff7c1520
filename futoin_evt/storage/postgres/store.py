"""The PostgreSQL event store: several futoin-evt processes on one database.

Commit-ordered ids across processes
-----------------------------------
A sequence alone does not keep the ordering rule of :mod:`futoin_evt.storage.base`:
transaction A takes id 10, B takes 11, B commits first, a reader moves past 11, and 10
appears later. Here every transaction that adds events first takes one transaction-scoped
advisory lock (``pg_advisory_xact_lock``), then draws its ids from the sequence, then
commits. PostgreSQL releases transaction locks only after the commit is durable and visible
(``CommitTransaction`` marks the transaction committed before it releases its locks), so the
next holder draws larger ids only after the previous ids are visible: ids are handed out and
become visible in the same order, in every process and in the native API. A transaction that
rolls back leaves a gap, which readers simply never see.

The lock makes appends one at a time across the cluster, so each process batches: one writer
task per process takes whatever appends are queued and adds them in one transaction (one
multi-row INSERT, the lock, a NOTIFY), sent as one pipeline round trip (group commit). The
lock is held for one round trip plus the commit's WAL flush.

Wake-ups across processes
-------------------------
The commit sends ``NOTIFY futoin_evt_head, '<newest id>'``. Every process LISTENs on its own
connection and advances its :class:`~futoin_evt.storage.head.HeadWatch`; a slow poll of the
newest id covers a notification lost with a broken connection. A claim of a consumer
(a new epoch) goes out on the same channel, so a push stream on another process that held the
consumer stops within one wake-up (a lost one: at its next acknowledgement, which is fenced).

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
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ...domain.dcb import AppendCondition, AppendConditionFailed, NewEvent, Query, StoredEvent
from ...domain.stream import EventId, UserId, event_json, utc_timestamp
from ...ftn3.messages import encode_json
from ...stats import WriteStats
from ..base import (
    DEFAULT_POOL,
    ConsumerRow,
    DiscardLimits,
    Durability,
    EventRow,
    PoolLimits,
    StoreClosed,
    StoreUnavailable,
    StoreUnreachable,
    StreamBounds,
    User,
)
from ..dcb_sql import (
    PG_FTN18_TYPE,
    condition_sql,
    is_ftn18_type,
    read_sql,
    stored_event,
    stored_retry,
)
from ..head import ClaimWatch, HeadWatch
from ..pages import PagedReads, ReadDialect, rows_sql
from ..recent import RecentEvent, RecentEvents
from .schema import (
    CHANNEL,
    CLAIM_PAYLOAD,
    LOCK_NAMESPACE,
    NOTIFY_HEAD,
    RETENTION_LOCK,
    TAKE_APPEND_LOCK,
    ensure_schema,
)

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[TupleRow]

#: Largest number of queued appends committed in one transaction.
MAX_APPENDS_PER_COMMIT: Final = 4096
#: Seconds to wait for a connection when opening.
CONNECT_TIMEOUT: Final = 10.0
#: Seconds between attempts to restore a lost LISTEN connection.
RELISTEN_SECONDS: Final = 1.0

_DIALECT: Final = ReadDialect(
    mark="%s",
    start_row="SELECT -1::bigint, NULL::text, NULL::text, NULL::text, {start}::bigint",
    events="SELECT id, type, data, ts, octet_length(data)::bigint FROM events WHERE true",
    page="(SELECT * FROM ({inner} ORDER BY id LIMIT %s) AS page)",
    head_row="SELECT 0, NULL, NULL, NULL, (SELECT MAX(id) FROM events)",
    ftn18_type=PG_FTN18_TYPE,
    types_as_array=True,
    consumer_start=(
        "(SELECT GREATEST(position, %s::bigint) FROM consumers"
        " WHERE user_id = %s AND component = %s)"
    ),
    consumer_position="(SELECT position FROM consumers WHERE user_id = %s AND component = %s)",
)
_LAST_GIVEN_ID: Final = (
    "SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM events),"
    " (SELECT COALESCE(MAX(value::bigint), 0) FROM meta WHERE key = 'last_deleted_id'))"
)


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


@dataclass(slots=True)
class _Queue:
    items: deque[_Append] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


async def _connect(url: str, *, autocommit: bool) -> Connection:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=autocommit, connect_timeout=int(CONNECT_TIMEOUT)
        )
    except (psycopg.Error, ValueError) as exc:
        unavailable = (
            StoreUnreachable if isinstance(exc, psycopg.OperationalError) else StoreUnavailable
        )
        raise unavailable(
            f"cannot connect to the PostgreSQL database {safe_url(url)}: {_first_line(exc)}"
        ) from None


def _lost(exc: psycopg.Error) -> StoreUnreachable:
    """A connection that failed during a call: the database went away, or is restarting."""
    return StoreUnreachable(f"the database connection failed: {_first_line(exc)}")


#: Consumers with their lag in one pass over the events after the lowest position (a merge of
#: the positions into the ids, counted by a window), not one count per consumer.
_CONSUMER_LAGS = (
    "WITH listed AS (SELECT u.name, c.user_id, c.component, c.position, c.registered_at,"
    " c.last_seen_at FROM consumers c JOIN users u ON u.id = c.user_id"
    " ORDER BY c.user_id, c.component LIMIT %s),"
    " marks AS (SELECT id AS v, 1 AS ev FROM events"
    " WHERE id > (SELECT COALESCE(MIN(position), 0) FROM listed)"
    " UNION ALL SELECT DISTINCT position, 0 FROM listed),"
    " runs AS (SELECT v, ev, SUM(ev) OVER w AS behind,"
    " MIN(CASE WHEN ev = 1 THEN v END) OVER w AS next_id"
    " FROM marks WINDOW w AS (ORDER BY v DESC, ev ASC ROWS UNBOUNDED PRECEDING))"
    " SELECT l.name, l.user_id, l.component, l.position, l.registered_at, l.last_seen_at,"
    " r.behind, e.ts FROM listed l JOIN runs r ON r.ev = 0 AND r.v = l.position"
    " LEFT JOIN events e ON e.id = r.next_id ORDER BY l.name, l.component"
)


class PostgresStore(PagedReads):
    """Event, consumer and user storage in PostgreSQL. Create with :meth:`open`."""

    read_dialect = _DIALECT

    def __init__(
        self,
        url: str,
        pool: AsyncConnectionPool[Connection],
        writer: Connection,
        listener: Connection,
        limits: PoolLimits = DEFAULT_POOL,
    ) -> None:
        self.url = url
        self.description = safe_url(url)
        self._pool = pool
        self._limits = limits
        self._writer = writer
        self._listener = listener
        self._queue = _Queue()
        self._closing = False
        self.head = HeadWatch()
        self.claims = ClaimWatch()
        self.recent = RecentEvents()
        #: What group commit did (read by the metrics).
        self.write_stats = WriteStats()
        self._task = asyncio.create_task(self._write_loop(), name="futoin-evt-pg-writer")
        self._listen_task = asyncio.create_task(self._listen(), name="futoin-evt-pg-listen")
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, url: str, *, durability: Durability = Durability.FULL, pool: PoolLimits = DEFAULT_POOL
    ) -> PostgresStore:
        """Connect, create or migrate the schema; StoreUnavailable when that fails
        (StoreUnreachable when the database does not answer)."""
        limits = pool
        writer = await _connect(url, autocommit=False)
        listener: Connection | None = None
        connections: AsyncConnectionPool[Connection] | None = None
        try:
            await ensure_schema(writer)
            if durability is Durability.NORMAL:
                await writer.execute("SET synchronous_commit = off")
                await writer.commit()
            listener = await _connect(url, autocommit=True)
            await listener.execute(f"LISTEN {CHANNEL}")
            connections = AsyncConnectionPool(
                url,
                min_size=1,
                max_size=limits.size,
                kwargs={"autocommit": True},
                timeout=limits.timeout,
                open=False,
            )
            await connections.open(wait=True, timeout=CONNECT_TIMEOUT)
        except BaseException as exc:
            await writer.close()
            if listener is not None:
                await listener.close()
            if connections is not None:
                await connections.close()
            if isinstance(exc, psycopg.OperationalError):  # lost during the setup
                raise StoreUnreachable(
                    f"cannot connect to the PostgreSQL database {safe_url(url)}: {_first_line(exc)}"
                ) from None
            raise
        store = cls(url, connections, writer, listener, limits)
        store.head.advance(await store.newest_event_id())
        return store

    def watch_other_writers(self, interval: float = 1.0) -> None:
        """Poll the newest id every ``interval`` seconds while someone waits: the fallback
        for a lost notification (LISTEN wakes waiters at once)."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(interval), name="futoin-evt-watch")

    async def _watch(self, interval: float) -> None:
        while not self._closing:
            await asyncio.sleep(interval)
            if self.head.waiting:
                try:
                    self.head.advance(await self.newest_event_id())
                except Exception as exc:
                    log.debug("checking for new events failed: %s", exc)

    async def _listen(self) -> None:
        while not self._closing:
            try:
                async for notify in self._listener.notifies():
                    try:
                        self.head.advance(int(notify.payload))
                    except ValueError:
                        self._heard_claim(notify.payload)
            except psycopg.Error as exc:
                if self._closing:
                    return
                log.warning("lost the notification connection: %s", exc)
            await asyncio.sleep(RELISTEN_SECONDS)
            with contextlib.suppress(StoreUnavailable, psycopg.Error):
                await self._listener.close()
                self._listener = await _connect(self.url, autocommit=True)
                await self._listener.execute(f"LISTEN {CHANNEL}")
                self.head.advance(await self.newest_event_id())

    def _heard_claim(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        if kind != CLAIM_PAYLOAD:
            return
        with contextlib.suppress(ValueError):  # not a claim this version sends
            user_id, epoch, component = rest.split(" ", 2)
            self.claims.claimed(UserId(int(user_id)), component, int(epoch))

    async def close(self) -> None:
        """Commit what is queued, then close. Appends queued after this call are refused."""
        if self._closing:
            return
        self._closing = True
        self._queue.ready.set()
        await self._task
        for task in (self._watcher, self._listen_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._listener.close()
        await self._writer.close()
        await self._pool.close()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- plumbing -------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return await cursor.fetchall() if cursor.description is not None else []
        except PoolTimeout:
            raise self._no_connection() from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise _lost(exc) from None

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        """A pooled connection in a transaction, with the errors of :meth:`_fetch`."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                yield conn
        except PoolTimeout:
            raise self._no_connection() from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise _lost(exc) from None

    def _no_connection(self) -> StoreUnreachable:
        limits = self._limits
        return StoreUnreachable(
            f"no database connection within {limits.timeout:g} s (all {limits.size} of the pool"
            " busy, or the database unreachable)"
        )

    async def _fetch_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        rows = await self._fetch(sql, params)
        return rows[0]

    # -- events ---------------------------------------------------------------------------

    async def append(self, event_type: str, data_json: str) -> EventId:
        return await self.submit_append(event_type, data_json)

    def submit_append(
        self, event_type: str, data_json: str, content_type: str | None = None
    ) -> asyncio.Future[EventId]:
        if self._closing:
            raise StoreClosed("the event store is closed")
        future: asyncio.Future[EventId] = asyncio.get_running_loop().create_future()
        self._queue.items.append(_Append(event_type, data_json, future, content_type))
        self._queue.ready.set()
        return future

    async def _write_loop(self) -> None:
        queue = self._queue
        while True:
            if not queue.items:
                if self._closing:
                    return
                queue.ready.clear()
                await queue.ready.wait()
                continue
            count = min(len(queue.items), MAX_APPENDS_PER_COMMIT)
            batch = [queue.items.popleft() for _ in range(count)]
            started = time.perf_counter()
            try:
                ids, ts = await self._commit(batch)
            except Exception as exc:
                log.error("commit of %d events failed: %s", len(batch), exc)
                if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                    exc = _lost(exc)
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                await self._restore_writer()
                continue
            seconds = time.perf_counter() - started
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
            self.write_stats.committed(len(batch), seconds, len(ids), total)

    def pool_usage(self) -> tuple[int, int]:
        """(pooled connections in use, calls waiting for one)."""
        stats = self._pool.get_stats()
        in_use = stats.get("pool_size", 0) - stats.get("pool_available", 0)
        return in_use, stats.get("requests_waiting", 0)

    async def _commit(self, batch: list[_Append]) -> tuple[list[int], str]:
        ts = utc_timestamp()
        conn = self._writer
        # The rows go in the order of the queue (ORDER BY ord), so the sequence numbers them
        # in that order; the lock is taken before the sequence is touched.
        async with conn.transaction():
            async with conn.pipeline():
                await conn.execute(TAKE_APPEND_LOCK)
                types = [item.type for item in batch]
                datas = [item.data for item in batch]
                content_types = [item.content_type for item in batch]
                if any(c is not None for c in content_types):
                    cursor = await conn.execute(
                        "INSERT INTO events (type, data, ts, content_type)"
                        " SELECT t, d, %s, c FROM unnest(%s::text[], %s::text[], %s::text[])"
                        " WITH ORDINALITY AS u(t, d, c, ord) ORDER BY ord RETURNING id",
                        (ts, types, datas, content_types),
                    )
                else:
                    cursor = await conn.execute(
                        "INSERT INTO events (type, data, ts)"
                        " SELECT t, d, %s FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY"
                        " AS u(t, d, ord) ORDER BY ord RETURNING id",
                        (ts, types, datas),
                    )
                await conn.execute(NOTIFY_HEAD)
            ids = sorted(int(row[0]) for row in await cursor.fetchall())
        return ids, ts

    async def _restore_writer(self) -> None:
        if not self._writer.broken:
            return
        with contextlib.suppress(StoreUnavailable):
            self._writer = await _connect(self.url, autocommit=False)

    async def _fetch_page(self, sql: str, params: Sequence[Any]) -> Iterable[Sequence[Any]]:
        return await self._fetch(sql, params)

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        sql, params = rows_sql("%s", after_id, limit, types)
        rows = await self._fetch(sql, params)
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4]) for r in rows]

    async def last_given_id(self) -> int:
        return int((await self._fetch_one(_LAST_GIVEN_ID))[0])

    async def stream_id(self) -> str:
        return str((await self._fetch_one("SELECT value FROM meta WHERE key = 'stream_id'"))[0])

    async def newest_event_id(self) -> int:
        return int((await self._fetch_one("SELECT COALESCE(MAX(id), 0) FROM events"))[0])

    # -- consumers ------------------------------------------------------------------------

    async def register_consumer(self, user_id: UserId, component: str) -> bool:
        now = utc_timestamp()
        # xmax = 0 only for a row this statement inserted (not one it updated).
        (created,) = await self._fetch_one(
            "INSERT INTO consumers (user_id, component, position, registered_at, last_seen_at)"
            " VALUES (%s, %s, 0, %s, %s) ON CONFLICT (user_id, component)"
            " DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at RETURNING xmax = 0",
            (user_id, component, now, now),
        )
        return bool(created)

    async def acknowledge(
        self, user_id: UserId, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        fence = " AND epoch = %s" if epoch is not None else ""
        rows = await self._fetch(
            "UPDATE consumers SET position = GREATEST(position, %s), last_seen_at = %s"
            f" WHERE user_id = %s AND component = %s{fence} RETURNING position",
            (up_to, utc_timestamp(), user_id, component, *([epoch] if fence else [])),
        )
        return int(rows[0][0]) if rows else None

    async def claim_consumer(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """As the contract says; the claim goes out on the channel with the commit, so the
        stream that held the consumer on another process stops."""
        rows = await self._fetch(
            "WITH claimed AS (UPDATE consumers SET epoch = epoch + 1, last_seen_at = %s"
            " WHERE user_id = %s AND component = %s RETURNING epoch, position)"
            f" SELECT epoch, position, pg_notify('{CHANNEL}',"
            f" concat_ws(' ', '{CLAIM_PAYLOAD}', %s::bigint, epoch, %s::text)) FROM claimed",
            (utc_timestamp(), user_id, component, user_id, component),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    async def position(self, user_id: UserId, component: str) -> int | None:
        rows = await self._fetch(
            "SELECT position FROM consumers WHERE user_id = %s AND component = %s",
            (user_id, component),
        )
        return int(rows[0][0]) if rows else None

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        rows = await self._fetch(
            f"SELECT position, ({_LAST_GIVEN_ID}) FROM consumers"
            " WHERE user_id = %s AND component = %s",
            (user_id, component),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        rows = await self._fetch(
            "UPDATE consumers SET position = %s, last_seen_at = %s"
            " WHERE user_id = %s AND component = %s RETURNING 1",
            (position, utc_timestamp(), user_id, component),
        )
        return bool(rows)

    async def drop_consumer(self, user_id: UserId, component: str) -> bool:
        rows = await self._fetch(
            "DELETE FROM consumers WHERE user_id = %s AND component = %s RETURNING 1",
            (user_id, component),
        )
        return bool(rows)

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        sql = (
            "SELECT u.name, c.user_id, c.component, c.position, c.registered_at, c.last_seen_at,"
            " (SELECT COUNT(*) FROM events WHERE id > c.position),"
            " (SELECT ts FROM events WHERE id > c.position ORDER BY id LIMIT 1)"
            " FROM consumers c JOIN users u ON u.id = c.user_id"
        )
        params: list[Any] = []
        if user_id is not None:
            sql += " WHERE c.user_id = %s"
            params.append(user_id)
        sql += " ORDER BY u.name, c.component"
        rows = await self._fetch(sql, params)
        return [
            ConsumerRow(r[0], UserId(r[1]), r[2], int(r[3]), r[4], r[5], int(r[6]), r[7])
            for r in rows
        ]

    async def consumer_lags(self, limit: int) -> list[ConsumerRow]:
        """What :meth:`consumers` returns, for the first ``limit`` consumers by user id and
        component, read in one pass: its cost grows with the events after the lowest
        position, not with their product by the consumers."""
        rows = await self._fetch(_CONSUMER_LAGS, [limit])
        return [
            ConsumerRow(r[0], UserId(r[1]), r[2], int(r[3]), r[4], r[5], int(r[6]), r[7])
            for r in rows
        ]

    async def count_consumers(self) -> int:
        rows = await self._fetch("SELECT COUNT(*) FROM consumers", ())
        return int(rows[0][0])

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        if not keys:
            return
        await self._fetch(
            "UPDATE consumers SET last_seen_at = %s WHERE (user_id, component) IN"
            " (SELECT * FROM unnest(%s::bigint[], %s::text[]))",
            (utc_timestamp(), [k[0] for k in keys], [k[1] for k in keys]),
        )

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        rows = await self._fetch(
            "DELETE FROM consumers c WHERE last_seen_at < %s"
            " RETURNING (SELECT name FROM users WHERE id = c.user_id), component",
            (seen_before,),
        )
        return [(str(user), str(component)) for user, component in rows]

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        rows = await self._fetch(
            "SELECT u.name, c.user_id, c.component FROM consumers c"
            " JOIN users u ON u.id = c.user_id ORDER BY c.position LIMIT 1"
        )
        for name, user_id, component in rows:
            return str(name), UserId(user_id), str(component)
        return None

    # -- retention ------------------------------------------------------------------------

    async def stream_bounds(self) -> StreamBounds:
        row = await self._fetch_one(
            "SELECT (SELECT id FROM events ORDER BY id LIMIT 1),"
            " (SELECT ts FROM events ORDER BY id LIMIT 1),"
            " (SELECT id FROM events ORDER BY id DESC LIMIT 1),"
            " (SELECT ts FROM events ORDER BY id DESC LIMIT 1),"
            " (SELECT COUNT(*) FROM events)"
        )
        return StreamBounds(row[0], row[1], row[2], row[3], int(row[4]))

    async def id_before(self, ts: str) -> int | None:
        before, first = await self._fetch_one(
            "SELECT (SELECT MAX(id) FROM events WHERE ts < %s), (SELECT MIN(id) FROM events)",
            (ts,),
        )
        if before is not None:
            return int(before)
        return int(first) - 1 if first is not None and first > 1 else None

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        keep_sql = "(SELECT MAX(id) FROM events WHERE ts < %s)" if keep_since_ts else "NULL"
        params = [keep_since_ts] if keep_since_ts else []
        row = await self._fetch_one(
            "SELECT (SELECT MIN(position) FROM consumers),"
            " (SELECT COALESCE(MAX(id), 0) FROM events),"
            " (SELECT COALESCE(MIN(id), 0) FROM events),"
            f" {keep_sql}::bigint",
            params,
        )
        return DiscardLimits(*row)

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """As the contract says; also, across processes: only one process deletes at a time
        (the others' calls delete nothing and return 0), and nothing above the lowest
        position of a registered consumer goes, whatever ``up_to`` says."""
        async with self._transaction() as conn:
            cursor = await conn.execute(
                f"SELECT pg_try_advisory_xact_lock({LOCK_NAMESPACE}, {RETENTION_LOCK})"
            )
            locked = await cursor.fetchone()
            if locked is None or not locked[0]:
                return 0
            kept = "" if dcb_events else " AND id NOT IN (SELECT event_id FROM dcb_events)"
            cursor = await conn.execute(
                "WITH gone AS (DELETE FROM events WHERE id IN (SELECT id FROM events"
                f" WHERE id <= LEAST(%s, (SELECT MIN(position) FROM consumers)){kept}"
                " ORDER BY id LIMIT %s) RETURNING id),"
                " tags AS (DELETE FROM event_tags WHERE event_id IN (SELECT id FROM gone)),"
                " dcb AS (DELETE FROM dcb_events WHERE event_id IN (SELECT id FROM gone))"
                " SELECT COUNT(*), MAX(id) FROM gone",
                (up_to, limit),
            )
            row = await cursor.fetchone()
            assert row is not None
            count, newest = int(row[0]), row[1]
            if newest is not None:
                await conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('last_deleted_id', %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = GREATEST("
                    "meta.value::bigint, EXCLUDED.value::bigint)::text",
                    (str(newest),),
                )
        if newest is not None:
            self.recent.forget_up_to(int(newest))
        return count

    # -- DCB ------------------------------------------------------------------------------

    async def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> int:
        """Its own transaction under the append lock that orders every append, so the
        condition is checked against everything committed before it, and nothing can commit
        between the check and the insert."""
        ts = utc_timestamp()
        async with self._transaction() as conn:
            await conn.execute(TAKE_APPEND_LOCK)
            client_ids = [e.id for e in events if e.id is not None]
            if client_ids:
                cursor = await conn.execute(
                    "SELECT d.client_id, d.event_id, e.type, e.data, d.tags, d.is_bytes"
                    " FROM dcb_events d JOIN events e ON e.id = d.event_id"
                    " WHERE d.client_id = ANY(%s)",
                    (client_ids,),
                )
                rows = await cursor.fetchall()
                if rows:
                    return stored_retry(events, rows)
            if condition is not None:
                sql, params = condition_sql(condition.fail_if_events_match, condition.after, "%s")
                cursor = await conn.execute(sql, params)
                row = await cursor.fetchone()
                if row is not None:
                    raise AppendConditionFailed(int(row[0]))
            cursor = await conn.execute(
                "INSERT INTO events (type, data, ts)"
                " SELECT t, d, %s FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY"
                " AS u(t, d, ord) ORDER BY ord RETURNING id",
                (ts, [e.type for e in events], [e.data_json for e in events]),
            )
            ids = sorted(int(row[0]) for row in await cursor.fetchall())
            await conn.execute(
                "INSERT INTO dcb_events (event_id, client_id, tags, is_bytes)"
                " SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::boolean[])",
                (
                    ids,
                    [e.id for e in events],
                    [encode_json(list(e.tags)) for e in events],
                    [e.is_bytes for e in events],
                ),
            )
            tagged = [(tag, i) for i, e in zip(ids, events, strict=True) for tag in e.tags]
            if tagged:
                await conn.execute(
                    "INSERT INTO event_tags (tag, event_id)"
                    " SELECT * FROM unnest(%s::text[], %s::bigint[])",
                    ([t for t, _ in tagged], [i for _, i in tagged]),
                )
            await conn.execute(NOTIFY_HEAD)
        self.head.advance(ids[-1])
        return ids[-1]

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[StoredEvent], int]:
        # The head first: every event it covers is in the read that follows (a later
        # statement sees at least as much), so a condition at ``head`` misses nothing seen.
        head = await self.last_given_id()
        sql, params = read_sql(query, after=after, before=before, limit=limit, mark="%s")
        rows = await self._fetch(sql, params)
        return [stored_event(row) for row in rows], head

    # -- users ----------------------------------------------------------------------------

    async def add_user(self, name: str, password_hash: str, *, is_admin: bool = False) -> UserId:
        rows = await self._fetch(
            "INSERT INTO users (name, password_hash, is_admin, created_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING id",
            (name, password_hash, is_admin, utc_timestamp()),
        )
        if not rows:
            raise KeyError(f"user {name} exists already")
        return UserId(rows[0][0])

    async def set_password(self, name: str, password_hash: str) -> bool:
        rows = await self._fetch(
            "UPDATE users SET password_hash = %s WHERE name = %s RETURNING id",
            (password_hash, name),
        )
        return bool(rows)

    async def remove_user(self, name: str) -> bool:
        rows = await self._fetch("DELETE FROM users WHERE name = %s RETURNING id", (name,))
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
