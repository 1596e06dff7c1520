"""What a page on the consumers reads of their deliveries as they run, without the door that
delivers (FTN18's push streams, :class:`~futoin_evt.ftn18.push.PushService`): which consumers
have a delivery connected to this process and how it fares, and which are connected to
another worker of the server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..domain.stream import UserId

#: A registered consumer's delivery: partition key, user, component.
DeliveryKey = tuple[int, UserId, str]


class DeliveryStats(Protocol):
    @property
    def retrying(self) -> int:
        """Failures in a row of the group now sent again (0: nothing failing)."""

    @property
    def groups_failed(self) -> int:
        """Groups that failed (each is sent again)."""


class Delivery(Protocol):
    """One consumer's delivery connected to this process."""

    @property
    def key(self) -> tuple[Any, ...]:
        """A registered consumer's :data:`DeliveryKey` (with more in it for others)."""

    @property
    def reliable(self) -> bool:
        """A registered consumer's (its position is stored), not a live one's."""

    @property
    def in_flight(self) -> int:
        """Groups sent and not acknowledged yet."""

    @property
    def stats(self) -> DeliveryStats: ...


class ConnectedDeliveries(Protocol):
    """The deliveries connected now, to this process and to the other workers."""

    @property
    def all_streams(self) -> Sequence[Delivery]:
        """Those of this process, on every partition."""

    def pushing_elsewhere(self) -> set[DeliveryKey]:
        """The registered consumers' deliveries that other workers of this server hold."""
