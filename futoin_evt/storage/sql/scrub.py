"""Scrubbing a database (``futoin-evt check``), the part every backend shares: a scrub reads
every event of every partition, a chunk of ids at a time (no read holds a snapshot for long,
so it runs beside a serving server), and compares each with its checksum
(:mod:`..checksums`). The backend gives the rows; what is found is the same
:class:`CheckReport`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ...domain.partition import DEFAULT_PARTITION, Partition
from ..checksums import ChecksumMismatch, check_event
from ..pages import EVENT_COLUMNS, EVENT_COLUMNS_BEFORE_ATTRS, rows_sql
from ..tables import Tables

#: Events read per statement of a scrub.
SCRUB_CHUNK: Final = 10_000


@dataclass(slots=True)
class CheckReport:
    """What a scrub found."""

    #: Where the data is (a path, or a URL without its password).
    description: str
    #: (partition, id) of each event that does not match its checksum, by partition and id.
    damaged: list[tuple[Partition, int]] = field(default_factory=list)
    #: Events that match their checksums.
    checked: int = 0
    #: Events stored before checksums existed (NULL): nothing to compare with.
    unchecked: int = 0
    #: Partitions whose events could not all be read, with why (a damaged file).
    unreadable: list[tuple[Partition, str]] = field(default_factory=list)
    #: SQLite's ``PRAGMA integrity_check`` lines (``["ok"]`` when sound); None elsewhere.
    integrity: list[str] | None = None
    #: Other facts worth a line (PostgreSQL's page checksums, say).
    notes: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        """Nothing damaged, nothing unreadable, and the file's structure is sound."""
        return (
            not self.damaged
            and not self.unreadable
            and (self.integrity is None or self.integrity == ["ok"])
        )


def chunk_sql(
    partition: Partition, after: int, mark: str, with_attrs: bool = True
) -> tuple[str, list[Any]]:
    """The next chunk of a partition's events to check (:func:`check_chunk`); without
    ``with_attrs``, of a table from before attributes."""
    columns = EVENT_COLUMNS if with_attrs else EVENT_COLUMNS_BEFORE_ATTRS
    return rows_sql(mark, after, SCRUB_CHUNK, None, Tables.of(partition.key).events, columns)


def check_chunk(
    report: CheckReport, partition: Partition, rows: Sequence[Sequence[Any]]
) -> int | None:
    """Check the rows of :func:`chunk_sql`; the id to read after next, None at the end."""
    for event_id, event_type, data, ts, content_type, attrs, checksum in rows:
        if checksum is None:
            report.unchecked += 1
            continue
        try:
            check_event(event_id, event_type, data, ts, content_type, checksum, attrs)
        except ChecksumMismatch:
            report.damaged.append((partition, int(event_id)))
        else:
            report.checked += 1
    return int(rows[-1][0]) if len(rows) == SCRUB_CHUNK else None


def partitions_of(rows: Iterable[Sequence[Any]]) -> list[Partition]:
    """Partitions from ``SELECT stream, number, key FROM partitions`` (``events``/0 alone
    when the database is older than streams and gave no rows)."""
    found = sorted((Partition(str(s), int(n), int(k)) for s, n, k in rows), key=lambda p: p.key)
    return found or [DEFAULT_PARTITION]


PARTITIONS_SQL: Final = "SELECT stream, number, key FROM partitions"
