"""The users' calls, the same in every backend; a write moves the access version on
(:mod:`.access`)."""

from __future__ import annotations

from collections.abc import Sequence

from ...domain.stream import UserId, utc_timestamp
from ..user_roles import ScramCredential, User
from .access import AccessCalls, end_sessions_sql
from .scram import store_scram_sql


class UserCalls(AccessCalls):
    """Users, with their password hashes and the SCRAM credentials of the same password."""

    async def add_user(
        self,
        name: str,
        password_hash: str,
        *,
        is_admin: bool = False,
        scram: Sequence[ScramCredential] = (),
    ) -> UserId:
        m = self.dialect.mark
        rows = await self._access_write(
            f"INSERT INTO users (name, password_hash, is_admin, created_at)"
            f" VALUES ({m}, {m}, {m}, {m}) ON CONFLICT (name) DO NOTHING RETURNING id",
            (name, password_hash, is_admin, utc_timestamp()),
            *(store_scram_sql(m, name, password_hash, scram) if scram else ()),
        )
        if not rows:
            raise KeyError(f"user {name} exists already")
        return UserId(rows[0][0])

    async def set_password(
        self, name: str, password_hash: str, scram: Sequence[ScramCredential] = ()
    ) -> bool:
        """Also ends the user's console sessions (see :mod:`.access`) and replaces their SCRAM
        credentials."""
        m = self.dialect.mark
        rows = await self._access_write(
            f"UPDATE users SET password_hash = {m} WHERE name = {m} RETURNING id",
            (password_hash, name),
            (end_sessions_sql(m), (name,)),
            *store_scram_sql(m, name, password_hash, scram),
        )
        return bool(rows)

    async def remove_user(self, name: str) -> bool:
        """Remove a user and their consumers (of every partition)."""
        rows = await self._access_write(
            f"DELETE FROM users WHERE name = {self.dialect.mark} RETURNING id", (name,)
        )
        return bool(rows)

    async def get_user(self, name: str) -> User | None:
        rows = await self._fetch(
            f"SELECT id, name, password_hash, is_admin FROM users WHERE name = {self.dialect.mark}",
            (name,),
        )
        for row in rows:
            return User(UserId(row[0]), row[1], row[2], bool(row[3]))
        return None

    async def list_users(self) -> list[User]:
        rows = await self._fetch(
            "SELECT id, name, password_hash, is_admin FROM users ORDER BY name"
        )
        return [User(UserId(r[0]), r[1], r[2], bool(r[3])) for r in rows]
