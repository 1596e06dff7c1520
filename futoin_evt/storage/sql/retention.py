"""What bounds discarding a partition's events, and the ids it gave: the calls that are the
same in every backend (deleting is the backend's: how it keeps other writers out)."""

from __future__ import annotations

from typing import Any

from ..base import DiscardLimits, StreamBounds
from .aggregates import copied_up_to_sql
from .calls import PartitionCalls


class RetentionCalls(PartitionCalls):
    """A partition's ids and bounds."""

    async def last_given_id(self) -> int:
        """The newest id ever given to an event, even if that event is discarded."""
        return int((await self._fetch(self._last_given))[0][0])

    async def newest_event_id(self) -> int:
        return int((await self._fetch(self._newest))[0][0])

    async def stream_id(self) -> str:
        rows = await self._fetch("SELECT value FROM meta WHERE key = 'stream_id'")
        name = str(rows[0][0])
        return f"{name}-{self._key}" if self._key else name

    async def stream_bounds(self) -> StreamBounds:
        events = self._tables.events
        rows = await self._fetch(
            f"SELECT (SELECT id FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id LIMIT 1),"
            f" (SELECT id FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT ts FROM {events} ORDER BY id DESC LIMIT 1),"
            f" (SELECT COUNT(*) FROM {events})"
        )
        row = rows[0]
        return StreamBounds(row[0], row[1], row[2], row[3], int(row[4]))

    async def id_before(self, ts: str) -> int | None:
        """The newest id before the first event at or after ``ts``; None when that is the
        oldest retained event (or there are no events)."""
        events, m = self._tables.events, self.dialect.mark
        rows = await self._fetch(
            f"SELECT (SELECT MAX(id) FROM {events} WHERE ts < {m}), (SELECT MIN(id) FROM {events})",
            (ts,),
        )
        before, first = rows[0]
        if before is not None:
            return int(before)
        return int(first) - 1 if first is not None and first > 1 else None

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        """What bounds discarding, read in one snapshot."""
        events, m = self._tables.events, self.dialect.mark
        keep_sql = f"(SELECT MAX(id) FROM {events} WHERE ts < {m})" if keep_since_ts else "NULL"
        params: list[Any] = [self._key]
        if keep_since_ts:
            params.append(keep_since_ts)
        params.append(self._key)
        rows = await self._fetch(
            f"SELECT (SELECT MIN(position) FROM consumers WHERE partition_key = {m}),"
            f" (SELECT COALESCE(MAX(id), 0) FROM {events}),"
            f" (SELECT COALESCE(MIN(id), 0) FROM {events}),"
            f" CAST({keep_sql} AS BIGINT), {copied_up_to_sql(m)}",
            params,
        )
        return DiscardLimits(*rows[0])
