"""Failed logins in the log: one WARNING line per user name and peer address per second.

Every door's login goes through :class:`~futoin_evt.auth.users.Authenticator`, which tells
:func:`log_failed_login` of each refusal. The line names the door, the user name as given
(quoted, cut at 64 characters) and the peer; never the password. A peer that tries one
name many times a second gets one line a second, which counts the refusals it stands for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from ..quoting import quote_input

logger = logging.getLogger("futoin_evt.auth")

#: How the doors are named in the line (others as the door calls itself).
_DOOR_NAMES: Final = {
    "websocket": "FTN3",
    "amqp": "AMQP",
    "feed": "HTTP",
    "dcb": "HTTP",
    "schemas": "HTTP",
    "asyncapi": "HTTP",
    "metrics": "HTTP",
    "console": "Console",
}
#: (user, peer) pairs remembered at most; beyond, those older than the interval are dropped.
_KEPT: Final = 10_000


class FailedLogins:
    """Writes the line for a failed login unless one for that user and peer was written less
    than ``interval`` seconds ago; the next line counts the ones left out."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        #: (user, peer) -> (when its last line was written, refusals since then not written)
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def note(self, door: str, user: str, peer: str, reason: str) -> bool:
        """Log one failed login (True) or count it for the next line (False)."""
        key = (user[:64], peer)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last[key] = (last[0], last[1] + 1)
            return False
        left_out = last[1] if last is not None else 0
        if len(self._last) >= _KEPT:
            self._forget(now)
        self._last[key] = (now, 0)
        more = f"; {left_out} more since the last line" if left_out else ""
        logger.warning(
            "%s login failed for %s from %s (%s%s)",
            _DOOR_NAMES.get(door, door),
            quote_input(user, 64),
            peer or "an unknown peer",
            reason,
            more,
        )
        return True

    def _forget(self, now: float) -> None:
        old = [key for key, (at, _n) in self._last.items() if now - at >= self._interval]
        for key in old:
            del self._last[key]
        if len(self._last) >= _KEPT:  # a flood of distinct names within one interval
            self._last.clear()


_FAILED_LOGINS: Final = FailedLogins()


def log_failed_login(door: str, user: str, peer: str, reason: str) -> None:
    """Log a failed login at WARNING, at most once a second per user name and peer."""
    _FAILED_LOGINS.note(door, user, peer, reason)
