"""The calls of registered consumers that are the same in every backend (registering and
claiming are the backend's: how it tells a new row, and whom it tells of a claim)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...domain.stream import UserId, utc_timestamp
from ..base import ConsumerRow
from ..pages import consumer_lags_sql, consumer_rows
from .calls import PartitionCalls

_ONE: str = "WHERE partition_key = {m} AND user_id = {m} AND component = {m}"


class ConsumerCalls(PartitionCalls):
    """A partition's consumers."""

    async def acknowledge(
        self, user_id: UserId, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        """Durably move a consumer's position forward to ``up_to`` (never back).

        Returns the position after the update, or None when the consumer is not registered
        (or, with ``epoch``, claimed by another stream since).
        """
        d = self.dialect
        fence = f" AND epoch = {d.mark}" if epoch is not None else ""
        rows = await self._write(
            f"UPDATE consumers SET position = {d.greatest}(position, {d.mark}),"
            f" last_seen_at = {d.mark} {_ONE.format(m=d.mark)}{fence} RETURNING position",
            (up_to, utc_timestamp(), self._key, user_id, component, *([epoch] if fence else [])),
        )
        return int(rows[0][0]) if rows else None

    async def position(self, user_id: UserId, component: str) -> int | None:
        rows = await self._fetch(
            f"SELECT position FROM consumers {_ONE.format(m=self.dialect.mark)}",
            (self._key, user_id, component),
        )
        return int(rows[0][0]) if rows else None

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """(position, newest event id) in one snapshot; None when it is not registered.
        The newest id is the last one ever given, even when it has been discarded."""
        rows = await self._fetch(
            f"SELECT position, ({self._last_given}) FROM consumers"
            f" {_ONE.format(m=self.dialect.mark)}",
            (self._key, user_id, component),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        """Put a consumer's position anywhere (an operator's seek, not an acknowledgement)."""
        m = self.dialect.mark
        rows = await self._write(
            f"UPDATE consumers SET position = {m}, last_seen_at = {m}"
            f" {_ONE.format(m=m)} RETURNING 1",
            (position, utc_timestamp(), self._key, user_id, component),
        )
        return bool(rows)

    async def drop_consumer(self, user_id: UserId, component: str) -> bool:
        rows = await self._write(
            f"DELETE FROM consumers {_ONE.format(m=self.dialect.mark)} RETURNING 1",
            (self._key, user_id, component),
        )
        return bool(rows)

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        """Registered consumers (of one user, or all) with how far behind each is."""
        events, m = self._tables.events, self.dialect.mark
        sql = (
            "SELECT u.name, c.user_id, c.component, c.position, c.registered_at, c.last_seen_at,"
            f" (SELECT COUNT(*) FROM {events} WHERE id > c.position),"
            f" (SELECT ts FROM {events} WHERE id > c.position ORDER BY id LIMIT 1)"
            f" FROM consumers c JOIN users u ON u.id = c.user_id WHERE c.partition_key = {m}"
        )
        params: list[Any] = [self._key]
        if user_id is not None:
            sql += f" AND c.user_id = {m}"
            params.append(user_id)
        sql += " ORDER BY u.name, c.component"
        return consumer_rows(await self._fetch(sql, params))

    async def consumer_lags(self, limit: int) -> list[ConsumerRow]:
        """What :meth:`consumers` returns, for the first ``limit`` consumers by user id and
        component, read in one pass (its cost grows with the events after the lowest
        position, not with their product by the consumers)."""
        sql = consumer_lags_sql(self.dialect.mark, self._tables.events)
        return consumer_rows(await self._fetch(sql, [self._key, limit]))

    async def count_consumers(self) -> int:
        rows = await self._fetch(
            f"SELECT COUNT(*) FROM consumers WHERE partition_key = {self.dialect.mark}",
            (self._key,),
        )
        return int(rows[0][0])

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        """Drop consumers not seen since ``seen_before``; returns (user, component) of each."""
        m = self.dialect.mark
        rows = await self._write(
            f"DELETE FROM consumers WHERE partition_key = {m} AND last_seen_at < {m}"
            " RETURNING (SELECT name FROM users WHERE id = user_id), component",
            (self._key, seen_before),
        )
        return [(str(user), str(component)) for user, component in rows]

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        """Mark consumers as seen now (push streams that are connected but idle), in one
        statement."""
        if not keys:
            return
        m = self.dialect.mark
        if self.dialect.arrays:
            pairs = f"SELECT * FROM unnest({m}::bigint[], {m}::text[])"
            values: list[Any] = [[k[0] for k in keys], [k[1] for k in keys]]
        else:
            pairs = "VALUES " + ",".join([f"({m}, {m})"] * len(keys))
            values = [v for key in keys for v in key]
        await self._write(
            f"UPDATE consumers SET last_seen_at = {m} WHERE partition_key = {m}"
            f" AND (user_id, component) IN ({pairs})",
            [utc_timestamp(), self._key, *values],
        )

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        """(user, user id, component) of the consumer with the lowest position."""
        rows = await self._fetch(
            "SELECT u.name, c.user_id, c.component FROM consumers c"
            f" JOIN users u ON u.id = c.user_id WHERE c.partition_key = {self.dialect.mark}"
            " ORDER BY c.position LIMIT 1",
            (self._key,),
        )
        for name, user_id, component in rows:
            return str(name), UserId(user_id), str(component)
        return None
