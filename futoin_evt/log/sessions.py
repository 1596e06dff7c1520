"""The web console's sessions (:mod:`futoin_evt.domain.sessions`) as the console keeps them: in
the database every process shares, so a login on one worker holds on every other.

A session is added for the user who logged in (``who``: never another user's); afterwards it
is found, used and ended by the digest of its token, which only its holder knows (the token
is the credential: there is no acting user before it is found)."""

from __future__ import annotations

from collections.abc import Sequence

from ..domain.principal import Principal
from ..domain.sessions import SessionLimits, SessionRow
from ..storage.base import ConsoleSessionStore


class ConsoleSessions:
    """:class:`~futoin_evt.storage.base.ConsoleSessionStore`'s calls, a new session's user
    taken from the login."""

    def __init__(self, store: ConsoleSessionStore) -> None:
        self._store = store

    async def add_console_session(
        self, who: Principal, digest: bytes, now: float, limits: SessionLimits
    ) -> list[bytes]:
        """A new session of ``who``, then the end of those past ``limits`` at ``now``; the
        digests of the sessions ended."""
        return await self._store.add_console_session(digest, who.user_id, now, limits)

    async def console_sessions(self, digests: Sequence[bytes]) -> dict[bytes, SessionRow]:
        """The stored sessions among ``digests``, with their users."""
        return await self._store.console_sessions(digests)

    async def touch_console_sessions(self, digests: Sequence[bytes], used: float) -> None:
        await self._store.touch_console_sessions(digests, used)

    async def end_console_session(self, digest: bytes) -> None:
        await self._store.end_console_session(digest)

    async def set_console_notice(self, digest: bytes, notice: str) -> None:
        await self._store.set_console_notice(digest, notice)

    async def clear_console_notice(self, digest: bytes, notice: str) -> None:
        """Forget the notice, if it is still ``notice``."""
        await self._store.clear_console_notice(digest, notice)
