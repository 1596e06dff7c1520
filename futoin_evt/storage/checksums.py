"""Checksums of stored events: written with each event, verified on every read from the
database, the same in every backend. No I/O here.

Every event row holds the CRC32C (Castagnoli, as iSCSI, ext4 and Kafka's records use it) of
its type, data and time, of its content type when it has one, and of its attributes when it
has them (:mod:`futoin_evt.domain.attrs`), as UTF-8 joined by NUL:
``type NUL data NUL ts [NUL content_type] [NUL NUL attrs]``. The attributes' part is added
after the rest, so a row without them sums as it always did (rows stored before
:data:`ATTRS_VERSION` verify unchanged); its two NULs keep an event with attributes from
summing like one whose content type is that text. The id is left out: an aggregate's copy of an
event keeps the checksum of its source. It is stored as it is, an unsigned 32-bit number
(``bigint`` on PostgreSQL), so a read compares it with no conversion: the two reads that serve
most events (:func:`~.pages.page_from_rows`, :func:`~.pages.event_rows`) spell the
computation out inline, a call less per event. A row whose checksum is NULL was stored
before checksums existed (:data:`CHECKSUMS_VERSION`): it is served unchecked.

A row read whose content does not match raises :class:`ChecksumMismatch` (the id only: the
readers of rows do not know their partition); the partition's log turns it into
:class:`~.errors.DamagedEvent` through :func:`damaged`, which logs each damaged event once per
process and counts it for the metrics.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from google_crc32c import value as crc32c

from ..domain.partition import Partition
from ..domain.stream import encode_event_data, utc_timestamp
from ..stats import DamageStats
from .errors import DamagedEvent

logger = logging.getLogger(__name__)

#: The schema version that adds the ``checksum`` column to every partition's events table.
CHECKSUMS_VERSION: Final = 14
#: The schema version that adds the ``attrs`` column (:mod:`futoin_evt.domain.attrs`) to every
#: partition's events table.
ATTRS_VERSION: Final = 16
#: Its SQL type: 64 bits on PostgreSQL, for the unsigned 32-bit CRC (an INTEGER in SQLite).
CHECKSUM_TYPE: Final = "BIGINT"


def event_checksum(
    event_type: str,
    data: str,
    ts: str,
    content_type: str | None = None,
    attrs: str | None = None,
) -> int:
    """The stored checksum of an event (see the module)."""
    if attrs is not None:
        return int(crc32c(checksummed(event_type, data, ts, content_type, attrs).encode()))
    if content_type is None:
        return int(crc32c(f"{event_type}\0{data}\0{ts}".encode()))
    return int(crc32c(f"{event_type}\0{data}\0{ts}\0{content_type}".encode()))


def checksummed(
    event_type: str, data: str, ts: str, content_type: str | None, attrs: str | None
) -> str:
    """What the checksum of an event is of (see the module)."""
    text = f"{event_type}\0{data}\0{ts}"
    if content_type is not None:
        text = f"{text}\0{content_type}"
    return text if attrs is None else f"{text}\0\0{attrs}"


def native_row(event_type: str, data: Any) -> tuple[str, str, str, int]:
    """An event added through the native API, as its row: type, data JSON, time and checksum.
    Raises :class:`~futoin_evt.domain.stream.EventRejected` for a bad type or data."""
    data_json = encode_event_data(event_type, data)
    ts = utc_timestamp()
    return event_type, data_json, ts, event_checksum(event_type, data_json, ts)


class ChecksumMismatch(Exception):
    """A row read does not match its checksum (its partition is added by the caller)."""

    def __init__(self, event_id: int) -> None:
        super().__init__(f"event {event_id} does not match its checksum")
        self.event_id = event_id


def check_event(
    event_id: int,
    event_type: str,
    data: str,
    ts: str,
    content_type: str | None,
    checksum: int | None,
    attrs: str | None = None,
) -> None:
    """Raise :class:`ChecksumMismatch` when the row does not match its checksum (a NULL
    checksum, of an event stored before checksums, is not checked)."""
    if checksum is not None and event_checksum(event_type, data, ts, content_type, attrs) != (
        checksum
    ):
        raise ChecksumMismatch(event_id)


def add_column_sql(table: str) -> str:
    """The migration step of one events table (NULL in the rows it has)."""
    return f"ALTER TABLE {table} ADD COLUMN checksum {CHECKSUM_TYPE}"


def add_attrs_sql(table: str) -> str:
    """:data:`ATTRS_VERSION`'s step of one events table (NULL in the rows it has: none)."""
    return f"ALTER TABLE {table} ADD COLUMN attrs TEXT"


def damaged(stats: DamageStats, partition: Partition, event_id: int) -> DamagedEvent:
    """The error a read of a damaged event fails with; logged once per event and process,
    and counted (``futoin_evt_damaged_events_total``)."""
    error = DamagedEvent(partition, event_id)
    if stats.note(partition.key, event_id, (partition.stream, str(partition.number))):
        logger.error("%s; it is not served (futoin-evt check lists every such event)", error)
    return error
