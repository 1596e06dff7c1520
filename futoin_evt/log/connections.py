"""The connections open now in this server process, past their login, at every door that
lists them (FTN3 over WebSocket, event notification with it, AMQP): who, where from, since
when, and how to close one.

A door adds a connection once when its user is known and removes it once when it closes: a
dict insert and a delete per connection, nothing per call. What a door knows of the calls in
flight is read when the list is shown (a counter the door keeps anyway). With several
workers, each lists its own connections (the console's page says so).

Admins see every connection and may close one; any other user sees only their own. A closed
connection ends as a revoked right ends it: the door tells the peer why, once the calls in
flight have replied.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..domain.principal import Principal
from .access import Refused

logger = logging.getLogger(__name__)

#: What the peer is told when an admin closes its connection.
CLOSED_BY_ADMIN: Final = "an administrator closed this connection"


class AdminsOnlyClose(Refused):
    def __init__(self) -> None:
        super().__init__("only admin users close connections")


@dataclass(frozen=True, slots=True)
class OpenConnection:
    #: Its number in this process (random: a form sent to another worker finds none).
    id: str
    #: The door, as the console names it ("FTN3 over WebSocket", "AMQP 1.0").
    door: str
    #: The user it logged in as (the first, when an FTN3 connection carries several).
    user: str
    #: ``host:port`` of the peer.
    peer: str
    #: When its user logged in: ``time.time()``.
    since: float
    #: Closes it, telling the peer the reason (one sentence).
    close: Callable[[str], None]
    #: Its calls in flight now; None: the door does not know.
    in_flight: Callable[[], int] | None = None

    @property
    def calls(self) -> int | None:
        return self.in_flight() if self.in_flight is not None else None


class Connections:
    """This process's open connections, by id."""

    def __init__(self) -> None:
        self._open: dict[str, OpenConnection] = {}

    def add(
        self,
        door: str,
        user: str,
        peer: str,
        close: Callable[[str], None],
        in_flight: Callable[[], int] | None = None,
    ) -> str:
        """A connection's user logged in; its id, for :meth:`remove` when it closes."""
        key = secrets.token_hex(8)
        self._open[key] = OpenConnection(key, door, user, peer, time.time(), close, in_flight)
        return key

    def remove(self, key: str) -> None:
        self._open.pop(key, None)

    def __len__(self) -> int:
        return len(self._open)

    def visible_to(self, who: Principal) -> list[OpenConnection]:
        """Every connection for an admin, else ``who``'s own; the oldest first."""
        shown = [c for c in self._open.values() if who.is_admin or c.user == who.name]
        return sorted(shown, key=lambda c: c.since)

    def close(self, who: Principal, key: str) -> OpenConnection | None:
        """Close connection ``key`` (admins only: :class:`AdminsOnlyClose`); None when this
        process has no such connection (closed already, or another worker's)."""
        if not who.is_admin:
            raise AdminsOnlyClose()
        connection = self._open.get(key)
        if connection is None:
            return None
        logger.info(
            "%s closed the %s connection of %s from %s",
            who.name,
            connection.door,
            connection.user,
            connection.peer,
        )
        connection.close(CLOSED_BY_ADMIN)
        return connection
