"""The web console's sessions as the database keeps them
(:class:`~futoin_evt.storage.base.ConsoleSessionStore`). A session is named by the SHA-256
digest of its token (the token itself, the cookie's value, is never stored); it belongs to a
user (it goes with them) and carries its creation and last use as wall-clock seconds, and the
notice its next page shows once. The rules (how long a session lasts, how many there are) are
the console's: a store only keeps the rows."""

from __future__ import annotations

from typing import NamedTuple

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
