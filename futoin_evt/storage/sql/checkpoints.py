"""The Event Hubs checkpoint store's tables (schema version 7), written once for both
backends (:class:`~futoin_evt.domain.checkpoints.EventHubCheckpoints`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ...domain.checkpoints import Checkpoint, Ownership
from .calls import SqlCalls

_KEY = "user_id = {m} AND hub = {m} AND consumer_group = {m}"


def _ownership(row: Sequence[Any]) -> Ownership:
    return Ownership(str(row[0]), str(row[1]), str(row[2]), float(row[3]))


class CheckpointTables(SqlCalls):
    """The checkpoint store's calls."""

    async def list_ownership(self, user_id: int, hub: str, group: str) -> list[Ownership]:
        rows = await self._fetch(
            "SELECT partition_id, owner_id, etag, modified_at FROM eventhub_ownership"
            f" WHERE {_KEY.format(m=self.dialect.mark)} ORDER BY partition_id",
            (user_id, hub, group),
        )
        return [_ownership(row) for row in rows]

    async def claim_ownership(
        self, user_id: int, hub: str, group: str, partition_id: str, owner_id: str, etag: str | None
    ) -> Ownership | None:
        m = self.dialect.mark
        rows = await self._write(
            "INSERT INTO eventhub_ownership"
            " (user_id, hub, consumer_group, partition_id, owner_id, etag, modified_at)"
            f" VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m})"
            " ON CONFLICT (user_id, hub, consumer_group, partition_id) DO UPDATE"
            " SET owner_id = excluded.owner_id, etag = excluded.etag,"
            f" modified_at = excluded.modified_at WHERE eventhub_ownership.etag = {m}"
            " RETURNING partition_id, owner_id, etag, modified_at",
            (user_id, hub, group, partition_id, owner_id, uuid.uuid4().hex, time.time(), etag),
        )
        return (
            Ownership(str(rows[0][0]), str(rows[0][1]), str(rows[0][2]), float(rows[0][3]))
            if rows
            else None
        )

    async def list_checkpoints(self, user_id: int, hub: str, group: str) -> list[Checkpoint]:
        rows = await self._fetch(
            'SELECT partition_id, "offset", sequence_number FROM eventhub_checkpoints'
            f" WHERE {_KEY.format(m=self.dialect.mark)} ORDER BY partition_id",
            (user_id, hub, group),
        )
        return [Checkpoint(str(r[0]), r[1], None if r[2] is None else int(r[2])) for r in rows]

    async def update_checkpoint(
        self, user_id: int, hub: str, group: str, checkpoint: Checkpoint
    ) -> None:
        m = self.dialect.mark
        await self._write(
            "INSERT INTO eventhub_checkpoints (user_id, hub, consumer_group, partition_id,"
            f' "offset", sequence_number, modified_at) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m})'
            " ON CONFLICT (user_id, hub, consumer_group, partition_id) DO UPDATE"
            ' SET "offset" = excluded."offset", sequence_number = excluded.sequence_number,'
            " modified_at = excluded.modified_at",
            (user_id, hub, group, *checkpoint, time.time()),
        )
