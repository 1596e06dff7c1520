"""How the reconnecting clients (producer, receivers) wait between tries and say why.

A client that cannot reach its server says so at WARNING (which Python prints on stderr when
the application configured no logging) on the first failure of a run of failures, and again
every :data:`REPEAT_WARNING_SECONDS` while it lasts; the other tries are logged at INFO. A
session that worked ends the run: the next failure is reported again, and the delay starts
over from its initial value.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Final

#: While failures go on, a WARNING at most this often (the rest at INFO).
REPEAT_WARNING_SECONDS: Final = 30.0


class Reconnect:
    """The growing delay between tries of one client, and the report of each failure."""

    def __init__(
        self, log: logging.Logger, what: str, url: str, *, initial: float, maximum: float
    ) -> None:
        self._log = log
        self._what = what
        self._url = url
        self._initial = initial
        self._maximum = maximum
        self._delay = initial
        self._warned_at: float | None = None

    def worked(self) -> None:
        """A session worked: the next failure starts a new run (reported, short delay)."""
        self._delay = self._initial
        self._warned_at = None

    def failed(self, exc: BaseException) -> float:
        """Report a failed try; returns how long to wait before the next (with jitter)."""
        now = time.monotonic()
        delay = self._delay
        if self._warned_at is None or now - self._warned_at >= REPEAT_WARNING_SECONDS:
            self._warned_at = now
            level = logging.WARNING
        else:
            level = logging.INFO
        self._log.log(
            level,
            "%s: cannot use %s (%s); trying again in %.2f s",
            self._what,
            self._url,
            exc or type(exc).__name__,
            delay,
        )
        self._delay = min(self._delay * 2, self._maximum)
        return delay * (0.5 + random.random())

    def waited(self) -> float:
        """The wait after a session that ended without an error (and the delay grows)."""
        delay = self._delay
        self._delay = min(self._delay * 2, self._maximum)
        return delay * (0.5 + random.random())
