"""The console's sessions: a random token in a cookie, kept in the database, a bounded number.

The database keeps only the SHA-256 digest of each token (a copy of the database holds no
usable cookie), so every worker and every process on the database knows every session, and
a session outlives a restart. A session ends at logout, when its user's password changes or
the user is removed (the store deletes the user's sessions in the same transaction), after
:attr:`~futoin_evt.domain.sessions.SessionLimits.idle_seconds` unused, after
:attr:`~futoin_evt.domain.sessions.SessionLimits.lifetime_seconds` in any case, or when more
than :attr:`~futoin_evt.domain.sessions.SessionLimits.limit` are open (the least recently
used goes), for the server as a whole.

A page view reads the session's row; it writes its last use only when that moved by more
than :data:`USED_STEP` (so the idle time is counted to the minute, at most one write per
session and minute). Each session has its own CSRF token, which every form that changes
something carries: an HMAC of the session's token, so it is stored nowhere, and the check is
constant-time.

The live tails of this process are kept per session here. A logout or an eviction in this
process ends them at once; one elsewhere ends them at the next :meth:`Sessions.check` (the
console runs it every ``session_check_seconds``): one read of the database for all the
sessions with tails here, whatever their number. A password change ends them at once (their
rights' watches are called back). An open tail counts as use.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Final

from ..domain.principal import Principal
from ..domain.sessions import SessionLimits, SessionRow
from ..log.sessions import ConsoleSessions

logger = logging.getLogger(__name__)

#: Seconds a session's last use may lag: it is written only when it moved by more.
USED_STEP: Final = 60.0


@dataclass(slots=True)
class Session:
    digest: bytes
    principal: Principal
    #: The CSRF token every form of this session carries.
    csrf: str
    #: The notice the database held when the session was read.
    notice: str | None = None

    def csrf_matches(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.csrf.encode())


@dataclass(slots=True)
class Tails:
    """The live tails one session has open in this process."""

    count: int = 0
    #: Set when the session ends (logout, eviction, expiry, anywhere): its tails end.
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Sessions:
    def __init__(self, store: ConsoleSessions, limits: SessionLimits) -> None:
        self.store = store
        self.limits = limits
        self._tails: dict[bytes, Tails] = {}

    async def create(self, principal: Principal) -> str:
        """A new session; returns its token (for the cookie)."""
        token = secrets.token_urlsafe(32)
        ended = await self.store.add_console_session(
            principal, _digest(token), time.time(), self.limits
        )
        for digest in ended:
            self._ended(digest)
        return token

    async def get(self, token: str | None) -> Session | None:
        """The live session of ``token``; marks it used."""
        if not token:
            return None
        digest = _digest(token)
        row = (await self.store.console_sessions([digest])).get(digest)
        now = time.time()
        if row is None or self._expired(row, now):
            if row is not None:
                await self.end(token)
            return None
        if now - row.used > USED_STEP:
            await self.store.touch_console_sessions([digest], now)
        return Session(digest, row.principal, _csrf(token), row.notice)

    async def end(self, token: str | None) -> None:
        if token:
            digest = _digest(token)
            await self.store.end_console_session(digest)
            self._ended(digest)

    async def set_notice(self, session: Session, notice: str) -> None:
        await self.store.set_console_notice(session.digest, notice)

    async def take_notice(self, session: Session) -> str | None:
        """The session's notice, forgotten once shown."""
        notice, session.notice = session.notice, None
        if notice is not None:
            await self.store.clear_console_notice(session.digest, notice)
        return notice

    # -- live tails ---------------------------------------------------------------------------

    def tails_open(self, session: Session) -> int:
        """How many live tails ``session`` has open here."""
        tails = self._tails.get(session.digest)
        return 0 if tails is None else tails.count

    def tail_opened(self, session: Session) -> Tails:
        """One more live tail of ``session`` here: it ends once ``ended`` is set."""
        tails = self._tails.get(session.digest)
        if tails is None:
            tails = self._tails[session.digest] = Tails()
        tails.count += 1
        return tails

    def tail_closed(self, session: Session) -> None:
        tails = self._tails.get(session.digest)
        if tails is not None:
            tails.count -= 1
            if tails.count <= 0:
                del self._tails[session.digest]

    async def check(self) -> None:
        """End the tails here of the sessions that ended elsewhere; mark the others used."""
        if not self._tails:
            return
        digests = list(self._tails)
        rows = await self.store.console_sessions(digests)
        now = time.time()
        used = []
        for digest in digests:
            row = rows.get(digest)
            if row is None or self._expired(row, now):
                self._ended(digest)
            elif now - row.used > USED_STEP:
                used.append(digest)
        await self.store.touch_console_sessions(used, now)

    async def keep_checking(self, interval: float) -> None:
        """:meth:`check` every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except Exception as exc:  # the database is away: the tails go on meanwhile
                logger.warning("the console's sessions could not be checked: %s", exc)

    def _expired(self, row: SessionRow, now: float) -> bool:
        limits = self.limits
        return now - row.used > limits.idle_seconds or now - row.created > limits.lifetime_seconds

    def _ended(self, digest: bytes) -> None:
        tails = self._tails.get(digest)
        if tails is not None:
            tails.ended.set()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _csrf(token: str) -> str:
    """The CSRF token of the session of ``token``: nothing of the token can be learnt from it."""
    mac = hmac.new(token.encode(), b"futoin-evt console csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")
