"""The SQL of aggregated streams, the same in every backend (``mark`` is the placeholder). No I/O.

One copying transaction (see :class:`~.base.Aggregates`):

1. take or renew the lease (:func:`lease_sql`), and stop when another holder has it;
2. read the positions (:func:`positions_sql`) and, for each source, how many events follow its
   position, up to the batch's limit (:func:`counts_sql`; the last source taken may be cut
   short: :func:`cut_sql`);
3. copy those ranges in one ``INSERT ... SELECT`` per group of sources, ordered by source
   then id, so each source's order is kept and the data never leaves the database
   (:func:`copy_sql`);
4. move the positions (:func:`move_position_sql`).

:func:`copy_steps` is that transaction as a sequence of statements; each backend runs them.

Table names are built from integer keys only (:class:`~.tables.Tables`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol, TypeVar

from ...domain.partition import Partition, StreamInfo
from ..base import AggregateCopy
from ..tables import Step, Tables
from .calls import SqlCalls

#: Sources per statement: SQLite allows at most 500 terms in a compound SELECT.
SOURCES_PER_STATEMENT: Final = 200


class SourceRange(NamedTuple):
    """Source events ``after < id <= upto`` of the partition ``key``."""

    key: int
    after: int
    upto: int


def lease_sql(mark: str, expires: str, now: str) -> str:
    """Insert or renew the lease; a row comes back only when the caller holds it now.
    Parameters: aggregate key, holder, then those of ``expires`` and ``now`` (SQL
    expressions: the backend's clock)."""
    return (
        "INSERT INTO aggregate_leases (aggregate_key, holder, expires_at)"
        f" VALUES ({mark}, {mark}, {expires})"
        " ON CONFLICT (aggregate_key) DO UPDATE SET holder = excluded.holder,"
        " expires_at = excluded.expires_at"
        " WHERE aggregate_leases.holder = excluded.holder"
        f" OR aggregate_leases.expires_at < {now} RETURNING 1"
    )


def release_sql(mark: str) -> str:
    return f"DELETE FROM aggregate_leases WHERE aggregate_key = {mark} AND holder = {mark}"


def positions_sql(mark: str) -> str:
    """(source key, position) of an aggregate's sources, by key."""
    return (
        "SELECT source_key, position FROM aggregate_sources"
        f" WHERE aggregate_key = {mark} ORDER BY source_key"
    )


def move_position_sql(mark: str) -> str:
    """Parameters: the new position, aggregate key, source key."""
    return (
        f"UPDATE aggregate_sources SET position = {mark}"
        f" WHERE aggregate_key = {mark} AND source_key = {mark}"
    )


def add_sources_sql(mark: str) -> list[str]:
    """After a partition is added (both take its key, then the second its stream's name):
    it becomes a source of every aggregate of its stream; an aggregate's partition gets
    every partition of its source."""
    return [
        "INSERT INTO aggregate_sources (aggregate_key, source_key)"
        " SELECT p.key, s.key FROM partitions s"
        " JOIN streams a ON a.aggregate_of = s.stream"
        f" JOIN partitions p ON p.stream = a.name WHERE s.key = {mark}",
        f"INSERT INTO aggregate_sources (aggregate_key, source_key) SELECT {mark}, s.key"
        " FROM streams a JOIN partitions s ON s.stream = a.aggregate_of"
        f" WHERE a.name = {mark}",
    ]


def copied_up_to_sql(mark: str) -> str:
    """The lowest position of the aggregates that copy partition ``key`` (NULL: none)."""
    return f"(SELECT MIN(position) FROM aggregate_sources WHERE source_key = {mark})"


def aggregated_by_sql(mark: str) -> str:
    """The first stream (by name) that aggregates the stream named by the parameter."""
    return f"SELECT name FROM streams WHERE aggregate_of = {mark} ORDER BY name LIMIT 1"


def check_aggregate(
    name: str, partitions: int, source: StreamInfo | None, source_name: str
) -> None:
    """ValueError (one sentence) when ``name`` cannot be made an aggregate of the stream
    ``source_name`` (``source``: that stream as the registry has it, None when unknown)."""
    if partitions != 1:
        raise ValueError(f"an aggregated stream has one partition, not {partitions}")
    if source_name == name:
        raise ValueError(f"the stream {name} cannot aggregate itself")
    if source is None:
        raise ValueError(f"no stream {source_name} to aggregate")
    if source.aggregate_of == name:
        raise ValueError(f"the stream {source_name} is an aggregate of {name}: no cycles")


class _Refusing(Protocol):
    """A partition log, as :func:`note_aggregates` sees it."""

    _aggregate_of: str | None


def note_aggregates(
    infos: list[StreamInfo], aggregates: dict[int, str], logs: Mapping[int, _Refusing]
) -> list[StreamInfo]:
    """Streams a store read from its registry: the partitions of aggregates go into
    ``aggregates`` (key: source name), and their logs refuse appends from now on (a stream
    is an aggregate from its creation to its end, so what was learnt stays true)."""
    for info in infos:
        if info.aggregate_of is not None:
            for partition in info.partitions:
                aggregates[partition.key] = info.aggregate_of
                known = logs.get(partition.key)
                if known is not None:
                    known._aggregate_of = info.aggregate_of
    return infos


def rotated(sources: Sequence[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """The sources in key order, the ``start``-th (modulo their count) first."""
    if not sources:
        return []
    turn = start % len(sources)
    return [*sources[turn:], *sources[:turn]]


def counts_sql(sources: Sequence[tuple[int, int]], limit: int, mark: str) -> tuple[str, list[int]]:
    """(key, count, newest id) of the first ``limit`` events after each source's position;
    one row per source, in the order given."""
    terms = [
        f"SELECT {i} AS o, {key} AS k, COUNT(*) AS n, MAX(id) AS m FROM (SELECT id FROM"
        f" {Tables.of(key).events} WHERE id > {mark} ORDER BY id LIMIT {mark}) AS s{i}"
        for i, (key, _) in enumerate(sources)
    ]
    sql = "SELECT k, n, m FROM (" + " UNION ALL ".join(terms) + ") AS c ORDER BY o"
    return sql, [v for _, position in sources for v in (position, limit)]


def cut_sql(key: int, mark: str) -> str:
    """The id of the ``n + 1``-th event after a position (parameters: position, ``n``)."""
    return (
        f"SELECT id FROM {Tables.of(key).events} WHERE id > {mark} ORDER BY id LIMIT 1"
        f" OFFSET {mark}"
    )


def copy_sql(aggregate: Tables, ranges: Sequence[SourceRange], mark: str) -> tuple[str, list[int]]:
    """Copy the ranges into the aggregate: type, data, time, content type, attributes and
    checksum as they were stored (a damaged source event stays damaged in the copy, and is
    found there), new ids in the order of the ranges and then of the source ids."""
    columns = "type, data, ts, content_type, attrs, checksum"
    terms = [
        f"SELECT {i} AS o, id, {columns} FROM {Tables.of(r.key).events}"
        f" WHERE id > {mark} AND id <= {mark}"
        for i, r in enumerate(ranges)
    ]
    sql = (
        f"INSERT INTO {aggregate.events} ({columns})"
        f" SELECT {columns} FROM (" + " UNION ALL ".join(terms) + ") AS u"
        " ORDER BY o, id RETURNING id"
    )
    return sql, [v for r in ranges for v in (r.after, r.upto)]


#: A statement and its parameters; the driver sends back the rows it returned.
def copy_steps(
    aggregate: Tables, lease: Step, limit: int, start: int, mark: str
) -> Generator[Step, list[Sequence[Any]], AggregateCopy | None]:
    """One copying transaction as statements (the h11 way: the backend runs each in its
    transaction and sends the rows back), ``lease`` (:func:`lease_sql`) first. Returns what
    it did, or None when the aggregate is gone or the lease is another's (nothing done)."""
    if not (yield (f"SELECT 1 FROM partitions WHERE key = {mark}", [aggregate.key])):
        return None
    if not (yield lease):
        return None
    positions = [(int(k), int(p)) for k, p in (yield (positions_sql(mark), [aggregate.key]))]
    ranges: list[SourceRange] = []
    left = limit
    for group in _groups(rotated(positions, start)):
        after_of = dict(group)
        for key, count, newest in (yield counts_sql(group, left, mark)):
            after = after_of[int(key)]
            if not count or not left:
                continue
            if count > left:  # the limit falls inside this source: take its first ``left``
                (cut,) = yield (cut_sql(int(key), mark), [after, left - 1])
                ranges.append(SourceRange(int(key), after, int(cut[0])))
                left = 0
                break
            ranges.append(SourceRange(int(key), after, int(newest)))
            left -= int(count)
        if not left:
            break
    copied = head = 0
    for batch in _groups(ranges):
        ids = [int(row[0]) for row in (yield copy_sql(aggregate, batch, mark))]
        copied += len(ids)
        head = max([head, *ids])
    for r in ranges:
        yield move_position_sql(mark), [r.upto, aggregate.key, r.key]
    return AggregateCopy(copied, head)


_Item = TypeVar("_Item")


def _groups(items: Sequence[_Item]) -> list[Sequence[_Item]]:
    """Items in groups of :data:`SOURCES_PER_STATEMENT`."""
    return [
        items[i : i + SOURCES_PER_STATEMENT] for i in range(0, len(items), SOURCES_PER_STATEMENT)
    ]


class AggregateCalls(SqlCalls):
    """The calls of aggregated streams that are the same in every backend (copying is the
    backend's: whose clock runs the lease, and how the aggregate's ids stay in order)."""

    async def release_aggregate(self, aggregate: Partition, holder: str) -> None:
        await self._write(release_sql(self.dialect.mark), (aggregate.key, holder))

    async def aggregate_sources(self, aggregate: Partition) -> list[tuple[int, int]]:
        rows = await self._fetch(positions_sql(self.dialect.mark), (aggregate.key,))
        return [(int(key), int(position)) for key, position in rows]
