"""The console's sessions (table ``console_sessions``, schema version
:data:`SESSIONS_VERSION`), written once for both backends
(:class:`~futoin_evt.domain.sessions.ConsoleSessionStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ...domain.principal import Principal
from ...domain.sessions import SessionLimits, SessionRow
from ...domain.stream import UserId
from .calls import SqlCalls

#: The schema version that adds ``console_sessions`` (its number is kept here only).
SESSIONS_VERSION: Final = 12

#: The sessions ended at a login: those past their idle time or lifetime, and the least
#: recently used beyond the bound among the others. Parameters: idle cut, lifetime cut,
#: idle cut, lifetime cut, bound.
_END_EXPIRED: Final = (
    "DELETE FROM console_sessions WHERE used < {m} OR created < {m} OR digest NOT IN"
    " (SELECT digest FROM console_sessions WHERE used >= {m} AND created >= {m}"
    " ORDER BY used DESC, created DESC LIMIT {m}) RETURNING digest"
)


class ConsoleSessionTables(SqlCalls):
    """The session store's calls."""

    async def add_console_session(
        self, digest: bytes, user_id: int, now: float, limits: SessionLimits
    ) -> list[bytes]:
        m = self.dialect.mark
        await self._write(
            f"INSERT INTO console_sessions (digest, user_id, created, used) VALUES ({m}, {m},"
            f" {m}, {m})",
            (digest, user_id, now, now),
        )
        idle, life = now - limits.idle_seconds, now - limits.lifetime_seconds
        ended = await self._write(_END_EXPIRED.format(m=m), (idle, life, idle, life, limits.limit))
        return [bytes(row[0]) for row in ended]

    async def console_sessions(self, digests: Sequence[bytes]) -> dict[bytes, SessionRow]:
        if not digests:
            return {}
        rows = await self._fetch(
            "SELECT s.digest, s.user_id, u.name, u.is_admin, s.created, s.used, s.notice"
            " FROM console_sessions s JOIN users u ON u.id = s.user_id"
            f" WHERE s.digest IN ({self.dialect.marks(len(digests))})",
            digests,
        )
        return {
            bytes(digest): SessionRow(
                Principal(UserId(int(user_id)), str(name), bool(is_admin)),
                float(created),
                float(used),
                None if notice is None else str(notice),
            )
            for digest, user_id, name, is_admin, created, used, notice in rows
        }

    async def touch_console_sessions(self, digests: Sequence[bytes], used: float) -> None:
        if digests:
            m = self.dialect.mark
            await self._write(
                f"UPDATE console_sessions SET used = {m}"
                f" WHERE digest IN ({self.dialect.marks(len(digests))}) AND used < {m}",
                (used, *digests, used),
            )

    async def end_console_session(self, digest: bytes) -> None:
        await self._write(
            f"DELETE FROM console_sessions WHERE digest = {self.dialect.mark}", (digest,)
        )

    async def set_console_notice(self, digest: bytes, notice: str) -> None:
        m = self.dialect.mark
        await self._write(
            f"UPDATE console_sessions SET notice = {m} WHERE digest = {m}", (notice, digest)
        )

    async def clear_console_notice(self, digest: bytes, notice: str) -> None:
        m = self.dialect.mark
        await self._write(
            f"UPDATE console_sessions SET notice = NULL WHERE digest = {m} AND notice = {m}",
            (digest, notice),
        )
