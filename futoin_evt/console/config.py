"""The console's settings (importable without Jinja2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Console sessions open at once at most (``serve --console-sessions``).
DEFAULT_MAX_SESSIONS: Final = 256


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    #: Where the console is served on the WebSocket port.
    path: str = "/console"
    #: Sessions open at once, for the whole server (every process on the database).
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: A session ends unused this long (counted to the minute: see console/sessions.py)...
    idle_seconds: float = 30 * 60.0
    #: ...and this long after the login in any case.
    lifetime_seconds: float = 12 * 3600.0
    #: Seconds between two looks at the database for the sessions of this process's live
    #: tails: a logout or eviction elsewhere ends them this much later at most.
    session_check_seconds: float = 2.0
    #: Seconds between two samples of every partition's head (the charts' resolution).
    sample_seconds: float = 10.0
    #: Seconds between two refreshes of a table page (its script fetches the page again).
    refresh_seconds: float = 3.0
    #: Live tails open at once, in all and per session.
    max_tails: int = 64
    tails_per_session: int = 4
    #: Rows a live tail page keeps (older ones go).
    tail_rows: int = 200
