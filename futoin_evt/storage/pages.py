"""Building an :class:`~.base.EventPage` the same way in every backend: the one-statement
read (:func:`page_sql`, with a :class:`ReadDialect` per backend) and the page from its rows
(:mod:`.page_rows`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..domain.partition import Partition
from ..domain.stream import MAX_EVENTS_PER_CALL, UserId
from ..stats import DamageStats
from .base import ConsumerRow, EventPage
from .checksums import ChecksumMismatch, damaged
from .head import HeadWatch
from .page_rows import page_from_recent, page_from_rows
from .recent import RecentEvents
from .sql.dialect import Dialect
from .tables import Tables

#: The columns of an event read, in the order :mod:`.page_rows` reads them: the checksum
#: last (a marker row of a page has its value there).
EVENT_COLUMNS: Final = "id, type, data, ts, content_type, attrs, checksum"
#: The same of a table from before attributes (a database ``futoin-evt check`` reads as it is).
EVENT_COLUMNS_BEFORE_ATTRS: Final = "id, type, data, ts, content_type, NULL, checksum"


@dataclass(frozen=True, slots=True)
class ReadDialect:
    """How one backend spells the parts of :func:`page_sql` (one per partition: its tables),
    beside what its :class:`~.sql.dialect.Dialect` spells."""

    sql: Dialect
    #: The start marker row; ``{start}`` is the start position's SQL.
    start_row: str
    #: The event rows: id, type, data, ts, content type, attrs, checksum; conditions follow
    #: with AND.
    events: str
    #: Wraps ``{inner}`` into the page: ordered by id, ``LIMIT`` a parameter.
    page: str
    #: The head marker row (the newest id), added when a filter may leave events out.
    head_row: str
    #: The condition that keeps FTN18 event types only.
    ftn18_type: str
    #: A consumer's position, or the first parameter when higher (then user id, component).
    consumer_start: str
    #: A consumer's position (parameters: user id, component).
    consumer_position: str


def read_dialect(
    sql: Dialect, tables: Tables, *, start_row: str, page: str, head_row: str, ftn18_type: str
) -> ReadDialect:
    """The :class:`ReadDialect` of ``tables``: what :class:`ReadDialect` says of the other
    arguments; the events and the consumer's position as every backend reads them."""
    m = sql.mark
    consumer = (
        f"FROM consumers WHERE partition_key = {tables.key} AND user_id = {m} AND component = {m}"
    )
    return ReadDialect(
        sql=sql,
        start_row=start_row,
        events=f"SELECT {EVENT_COLUMNS} FROM {tables.events} WHERE true",
        page=page,
        head_row=head_row,
        ftn18_type=ftn18_type,
        consumer_start=f"(SELECT {sql.greatest}(position, CAST({m} AS BIGINT)) {consumer})",
        consumer_position=f"(SELECT position {consumer})",
    )


def page_sql(
    dialect: ReadDialect,
    start_sql: str,
    start_params: Sequence[Any],
    range_sql: str,
    range_params: Sequence[Any],
    types: Sequence[str] | None,
    limit: int,
    ftn18_only: bool,
) -> tuple[str, list[Any]]:
    """One statement, so one snapshot: a start marker row (the start position, NULL when there
    is no such consumer), the page of events after it (or in ``range_sql`` when given), and,
    with a filter, a head marker row; read the rows with :func:`page_from_rows`."""
    sql = dialect.start_row.format(start=start_sql)
    params: list[Any] = list(start_params)
    inner = dialect.events
    if range_sql:
        inner += range_sql
        params.extend(range_params)
    else:
        inner += f" AND id > {start_sql}"
        params.extend(start_params)
    if types is not None:
        inner += f" AND {dialect.sql.one_of('type', len(types))}"
        params.extend(dialect.sql.one_of_params(list(types)))
    if ftn18_only:
        inner += f" AND {dialect.ftn18_type}"
    sql += " UNION ALL " + dialect.page.format(inner=inner)
    params.append(limit)
    if types is not None or ftn18_only:
        sql += " UNION ALL " + dialect.head_row
    return sql, params


def rows_sql(
    mark: str,
    after_id: int,
    limit: int,
    types: Sequence[str] | None,
    events: str = "events",
    columns: str = EVENT_COLUMNS,
) -> tuple[str, list[Any]]:
    """Events after ``after_id`` as :data:`EVENT_COLUMNS`, in id order
    (read them with :func:`event_rows`). With
    ``types``, one index range per type (on (type, id)) merged by id: events of other types
    are not read."""
    select = f"SELECT {columns} FROM {events} WHERE "
    if types is None:
        return f"{select}id > {mark} ORDER BY id LIMIT {mark}", [after_id, limit]
    if not types:
        return f"{select}1 = 0", []
    ranges = [
        f"SELECT * FROM ({select}type = {mark} AND id > {mark} ORDER BY id LIMIT {mark}) AS t{i}"
        for i in range(len(types))
    ]
    params: list[Any] = [v for event_type in types for v in (event_type, after_id, limit)]
    merged = " UNION ALL ".join(ranges)
    return f"SELECT * FROM ({merged}) AS r ORDER BY id LIMIT {mark}", [*params, limit]


class PagedReads:
    """The page reads of the ``EventLog`` and ``Consumers`` roles, the same in every backend:
    one statement each (:func:`page_sql`), spelled by the backend's :attr:`read_dialect`
    (one per partition) and run by its :meth:`_fetch_page`; reads near the head come from
    :attr:`recent`.

    The recent events are this process's own commits: another worker or process may have
    committed after the last of them, and this process hears of it later (its peer's news,
    a notification). So a page from them that ends at their last event is given only when
    the database has nothing newer (:meth:`_committed_head`: safe to compare, as ids become
    visible in the order they are given: one writer at a time per SQLite file, PostgreSQL's
    append lock per partition), or to a reader the head wakes. They are not checked against
    their checksums: they are what this process wrote, kept in its memory.

    Every read from the database runs inside :meth:`_checking`: an event that does not match
    its checksum fails the read with :class:`~.errors.DamagedEvent`, naming the partition.
    """

    read_dialect: ReadDialect
    recent: RecentEvents
    head: HeadWatch
    partition: Partition
    damage_stats: DamageStats

    @contextlib.contextmanager
    def _checking(self) -> Iterator[None]:
        """Around a read: a row it finds damaged (:class:`~.checksums.ChecksumMismatch`)
        fails it with :class:`~.errors.DamagedEvent`, naming this partition."""
        try:
            yield
        except ChecksumMismatch as exc:
            raise damaged(self.damage_stats, self.partition, exc.event_id) from None

    async def _fetch_page(self, sql: str, params: Sequence[Any]) -> Iterable[Sequence[Any]]:
        raise NotImplementedError

    async def newest_event_id(self) -> int:
        raise NotImplementedError

    async def _committed_head(self) -> int:
        """The newest committed id as the database has it now (one cheap read: cheaper than
        reading the page from the database, measured)."""
        return await self.newest_event_id()

    async def _page(
        self, sql: str, params: Sequence[Any], max_bytes: int, data_as_text: bool
    ) -> EventPage | None:
        """The page of one statement's rows (:func:`page_from_rows`); a backend that reads
        on a thread of its own builds it there instead."""
        return page_from_rows(await self._fetch_page(sql, params), max_bytes, data_as_text)

    async def read_events(
        self,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
        up_to_head: bool = False,
    ) -> EventPage:
        """Events with id > ``after_id`` in id order, as many as fit ``limit`` and ``max_bytes``.

        ``max_bytes`` bounds the encoded JSON array (UTF-8). At least one event is returned
        when there is one: every stored event fits a 64 KiB reply by construction. Every
        event committed before the call is read (see the class); with ``up_to_head``, those
        up to :attr:`head` are enough (the caller reads on when the head moves).
        """
        recent = self.recent
        if recent.covers(after_id):
            page = page_from_recent(recent, after_id, types, limit, max_bytes, ftn18_only)
            full = page.count == limit or page.truncated
            if full or await self._newest_is(recent.last_id, up_to_head):
                return page
        mark = self.read_dialect.sql.mark
        read = await self._read(mark, [after_id], "", [], types, limit, max_bytes, ftn18_only)
        assert read is not None
        return read

    def read_recent(
        self,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        recent = self.recent
        if not recent.covers(after_id):
            return None
        page = page_from_recent(recent, after_id, types, limit, max_bytes, ftn18_only)
        if page.count == limit or page.truncated or self.head.head <= recent.last_id:
            return page
        return None

    async def _newest_is(self, last_id: int, up_to_head: bool) -> bool:
        """Whether ``last_id`` is the newest event committed: as far as :attr:`head` knows
        (``up_to_head``), else as the database says now (the head learns it too)."""
        if self.head.head > last_id:
            return False
        if up_to_head:
            return True
        newest = await self._committed_head()
        self.head.advance(newest)
        return newest <= last_id

    async def read_consumer_events(
        self,
        user_id: UserId,
        component: str,
        *,
        at_least: int = 0,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        """Like :meth:`read_events`, after the consumer's position (or ``at_least`` when that is
        higher), in one statement; None when the consumer is not registered."""
        position = self.read_dialect.consumer_start
        params = [at_least, user_id, component]
        return await self._read(position, params, "", [], types, limit, max_bytes, ftn18_only)

    async def read_range(
        self,
        user_id: UserId,
        component: str,
        after_id: int,
        upto_id: int | None,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        data_as_text: bool = False,
    ) -> EventPage | None:
        """Events with ``after_id < id <= upto_id`` for a registered consumer, whose position
        is left alone. ``start_id`` of the page is the consumer's position, read in the same
        snapshot (the caller refuses a range below it); None when it is not registered.
        With ``data_as_text``, each event's data is a string holding its JSON text."""
        mark = self.read_dialect.sql.mark
        upper = f" AND id <= {mark}" if upto_id is not None else ""
        return await self._read(
            self.read_dialect.consumer_position,
            [user_id, component],
            f" AND id > {mark}{upper}",
            [after_id] if upto_id is None else [after_id, upto_id],
            types,
            limit,
            max_bytes,
            data_as_text=data_as_text,
        )

    async def _read(
        self,
        start_sql: str,
        start_params: list[Any],
        range_sql: str,
        range_params: list[Any],
        types: Sequence[str] | None,
        limit: int,
        max_bytes: int,
        ftn18_only: bool = False,
        data_as_text: bool = False,
    ) -> EventPage | None:
        sql, params = page_sql(
            self.read_dialect,
            start_sql,
            start_params,
            range_sql,
            range_params,
            types,
            limit,
            ftn18_only,
        )
        with self._checking():
            return await self._page(sql, params, max_bytes, data_as_text)


def consumer_lags_sql(mark: str, events: str) -> str:
    """Consumers of one partition (``mark``: its key, then the limit) with their lag, in one
    pass over ``events`` after the lowest position: the positions merged into the ids and
    counted by a window, not one count per consumer. Rows as :class:`~.base.ConsumerRow`."""
    return (
        "WITH listed AS (SELECT u.name, c.user_id, c.component, c.position,"
        " c.registered_at, c.last_seen_at FROM consumers c JOIN users u ON u.id = c.user_id"
        f" WHERE c.partition_key = {mark} ORDER BY c.user_id, c.component LIMIT {mark}),"
        f" marks AS (SELECT id AS v, 1 AS ev FROM {events}"
        " WHERE id > (SELECT COALESCE(MIN(position), 0) FROM listed)"
        " UNION ALL SELECT DISTINCT position, 0 FROM listed),"
        " runs AS (SELECT v, ev, SUM(ev) OVER w AS behind,"
        " MIN(CASE WHEN ev = 1 THEN v END) OVER w AS next_id"
        " FROM marks WINDOW w AS (ORDER BY v DESC, ev ASC ROWS UNBOUNDED PRECEDING)),"
        # the positions' rows apart first: joined to ``runs`` itself, SQLite scanned all of
        # it for each consumer (2 s for 1,000 consumers over 100,000 events, not 0.07)
        " at_positions AS (SELECT v, behind, next_id FROM runs WHERE ev = 0)"
        " SELECT l.name, l.user_id, l.component, l.position, l.registered_at,"
        " l.last_seen_at, r.behind, e.ts FROM at_positions r"
        " JOIN listed l ON l.position = r.v"
        f" LEFT JOIN {events} e ON e.id = r.next_id ORDER BY l.name, l.component"
    )


def consumer_counts_sql(mark: str, of_user: bool) -> str:
    """(partition key, consumers) of every partition with consumers (of the user ``mark``)."""
    where = f" WHERE user_id = {mark}" if of_user else ""
    return f"SELECT partition_key, COUNT(*) FROM consumers{where} GROUP BY partition_key"


def consumer_rows(rows: Iterable[Sequence[Any]]) -> list[ConsumerRow]:
    """Rows of :func:`consumer_lags_sql` as typed values."""
    return [
        ConsumerRow(r[0], UserId(r[1]), r[2], int(r[3]), r[4], r[5], int(r[6]), r[7]) for r in rows
    ]
