"""The event log nodes: one per stream, under its name, with partitions ``"0".."P-1"``, and
their ``$info`` sources.

A link is taken by :meth:`EventLogNode.attach`, which checks the caller's right on the
stream (write to send, read to receive; before anything tells whether the stream exists),
the address and the link properties, and returns the handler that then serves it:
:class:`ProducerLink` for messages sent to a stream, :class:`ConsumerLink` for events read
from one partition, :class:`PartitionsLink` for events read from all of them
(partition-agnostic), :class:`InfoLink` for the runtime information. Handlers call the event
logs of the partitions, never the store.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from ..domain.rights import Right
from ..log.eventlog import EventLog
from ..log.termini import LinkTermini
from ..quoting import quote_input
from ..stats import Calls
from .codec import BadMessage, Position
from .config import DEFAULT_NODE_LIMITS, NodeLimits
from .engine.conditions import NOT_FOUND
from .engine.session import Link
from .resume import Termini
from .streams.addressing import (
    DEFAULT_GROUP,
    EPOCH_PROPERTY,
    GROUP_PROPERTY,
    NODE,
    OWNER_LEVEL_PROPERTY,
    key_partition,
    link_properties,
    parse_address,
    partition_number,
    requested_partition,
    start_position,
)
from .streams.consumer import Attaching, ConsumerLink
from .streams.groups import ConsumerGroups
from .streams.partitions import Grows, InfoLink, PartitionsLink
from .streams.producer import ProducerLink
from .streams.recovery import Recovery, durability, forget, recover, restore_kept
from .table import ConnectionView, Hubs, LinkHandler, LinkRefused, address_path


class OneHub:
    """Only ``events``, with one partition."""

    def __init__(self, events: EventLog) -> None:
        self._logs = (events,)

    def partitions(self, name: str) -> Sequence[EventLog] | None:
        return self._logs if name == NODE else None

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None  # one partition, for good


class EventLogNode:
    """Routes attaches to the handlers of the streams' event logs."""

    def __init__(
        self,
        events: EventLog,
        limits: NodeLimits = DEFAULT_NODE_LIMITS,
        hubs: Hubs | None = None,
        *,
        termini: LinkTermini,
    ) -> None:
        """``termini``: where the termini of suspended links are kept (the database every
        process on it shares)."""
        self.events = events
        self.hubs: Hubs = hubs if hubs is not None else OneHub(events)
        self.limits = limits
        #: Messages sent to the node, by outcome, with the time to their settlement (metrics).
        self.calls = Calls("amqp")
        #: Where messages with no partition key go, in turn.
        self._spread = itertools.count()
        #: The termini of suspended durable consumer links, until they expire.
        self.termini = Termini(termini)
        #: This process's consumer group links.
        self._groups = ConsumerGroups(self.termini)

    def attach(self, conn: ConnectionView, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`: ``amqp:unauthorized-access``
        without the right on the stream its address names (write to send to it, read to
        receive from it), before anything tells whether the stream exists."""
        address = link.address
        uri = address is not None and "://" in address
        address = address_path(address) if address is not None else ""
        stream = address.partition("/")[0]
        conn.authorize(link, Right.READ if link.is_sender else Right.WRITE, stream, (address,))
        parsed = parse_address(self.hubs, address)
        properties = link_properties(link)
        partition = requested_partition(properties, parsed)
        if parsed.info:
            if not link.is_sender:
                raise LinkRefused(NOT_FOUND, "$info is a source: attach a receiving link")
            return InfoLink(conn, link, parsed.logs)
        if partition is None and len(parsed.logs) == 1:
            partition = 0  # the node binds a link of a one-partition stream (4.1, 4.3)
        if not link.is_sender:
            return ProducerLink(
                conn,
                link,
                parsed.logs[partition] if partition is not None else self.events,
                self.limits,
                self.calls,
                router=None if partition is not None else self._router(parsed.hub),
                partition=partition,
            )
        group = properties.get(GROUP_PROPERTY, parsed.group)
        epoch = properties.get(EPOCH_PROPERTY)
        # An Event Hubs owner level: one link per group and partition, the newest of the
        # highest level wins (how the SDK's load balancing hands a partition over).
        owner_level = properties.get(OWNER_LEVEL_PROPERTY) if epoch is None else None
        if owner_level is not None:
            group = DEFAULT_GROUP if group is None else group
            epoch = owner_level
        event_hubs = uri or parsed.partition is not None
        if group is None:
            if partition is None:
                starts = [start_position(link, events.head) for events in parsed.logs]
                return PartitionsLink(
                    conn,
                    link,
                    parsed.logs,
                    starts,
                    event_hubs=event_hubs,
                    grows=self._grows(parsed.hub),
                )
            events = parsed.logs[partition]
            head = events.head
            start = start_position(link, head)
            recovery = durability(self.termini, conn, link, None)
            if recovery is None or not recovery.durable:
                forget(self.termini, recovery)
                return ConsumerLink(conn, link, events, start, event_hubs=event_hubs,
                                    partition=partition)  # fmt: skip
            return Attaching(
                conn,
                link,
                lambda attaching: self._attach_durable(
                    attaching, recovery, events, start, head, event_hubs, partition
                ),
                "the link's terminus could not be read",
            )
        return self._groups.attach(
            conn, link, parsed, partition, group, epoch, event_hubs, owner_level is not None
        )

    async def _attach_durable(
        self,
        attaching: Attaching,
        recovery: Recovery,
        events: EventLog,
        start: Position | None,
        head: int,
        event_hubs: bool,
        partition: int,
    ) -> None:
        """Serve a durable consumer link once the terminus it resumes (if any) is taken."""
        resumed = await recover(self.termini, recovery, events.partition.key)
        if attaching.closed:  # the link went meanwhile: what it took is kept again
            restore_kept(resumed)
            return
        attaching.inner = ConsumerLink(
            attaching.conn,
            attaching.link,
            events,
            start,
            head=head,
            event_hubs=event_hubs,
            partition=partition,
            recovery=resumed,
        )
        attaching.conn.wake()

    def _grows(self, hub: str) -> Grows:
        """How a partition-agnostic consumer of ``hub`` follows its partitions."""
        return Grows(lambda: self.hubs.partitions(hub), self.hubs.listen)

    def _router(self, hub: str) -> Callable[[str | None, str | None], EventLog]:
        """Where a partition-agnostic producer's message goes: the partition its delivery
        annotation names, else its key's (:func:`key_partition`), else the next in turn."""

        def route(target: str | None, key: str | None) -> EventLog:
            logs = self.hubs.partitions(hub)
            if logs is None:
                raise BadMessage(NOT_FOUND, f"the stream {hub} was dropped")
            if target is not None:
                number = partition_number(target, len(logs))
                if number is None:
                    raise BadMessage(NOT_FOUND, f"no such partition: {quote_input(target, 40)}")
                return logs[number]
            if key is not None:
                return logs[key_partition(key, len(logs))]
            return logs[next(self._spread) % len(logs)]

        return route

    async def close(self) -> None:
        """Stop renewing, let the groups of the links that ended be released, and store the
        termini of the links suspended."""
        await self._groups.close()
        await self.termini.close()
