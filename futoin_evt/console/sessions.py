"""The console's sessions: a random token in a cookie, kept in memory, a bounded number.

Only a digest of each token is kept (a memory dump holds no usable cookie). A session ends
at logout, after :attr:`Sessions.idle_seconds` unused, after :attr:`Sessions.lifetime_seconds`
in any case, or when more than :attr:`Sessions.limit` are open (the least recently used goes).
Each session has its own CSRF token, which every form that changes something carries.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from ..domain.principal import Principal
from .config import DEFAULT_MAX_SESSIONS

DEFAULT_IDLE_SECONDS: Final = 30 * 60.0
DEFAULT_LIFETIME_SECONDS: Final = 12 * 3600.0


@dataclass(slots=True)
class Session:
    principal: Principal
    csrf: str
    created: float
    used: float
    #: Live tails this session has open.
    tails: int = 0
    #: Set at logout or eviction: its live tails end.
    ended: bool = field(default=False)
    #: What the next page says of the last change (a drop, a seek), once.
    notice: str | None = None

    def take_notice(self) -> str | None:
        notice, self.notice = self.notice, None
        return notice

    def csrf_matches(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.csrf.encode())


class Sessions:
    def __init__(
        self,
        limit: int = DEFAULT_MAX_SESSIONS,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        lifetime_seconds: float = DEFAULT_LIFETIME_SECONDS,
    ) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self.lifetime_seconds = lifetime_seconds
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, principal: Principal) -> tuple[str, Session]:
        """A new session and its token (for the cookie)."""
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        session = Session(principal, secrets.token_urlsafe(24), now, now)
        self._sessions[_digest(token)] = session
        while len(self._sessions) > self.limit:
            _key, evicted = self._sessions.popitem(last=False)
            evicted.ended = True
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session of ``token``; marks it used."""
        if not token:
            return None
        key = _digest(token)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.used > self.idle_seconds or now - session.created > self.lifetime_seconds:
            self._end(key)
            return None
        session.used = now
        self._sessions.move_to_end(key)
        return session

    def end(self, token: str | None) -> None:
        if token:
            self._end(_digest(token))

    def _end(self, key: bytes) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.ended = True


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
