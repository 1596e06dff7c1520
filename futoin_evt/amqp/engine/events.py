"""What :meth:`~.protocol.AmqpProtocol.events` returns: what the peer did that its owner
decides on (a link to attach or refuse, a message, outcomes, a detach, an end, a close)."""

from __future__ import annotations

from .performatives import Error
from .session import Delivery, Link, Session


class LinkAttached:
    """The peer attached ``link``: :meth:`Link.accept` or :meth:`Link.refuse` it."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link


class LinkFlow:
    """The peer changed the credit (or drain) of a link we send on."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link


class MessageReceived:
    """A whole message arrived on a link we receive on (``delivery.payload``)."""

    __slots__ = ("delivery", "link")

    def __init__(self, link: Link, delivery: Delivery) -> None:
        self.link = link
        self.delivery = delivery


class DeliveriesUpdated:
    """The peer gave outcomes to (or settled) deliveries we sent on ``link``."""

    __slots__ = ("deliveries", "link")

    def __init__(self, link: Link, deliveries: list[Delivery]) -> None:
        self.link = link
        self.deliveries = deliveries


class LinkDetached:
    """The link is detached: by the peer (answer with :meth:`Link.close` when ready) or by the
    engine itself (``by_peer`` False: a message too large, say; nothing to answer)."""

    __slots__ = ("by_peer", "closed", "error", "link")

    def __init__(self, link: Link, error: Error | None, closed: bool, by_peer: bool) -> None:
        self.link = link
        self.error = error
        self.closed = closed
        self.by_peer = by_peer


class SessionEnded:
    """The peer ended a session; its links are gone with it (answered already)."""

    __slots__ = ("error", "links", "session")

    def __init__(self, session: Session, links: list[Link], error: Error | None) -> None:
        self.session = session
        self.links = links
        self.error = error


class ConnectionClosed:
    """The connection is closed (by the peer, or by us for ``error``); write what is left and
    close the socket."""

    __slots__ = ("by_peer", "error")

    def __init__(self, error: Error | None, by_peer: bool) -> None:
        self.error = error
        self.by_peer = by_peer


Event = (
    LinkAttached
    | LinkFlow
    | MessageReceived
    | DeliveriesUpdated
    | LinkDetached
    | SessionEnded
    | ConnectionClosed
)
