"""The registry of streams: the reads and checks that are the same in every backend (adding,
growing and dropping are the backend's: each makes its own tables)."""

from __future__ import annotations

from typing import Final

from ...domain.partition import StreamInfo
from ...domain.stream import UserId
from ..pages import consumer_counts_sql
from ..tables import STREAM_ROWS, stream_infos
from .calls import SqlCalls

#: Moves the registry's version on (every change of the streams or schemas).
BUMP_STREAMS_VERSION: Final = (
    "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT)"
    " WHERE key = 'streams_version' RETURNING value"
)


def grows(info: StreamInfo, name: str, partitions: int) -> bool:
    """Whether growing ``info`` to ``partitions`` adds any; ValueError when it may not."""
    if info.aggregate_of is not None and partitions != 1:
        raise ValueError(f"the stream {name} aggregates {info.aggregate_of}: it has one partition")
    if partitions < len(info.partitions):
        raise ValueError(
            f"the stream {name} has {len(info.partitions)} partitions: it can only grow"
        )
    return partitions > len(info.partitions)


class StreamCalls(SqlCalls):
    """Reads of the registry. :meth:`_known` notes what the backend learns of aggregates."""

    def _known(self, infos: list[StreamInfo]) -> list[StreamInfo]:
        raise NotImplementedError

    async def streams(self) -> list[StreamInfo]:
        rows = await self._fetch(STREAM_ROWS + " ORDER BY s.name, p.number")
        return self._known(stream_infos(rows))

    async def stream(self, name: str) -> StreamInfo | None:
        rows = await self._fetch(
            f"{STREAM_ROWS} WHERE s.name = {self.dialect.mark} ORDER BY p.number", (name,)
        )
        infos = self._known(stream_infos(rows))
        return infos[0] if infos else None

    async def streams_version(self) -> int:
        rows = await self._fetch("SELECT value FROM meta WHERE key = 'streams_version'")
        return int(rows[0][0])

    async def consumer_counts(self, user_id: UserId | None = None) -> dict[int, int]:
        sql = consumer_counts_sql(self.dialect.mark, user_id is not None)
        rows = await self._fetch(sql, [] if user_id is None else [user_id])
        return {int(key): int(count) for key, count in rows}
