"""The SQL of AMQP consumer groups (table ``amqp_groups``, schema version 8), the same in
every backend: ``mark`` is the placeholder, ``now`` the database's clock in seconds since the
epoch (every process on one database reads the same clock). No I/O.

A row is one group of one user on one partition: the epoch of the link that holds it, the
claim number every new holder bumps, and until when the hold lasts unless it is renewed (0
once released). The row stays when the group is released, so claim numbers never repeat.
"""

from __future__ import annotations

from typing import Final

_KEY: Final = "partition_key = {m} AND user_id = {m} AND consumer_group = {m}"


def claim_sql(mark: str, now: str, *, epoch: bool, equal_takes_over: bool, free_only: bool) -> str:
    """Take the group: insert its row, or update it when nobody holds it (the hold ran out
    or was released), or when the new epoch takes over (``epoch``: one was given; unless
    ``free_only``). One row (claim, epoch) when taken, none else. Parameters: partition
    key, user id, group, epoch (0 for none), hold seconds."""
    takes_over = ""
    if epoch and not free_only:
        takes_over = f" OR excluded.epoch {'>=' if equal_takes_over else '>'} amqp_groups.epoch"
    m = mark
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


def hold_sql(mark: str, now: str) -> str:
    """Renew one hold; a row when it is still the group's. Parameters: hold seconds,
    partition key, user id, group, claim."""
    return (
        f"UPDATE amqp_groups SET held_until = {now} + {mark}"
        f" WHERE {_KEY.format(m=mark)} AND claim = {mark} RETURNING 1"
    )


def release_sql(mark: str) -> str:
    """Free the group, if ``claim`` still holds it. Parameters: partition key, user id,
    group, claim."""
    return f"UPDATE amqp_groups SET held_until = 0 WHERE {_KEY.format(m=mark)} AND claim = {mark}"


def acknowledge_sql(mark: str, greatest: str, lock: str = "") -> str:
    """Move a consumer's position forward while ``claim`` holds the group (``lock``: the
    row lock that orders it with a concurrent claim, where the backend has one); the
    position after, or no row. Parameters: up to, last seen, partition key, user id,
    component, then partition key, user id, group, claim."""
    m = mark
    return (
        f"UPDATE consumers SET position = {greatest}(position, {m}), last_seen_at = {m}"
        f" WHERE partition_key = {m} AND user_id = {m} AND component = {m}"
        f" AND EXISTS (SELECT 1 FROM amqp_groups WHERE {_KEY.format(m=m)} AND claim = {m}{lock})"
        " RETURNING position"
    )
