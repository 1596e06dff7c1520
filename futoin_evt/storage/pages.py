"""Building an :class:`~.base.EventPage` the same way in every backend."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..model import event_json
from .base import EventPage
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
    """A page from one read's rows: events as (id, type, data, ts, UTF-8 size of data), and
    marker rows with type NULL: (-1, .., start position or NULL when there is no such
    consumer) and, with a type filter, (0, .., newest id). None without a start position."""
    start: int | None = None
    head_id = 0
    parts: list[str] = []
    size = 2  # the brackets
    last_id = 0
    truncated = False
    for event_id, event_type, data, ts, extra in rows:
        if event_type is None:
            if event_id == -1:
                start = extra
            else:
                head_id = extra or 0
            continue
        if data_as_text:
            data = json.dumps(data)  # ASCII: its length is its size
            extra = len(data)
        text = event_json(event_id, event_type, data, ts)
        size += len(text) - len(data) + extra + 1
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
