"""The SQL of AMQP consumer groups (table ``amqp_groups``, schema version 8), the same in
every backend, spelled by its :class:`~.dialect.Dialect` (its clock: every process on one
database reads the same clock), and the calls written once over it (:class:`GroupCalls`).

A row is one group of one user on one partition: the epoch of the link that holds it, the
claim number every new holder bumps, and until when the hold lasts unless it is renewed (0
once released). The row stays when the group is released, so claim numbers never repeat.
"""

from __future__ import annotations

from typing import Final

from ...domain.groups import GroupClaim
from ...domain.stream import UserId, utc_timestamp
from .calls import PartitionCalls
from .dialect import Dialect

_KEY: Final = "partition_key = {m} AND user_id = {m} AND consumer_group = {m}"


def claim_sql(dialect: Dialect, *, epoch: bool, equal_takes_over: bool, free_only: bool) -> str:
    """Take the group: insert its row, or update it when nobody holds it (the hold ran out
    or was released), or when the new epoch takes over (``epoch``: one was given; unless
    ``free_only``). One row (claim, epoch) when taken, none else. Parameters: partition
    key, user id, group, epoch (0 for none), hold seconds."""
    takes_over = ""
    if epoch and not free_only:
        takes_over = f" OR excluded.epoch {'>=' if equal_takes_over else '>'} amqp_groups.epoch"
    m, now = dialect.mark, dialect.now
    return (
        "INSERT INTO amqp_groups"
        " (partition_key, user_id, consumer_group, epoch, claim, held_until)"
        f" VALUES ({m}, {m}, {m}, {m}, 1, {now} + {m})"
        " ON CONFLICT (partition_key, user_id, consumer_group) DO UPDATE"
        " SET epoch = excluded.epoch, claim = amqp_groups.claim + 1,"
        " held_until = excluded.held_until"
        f" WHERE amqp_groups.held_until <= {now}{takes_over}"
        " RETURNING claim, epoch"
    )


def holder_sql(mark: str) -> str:
    """(claim, epoch) of the group's holder. Parameters: partition key, user id, group."""
    return f"SELECT claim, epoch FROM amqp_groups WHERE {_KEY.format(m=mark)}"


def hold_sql(dialect: Dialect) -> str:
    """Renew one hold; a row when it is still the group's. Parameters: hold seconds,
    partition key, user id, group, claim."""
    m = dialect.mark
    return (
        f"UPDATE amqp_groups SET held_until = {dialect.now} + {m}"
        f" WHERE {_KEY.format(m=m)} AND claim = {m} RETURNING 1"
    )


def release_sql(mark: str) -> str:
    """Free the group, if ``claim`` still holds it. Parameters: partition key, user id,
    group, claim."""
    return f"UPDATE amqp_groups SET held_until = 0 WHERE {_KEY.format(m=mark)} AND claim = {mark}"


def acknowledge_sql(dialect: Dialect) -> str:
    """Move a consumer's position forward while ``claim`` holds the group (the group's row
    share-locked, where the backend has row locks, so a concurrent claim waits for it or
    fences it off); the position after, or no row. Parameters: up to, last seen, partition
    key, user id, component, then partition key, user id, group, claim."""
    m, lock = dialect.mark, dialect.share_rows
    return (
        f"UPDATE consumers SET position = {dialect.greatest}(position, {m}), last_seen_at = {m}"
        f" WHERE partition_key = {m} AND user_id = {m} AND component = {m}"
        f" AND EXISTS (SELECT 1 FROM amqp_groups WHERE {_KEY.format(m=m)} AND claim = {m}{lock})"
        " RETURNING position"
    )


class GroupCalls(PartitionCalls):
    """The calls of AMQP consumer groups that are the same in every backend (a claim and a
    hold are the backend's: they tell the other processes)."""

    async def _claim_group(
        self, sql: str, user_id: UserId, group: str, epoch: int, hold_seconds: float
    ) -> GroupClaim:
        """Run :func:`claim_sql`'s ``sql`` (epoch 0 for none) and tell the other processes
        of a group taken; the holder's claim when not taken."""
        raise NotImplementedError

    async def claim_group(
        self,
        user_id: UserId,
        group: str,
        epoch: int | None,
        *,
        hold_seconds: float,
        equal_takes_over: bool = False,
        free_only: bool = False,
    ) -> GroupClaim:
        sql = claim_sql(
            self.dialect,
            epoch=epoch is not None,
            equal_takes_over=equal_takes_over,
            free_only=free_only,
        )
        return await self._claim_group(sql, user_id, group, epoch or 0, hold_seconds)

    async def release_group(self, user_id: UserId, group: str, claim: int) -> None:
        await self._write(release_sql(self.dialect.mark), (self._key, user_id, group, claim))

    async def acknowledge_group(
        self, user_id: UserId, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        key = self._key
        rows = await self._write(
            acknowledge_sql(self.dialect),
            (up_to, utc_timestamp(), key, user_id, component, key, user_id, group, claim),
        )
        return int(rows[0][0]) if rows else None
