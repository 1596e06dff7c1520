"""The node table: which node takes a new link, by its address, and what a node and its
links see of the connection a link came on.

The AMQP modules depend one way: the engine (no server in it) at the bottom, then the door's
values (``config``, ``sasl``, ``codec``, ``filters``, ...), this table, the links' shared base
(``links``), the event log node's parts (``streams``), the nodes (``node``, ``cbs``,
``management``, ``notify``) and the connection beside them, and the listener on top, which
builds the table. A node knows a connection only as
:class:`ConnectionView`; the connection knows the nodes only through the table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Final, Protocol

from ..auth.sas import TokenClaims
from ..domain.principal import Principal
from ..domain.rights import Right
from ..log.eventlog import EventLog
from .engine.conditions import UNAUTHORIZED
from .engine.session import Delivery, Link

#: Why a connection that acts as no user yet is refused a link.
NO_USER: Final = "log in with SASL PLAIN as a user of this server, or put a SAS token to $cbs"


class LinkRefused(Exception):
    """An attach the node will not take; the link is refused with ``condition``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


class LinkHandler(Protocol):
    """What the node attaches to an accepted link."""

    def on_flow(self) -> None: ...

    def on_delivery(self, delivery: Delivery) -> None:
        """A whole message arrived (on a link the node receives on)."""

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        """The peer settled or gave outcomes to deliveries the node sent (settled here)."""

    def on_writable(self) -> None: ...

    def on_closed(self) -> asyncio.Future[None] | None:
        """The link is gone; a future returned delays answering the peer's detach."""


class ConnectionView(Protocol):
    """The connection a link came on, as its node and handler see it."""

    @property
    def principal(self) -> Principal | None:
        """The user the connection acts as; None before a login or a token names one."""

    @property
    def peer_name(self) -> str:
        """The peer's address, for log lines."""

    @property
    def writable(self) -> bool:
        """False while the socket's write buffer is full."""

    @property
    def container_id(self) -> str | None:
        """The peer's container id; None before its open."""

    def wake(self) -> None:
        """Send soon what handlers changed outside of the connection's dispatch."""

    def when_ended(
        self, link: Link, session: bool, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``callback`` once ``link``'s session (``session``) or the connection ends;
        returns how to cancel that."""

    def detach(self, link: Link, condition: str, description: str) -> None:
        """Close one of the connection's links with an error (its handler is told)."""

    def grant_claims(self, claims: TokenClaims) -> tuple[int, str] | None:
        """A token put to ``$cbs``: None when the connection now acts as its user, within its
        scope too, else the status and why not."""

    def refusal(self, right: Right, stream: str, paths: Sequence[str]) -> str | None:
        """Why the connection may not use ``right`` on ``stream`` at one of the address
        ``paths`` (one sentence), or None when it may: its user needs the right, and a
        connection that logged in with tokens needs one whose scope covers a path."""

    def authorize(self, link: Link, right: Right, stream: str, paths: Sequence[str]) -> None:
        """:class:`LinkRefused` with ``amqp:unauthorized-access`` when :meth:`refusal` gives a
        reason; else ``link`` is detached so once the right is revoked, or the tokens that
        cover it expire."""


class Node(Protocol):
    """Takes the links to its address."""

    def attach(self, conn: ConnectionView, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`."""


class Hubs(Protocol):
    """The streams served: each one's partition logs by name."""

    def partitions(self, name: str) -> Sequence[EventLog] | None:
        """Partition ``n``'s log at index ``n``; None when there is no such stream."""

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the streams may have changed (one grew); returns how to stop."""


def address_path(address: str) -> str:
    """``events/...`` from ``scheme://host[:port]/events/...``; other addresses unchanged."""
    _scheme, sep, rest = address.partition("://")
    return rest.partition("/")[2] if sep else address


class NodeTable:
    """Maps a link's address (or the path of a URI) to the node that takes it: a node named
    exactly, a node of a tree (its name and every ``NAME/...`` below it), else the event log
    node. Only the nodes named public take links of a connection that acts as no user yet."""

    def __init__(
        self,
        default: Node,
        *,
        nodes: Mapping[str, Node] | None = None,
        trees: Mapping[str, Node] | None = None,
        public: Collection[str] = (),
    ) -> None:
        self._default = default
        self._nodes = dict(nodes or {})
        self._trees = dict(trees or {})
        self._public = frozenset(public)

    def attach(self, conn: ConnectionView, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`."""
        address = link.address
        path = address_path(address) if address is not None else None
        name = path
        node = self._nodes.get(path) if path is not None else None
        if node is None and path is not None:
            name = path.partition("/")[0]
            node = self._trees.get(name)
        if conn.principal is None and (node is None or name not in self._public):
            raise LinkRefused(UNAUTHORIZED, NO_USER)
        return (node if node is not None else self._default).attach(conn, link)
