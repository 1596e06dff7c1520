"""The access version: a number in ``meta`` that every write of users, grants (SAS policies
are users with grants) and schema versions moves on, in the write's own transaction, so every
process on the database can tell by one cheap read (SQLite) or a notification (PostgreSQL)
that who may do what changed. The row is made by the first such write (no migration): a
database without it reads as version 0.

A password change also ends the user's console sessions (in the same transaction), so every
process refuses their cookie at its next page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from .calls import Rows, SqlCalls, Statement

#: The key of the row in ``meta``.
ACCESS_VERSION_KEY: Final = "access_version"
#: The payload a change sends on PostgreSQL's channel (then the version).
ACCESS_PAYLOAD_PREFIX: Final = "access:"

READ_ACCESS_VERSION: Final = f"SELECT value FROM meta WHERE key = '{ACCESS_VERSION_KEY}'"


#: Moves the version on and returns it (one row).
BUMP_ACCESS: Final = (
    f"INSERT INTO meta (key, value) VALUES ('{ACCESS_VERSION_KEY}', '1') ON CONFLICT (key)"
    " DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT) RETURNING value"
)


def end_sessions_sql(mark: str) -> str:
    """Ends the console sessions of a user named (name)."""
    return (
        f"DELETE FROM console_sessions WHERE user_id = (SELECT id FROM users WHERE name = {mark})"
    )


def version_of(rows: list[tuple[object, ...]]) -> int:
    """The version a read of :data:`READ_ACCESS_VERSION` gives (0 when there is no row)."""
    for row in rows:
        return int(str(row[0]))
    return 0


class AccessCalls(SqlCalls):
    """A backend's write that moves the access version on."""

    async def _access_write(self, sql: str, params: Sequence[Any], *more: Statement) -> Rows:
        """``sql``'s rows; ``more`` statements, and the access version moved on (every
        process told, where the backend tells), in the same transaction."""
        raise NotImplementedError
