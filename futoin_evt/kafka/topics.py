"""What the Kafka calls share: the topics a user reaches, and the brokers they are told of."""

from __future__ import annotations

from collections.abc import Callable

from ..domain.partition import StreamInfo
from ..domain.principal import Principal
from ..domain.rights import Right
from ..log.access import AccessDenied
from ..log.eventlog import EventLog
from ..log.streams import StreamLogs, StreamRegistry
from . import wire
from .brokers import Brokers


class Topics:
    """The streams as topics, for one user's call at a time."""

    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        address: Callable[[], tuple[str, int]],
        brokers: Brokers | None = None,
    ) -> None:
        """``address``: the (host, port) clients are told to connect to; ``brokers``: the
        live ones with this one's node id (this one alone when not given)."""
        self.logs = logs
        self.streams = streams
        self.address = address
        self.brokers = brokers if brokers is not None else Brokers(address)
        self.cluster_id = "futoin-evt"

    def topic(self, who: Principal, name: str, right: Right) -> tuple[int, StreamInfo | None]:
        """(error, stream) for a call on topic ``name`` that needs ``right``."""
        try:
            info = self.streams.reachable(who, name, right)
        except AccessDenied:
            return wire.TOPIC_AUTHORIZATION_FAILED, None
        if info is None:
            return wire.UNKNOWN_TOPIC_OR_PARTITION, None
        return wire.NONE, info

    def log(self, info: StreamInfo, number: int) -> EventLog | None:
        if not 0 <= number < len(info.partitions):
            return None
        return self.logs.partition(info.partitions[number])

    def may_see(self, who: Principal, name: str) -> bool:
        """Metadata lists the topics the user may read or write."""
        access = self.streams.access
        return access.allows(who, Right.READ, name) or access.allows(who, Right.WRITE, name)
