"""The kept AMQP link termini (table ``amqp_termini``, :data:`TERMINI_VERSION`), written once
for both backends (:class:`~futoin_evt.domain.termini.KeptTermini`) over the primitives of
:class:`~.calls.SqlCalls`.

A row is one terminus of one user, peer container and link name. ``id`` grows with each row
kept (the oldest of a user go first beyond the bound, and a process's renewals and expiries
name the row it kept, not a later one under the same key). ``expires_at`` is in seconds since
the epoch of the database's clock; never NULL: while the terminus's session lives, it is its
timeout after a lease its process renews.

Event ids are packed as text: ascending runs as ``first-last``, others alone, comma
separated (``5-9,12``): a few bytes for the usual run of deliveries in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from ...domain.stream import UserId
from ...domain.termini import KeptTerminus, TerminusKey
from .calls import SqlCalls, Statements
from .dialect import Dialect

#: The schema version that adds the table (both backends).
TERMINI_VERSION: Final = 10
#: Rows named in one statement.
_CHUNK: Final = 500

_KEY: Final = "user_id = {m} AND container = {m} AND link_name = {m}"
_COLUMNS: Final = (
    "partition_key, consumer_group, durable, unsettled, incomplete, after_id, held, acked, timeout"
)


def pack_ids(ids: Iterable[int]) -> str:
    """``ids`` as text, in their order (runs of consecutive ids as ``first-last``)."""
    parts: list[str] = []
    first = last = -1
    for event_id in ids:
        if event_id == last + 1 and last >= 0:
            last = event_id
            continue
        if last >= 0:
            parts.append(str(first) if first == last else f"{first}-{last}")
        first = last = event_id
    if last >= 0:
        parts.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(parts)


def unpack_ids(text: str) -> tuple[int, ...]:
    """The ids :func:`pack_ids` packed."""
    ids: list[int] = []
    for part in text.split(",") if text else ():
        first, _, last = part.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return tuple(ids)


def _key_params(key: TerminusKey) -> tuple[Any, ...]:
    return (key.user, key.container, key.name)


def keep_statements(
    dialect: Dialect, termini: Sequence[tuple[KeptTerminus, float]], per_user: int
) -> Statements:
    """The expired rows go, then per terminus the row under its key and the new one (which
    returns its id; none when its user or partition is gone), then each user's oldest
    beyond ``per_user``."""
    m, now = dialect.mark, dialect.now
    statements: Statements = [(f"DELETE FROM amqp_termini WHERE expires_at <= {now}", ())]
    insert = (
        f"INSERT INTO amqp_termini (user_id, container, link_name, {_COLUMNS}, expires_at)"
        f" SELECT u.id, {m}, {m}, p.key, {m}, {m}, {m}, {m}, {m}, {m}, {m}, {m}, {now} + {m}"
        f" FROM users u, partitions p WHERE u.id = {m} AND p.key = {m} RETURNING id"
    )
    forget = f"DELETE FROM amqp_termini WHERE {_KEY.format(m=m)}"
    for kept, grace in termini:
        key = kept.key
        statements.append((forget, _key_params(key)))
        params = (
            key.container,
            key.name,
            kept.group,
            kept.durable,
            pack_ids(kept.unsettled),
            kept.incomplete,
            kept.after,
            pack_ids(kept.held),
            kept.acked,
            kept.timeout,
            grace + kept.timeout,
            key.user,
            kept.partition_key,
        )
        statements.append((insert, params))
    evict = (
        f"DELETE FROM amqp_termini WHERE user_id = {m} AND id NOT IN"
        f" (SELECT id FROM amqp_termini WHERE user_id = {m} ORDER BY id DESC LIMIT {m})"
    )
    for user in dict.fromkeys(kept.key.user for kept, _grace in termini):
        statements.append((evict, (user, user, per_user)))
    return statements


def take_sql(dialect: Dialect) -> str:
    """Delete the row under a key, returning it and whether it is still live. Parameters:
    user id, container, link name."""
    return (
        f"DELETE FROM amqp_termini WHERE {_KEY.format(m=dialect.mark)}"
        f" RETURNING {_COLUMNS}, expires_at > {dialect.now}"
    )


def taken(key: TerminusKey, row: Sequence[Any]) -> KeptTerminus | None:
    """The terminus of a row :func:`take_sql` returned; None when it had expired."""
    if not row[9]:
        return None
    return KeptTerminus(
        key,
        int(row[0]),
        None if row[1] is None else str(row[1]),
        int(row[2]),
        unpack_ids(str(row[3])),
        bool(row[4]),
        int(row[5]),
        unpack_ids(str(row[6])),
        int(row[7]),
        float(row[8]),
    )


def expire_statements(dialect: Dialect, rows: Sequence[int], grace: float) -> Statements:
    """Each row expires ``grace`` plus its timeout from now; each statement returns the ids
    still there."""
    statements: Statements = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        statements.append(
            (
                f"UPDATE amqp_termini SET expires_at = {dialect.now} + timeout + {dialect.mark}"
                f" WHERE id IN ({dialect.marks(len(chunk))}) RETURNING id",
                (grace, *chunk),
            )
        )
    return statements


class TerminiTables(SqlCalls):
    """The calls of :class:`~futoin_evt.domain.termini.KeptTermini`."""

    async def keep_termini(
        self, termini: Sequence[tuple[KeptTerminus, float]], per_user: int
    ) -> list[int | None]:
        if not termini:
            return []
        results = await self._run(keep_statements(self.dialect, termini, per_user))
        inserted = results[2 : 2 + 2 * len(termini) : 2]
        return [int(rows[0][0]) if rows else None for rows in inserted]

    async def take_terminus(self, key: TerminusKey) -> KeptTerminus | None:
        sql = take_sql(self.dialect)
        (rows,) = await self._run([(sql, _key_params(key))])
        return taken(key, rows[0]) if rows else None

    async def discard_termini(self, keys: Sequence[TerminusKey]) -> None:
        if keys:
            sql = f"DELETE FROM amqp_termini WHERE {_KEY.format(m=self.dialect.mark)}"
            await self._run([(sql, _key_params(key)) for key in keys])

    async def expire_termini(self, rows: Sequence[int], grace: float) -> list[int]:
        if not rows:
            return []
        results = await self._run(expire_statements(self.dialect, rows, grace))
        return [int(row[0]) for found in results for row in found]

    async def purge_termini(self) -> int:
        sql = f"DELETE FROM amqp_termini WHERE expires_at <= {self.dialect.now} RETURNING id"
        (rows,) = await self._run([(sql, ())])
        return len(rows)

    async def count_termini(self, user_id: UserId | None = None) -> int:
        sql = f"SELECT count(*) FROM amqp_termini WHERE expires_at > {self.dialect.now}"
        params: tuple[Any, ...] = ()
        if user_id is not None:
            sql += f" AND user_id = {self.dialect.mark}"
            params = (user_id,)
        rows = await self._fetch(sql, params)
        return int(rows[0][0])
