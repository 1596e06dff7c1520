"""Pages and events from the rows of a read, each row checked against its checksum: the work
per event of every read, in a module of its own that setup.py compiles (:mod:`.pages` holds
the class the backends inherit, which stays interpreted)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from google_crc32c import value as crc32c

from ..domain.stream import event_json
from .base import EventPage, EventRow
from .checksums import ChecksumMismatch, checksummed
from .recent import RecentEvents


def page_from_recent(
    recent: RecentEvents,
    after_id: int,
    types: Sequence[str] | None,
    limit: int,
    max_bytes: int,
    ftn18_only: bool = False,
) -> EventPage:
    """A page from the events this process committed (when ``recent.covers(after_id)``)."""
    wanted = set(types) if types is not None else None
    parts: list[str] = []
    size = 2
    last_id = 0
    truncated = False
    for event in recent.after(after_id):
        if (wanted is not None and event.type not in wanted) or (ftn18_only and not event.ftn18):
            continue
        size += event.size + 1
        if parts and size > max_bytes:
            truncated = True
            break
        parts.append(event.json)
        last_id = event.id
        if len(parts) == limit:
            break
    head_id = recent.last_id if types is not None or ftn18_only else 0
    return EventPage(
        "[" + ",".join(parts) + "]", len(parts), last_id, head_id, after_id, truncated, parts
    )


def page_from_rows(
    rows: Iterable[Sequence[Any]], max_bytes: int, data_as_text: bool = False
) -> EventPage | None:
    """A page from one read's rows: events as (id, type, data, ts, content type, attrs,
    checksum),
    and marker rows with type NULL: (-1, .., start position or NULL when there is no such
    consumer) and, with a type filter, (0, .., newest id). None without a start position.
    Raises :class:`~.checksums.ChecksumMismatch` at an event that does not match its
    checksum."""
    start: int | None = None
    head_id = 0
    parts: list[str] = []
    size = 2  # the brackets
    last_id = 0
    truncated = False
    for event_id, event_type, data, ts, content_type, attrs, checksum in rows:
        if event_type is None:  # a marker: its value where an event has its checksum
            if event_id == -1:
                start = checksum
            else:
                head_id = checksum or 0
            continue
        if checksum is not None and checksum != crc32c(  # event_checksum, inline
            (
                f"{event_type}\0{data}\0{ts}"
                if content_type is None and attrs is None
                else checksummed(event_type, data, ts, content_type, attrs)
            ).encode()
        ):
            raise ChecksumMismatch(event_id)
        if data_as_text:
            data = json.dumps(data)
        text = event_json(event_id, event_type, data, ts)
        size += (len(text) if text.isascii() else len(text.encode())) + 1  # isascii: O(1)
        if parts and size > max_bytes:
            truncated = True
            break
        parts.append(text)
        last_id = event_id
    if start is None:
        return None
    return EventPage(
        "[" + ",".join(parts) + "]", len(parts), last_id, head_id, start, truncated, parts
    )


def event_rows(rows: Iterable[Sequence[Any]]) -> list[EventRow]:
    """Rows of :func:`rows_sql` as :data:`~.base.EventRow`, each checked against its
    checksum (:class:`~.checksums.ChecksumMismatch`)."""
    events: list[EventRow] = []
    for event_id, event_type, data, ts, content_type, attrs, checksum in rows:
        if checksum is not None and checksum != crc32c(  # event_checksum, inline
            (
                f"{event_type}\0{data}\0{ts}"
                if content_type is None and attrs is None
                else checksummed(event_type, data, ts, content_type, attrs)
            ).encode()
        ):
            raise ChecksumMismatch(event_id)
        events.append((int(event_id), str(event_type), str(data), str(ts), content_type, attrs))
    return events
