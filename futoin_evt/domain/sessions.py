"""The web console's sessions as the database keeps them, and the calls a store serves them
with. A session is named by the SHA-256 digest of its token (the token itself, the cookie's
value, is never stored); it belongs to a user (it goes with them) and carries its creation
and last use as wall-clock seconds, and the notice its next page shows once. The rules (how
long a session lasts, how many there are) are the console's: a store only keeps the rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .principal import Principal


class SessionLimits(NamedTuple):
    #: Sessions open at once at most, for the whole server (the least recently used goes).
    limit: int
    #: A session unused this long has ended.
    idle_seconds: float
    #: A session this old has ended, used or not.
    lifetime_seconds: float


class SessionRow(NamedTuple):
    principal: Principal
    #: Seconds since the epoch.
    created: float
    #: Seconds since the epoch, as last written (not at every use: see the console).
    used: float
    #: What the next page says of the last change (a drop, a seek), once; None: nothing.
    notice: str | None


class ConsoleSessionStore(Protocol):
    """The sessions of every process on the database, by the digest of their token."""

    async def add_console_session(
        self, digest: bytes, user_id: int, now: float, limits: SessionLimits
    ) -> list[bytes]:
        """Store a new session, then end those past ``limits`` at ``now`` (the least recently
        used beyond the bound first); returns the digests of the sessions ended."""

    async def console_sessions(self, digests: Sequence[bytes]) -> dict[bytes, SessionRow]:
        """The stored sessions among ``digests``, with their users."""

    async def touch_console_sessions(self, digests: Sequence[bytes], used: float) -> None:
        """The sessions were used at ``used`` (a session used later keeps its time)."""

    async def end_console_session(self, digest: bytes) -> None: ...

    async def set_console_notice(self, digest: bytes, notice: str) -> None: ...

    async def clear_console_notice(self, digest: bytes, notice: str) -> None:
        """Forget the notice, if it is still ``notice`` (shown once, not a newer one)."""
