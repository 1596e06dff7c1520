"""The grants table's statements, spelt for either backend by its parameter mark (``?`` for
SQLite, ``%s`` for PostgreSQL): rights per user and stream pattern, as a bit mask
(:class:`futoin_evt.domain.rights.Right`)."""

from __future__ import annotations

import logging
from typing import Final

from ...domain.stream import UserId
from ..user_roles import GrantRow
from .access import AccessCalls

logger = logging.getLogger("futoin_evt.storage")

#: The schema version that adds grants; databases from before it get, once, read and write
#: on every stream for each user who is not an admin (they could do that before).
GRANTS_VERSION: Final = 9
#: The rights every earlier user had: read and write, on every stream.
UPGRADE_RIGHTS: Final = 3

UPGRADE_GRANTS: Final = (
    "INSERT INTO grants (user_id, pattern, rights)"
    f" SELECT id, '*', {UPGRADE_RIGHTS} FROM users WHERE NOT is_admin"
)


def grant_sql(mark: str) -> str:
    """Adds rights (user id, pattern, rights) to what the user holds on the pattern."""
    return (
        f"INSERT INTO grants (user_id, pattern, rights) VALUES ({mark}, {mark}, {mark})"
        " ON CONFLICT (user_id, pattern) DO UPDATE SET rights = grants.rights | excluded.rights"
    )


def revoke_sql(mark: str) -> str:
    """Takes rights (rights, user id, pattern, rights) away; returns the rights left, or no
    row when the user held none of them on the pattern."""
    return (
        f"UPDATE grants SET rights = rights & ~{mark}"
        f" WHERE user_id = {mark} AND pattern = {mark} AND rights & {mark} != 0 RETURNING rights"
    )


def forget_empty_sql(mark: str) -> str:
    """Removes the user's grant on the pattern once it holds nothing (user id, pattern)."""
    return f"DELETE FROM grants WHERE user_id = {mark} AND pattern = {mark} AND rights = 0"


LIST_GRANTS: Final = (
    "SELECT user_id, pattern, rights FROM grants WHERE rights != 0 ORDER BY user_id, pattern"
)


def log_upgrade_grants(users: int) -> None:
    """Say, once (in the upgrade's transaction), what the upgrade to grants gave."""
    if users:
        logger.warning(
            "upgrade: %d users who are not admins were given read,write on every stream (*),"
            " as they had before rights per stream; narrow them with futoin-evt revoke and"
            " futoin-evt grant",
            users,
        )


class GrantCalls(AccessCalls):
    """Grants; a change moves the access version on."""

    async def grant(self, user_id: UserId, pattern: str, rights: int) -> None:
        await self._access_write(grant_sql(self.dialect.mark), (user_id, pattern, rights))

    async def revoke(self, user_id: UserId, pattern: str, rights: int) -> bool:
        m = self.dialect.mark
        rows = await self._access_write(
            revoke_sql(m),
            (rights, user_id, pattern, rights),
            (forget_empty_sql(m), (user_id, pattern)),
        )
        return bool(rows)

    async def list_grants(self) -> list[GrantRow]:
        rows = await self._fetch(LIST_GRANTS)
        return [GrantRow(UserId(r[0]), r[1], r[2]) for r in rows]
