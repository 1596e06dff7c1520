"""The registered (reliable) consumers of a partition: their lifecycle, positions and reads.

Every door registers, drops, seeks and acknowledges through :class:`PartitionConsumers`, so
each rule and management event is written once: a consumer registered anew is announced as
``consumerRegistered``; a drop is announced as ``consumerDropped``; a drop or a seek stops
the consumer's delivery (its push stream, on every worker), so its receiver starts again
from the stored position. Each call takes the acting user (``who``) first; who may act on
whose consumers is :mod:`.access`'s.

A position moves only over what was given: an acknowledgement or a seek past the partition's
head (the newest id ever given there) is refused with :class:`PositionPastHead`, so no
reader can make events go away before they exist. The head only grows: a position at or
below the newest id this process has seen (the store's :attr:`head`, or the last head read
here) is taken without asking the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..domain.management import CONSUMER_DROPPED, CONSUMER_REGISTERED, ManagementBus
from ..domain.notification import Value
from ..domain.partition import Partition
from ..domain.principal import Principal
from ..domain.stream import MAX_EVENTS_PER_CALL, UserId
from ..storage.base import ConsumerRow, EventPage, PartitionLog
from ..storage.head import ClaimWatch, HeadWatch
from ..storage.user_roles import Users
from .access import OPEN_ACCESS, Refused, StreamGuard

__all__ = [
    "ConsumerLifecycle",
    "ConsumerRow",
    "Deliveries",
    "PartitionConsumers",
    "PositionPastHead",
    "check_given",
]


class PositionPastHead(Refused):
    """A position past the newest id ever given in the partition: nothing there was read."""

    def __init__(self, name: str, position: int, partition: Partition, head: int) -> None:
        self.position = position
        self.head = head
        super().__init__(f"{name} {position} is past the head of partition {partition} ({head})")


class _Given(Protocol):
    """What :func:`check_given` reads: the partition, its committed head, the head ever given."""

    @property
    def partition(self) -> Partition: ...

    @property
    def head(self) -> HeadWatch: ...

    async def last_given_id(self) -> int: ...


async def check_given(store: _Given, position: int, name: str = "last_id") -> int:
    """:class:`PositionPastHead` unless ``position`` is at or below the newest id ever given
    in ``store``'s partition; returns that id as read (the committed head when it was not)."""
    head = store.head.head
    if position > head:
        head = await store.last_given_id()
        if position > head:
            raise PositionPastHead(name, position, store.partition, head)
    return head


class Deliveries(Protocol):
    """What delivers events to registered consumers as they come (FTN18's push streams)."""

    def stop_stream(self, user_id: UserId, component: str, partition: Partition) -> None:
        """Stop the consumer's delivery and drop its connection, on every worker, so its
        receiver reconnects and starts from the stored position."""


class ConsumerLifecycle:
    """What the consumers of every partition share: the users (a drop names the consumer's
    user), the management bus, and the deliveries to stop (set once they exist)."""

    def __init__(self, users: Users | None = None, bus: ManagementBus | None = None) -> None:
        self.users = users
        self.bus = bus
        self.deliveries: Deliveries | None = None


class PartitionConsumers:
    """One partition's registered consumers, as every door acts on them."""

    def __init__(
        self, store: PartitionLog, lifecycle: ConsumerLifecycle, guard: StreamGuard | None = None
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        #: Registering, reading and acknowledging need read on the stream; seeing and acting
        #: on another user's consumers needs manage.
        self.guard = guard or StreamGuard(OPEN_ACCESS, store.partition.stream)
        #: The newest id known to have been given (it only grows): a position at or below
        #: it, or the store's head, needs no look at the database.
        self._given = 0

    # -- the lifecycle ----------------------------------------------------------------------

    async def register(self, who: Principal, component: str, *, transport: str) -> bool:
        """Register ``who``'s consumer (idempotent); True when it is new, and announced.
        Needs read: nobody holds back the discarding of a stream they may not read."""
        self.guard.read(who)
        created = await self._store.register_consumer(who.user_id, component)
        if created:
            self._announce(
                CONSUMER_REGISTERED, user=who.name, component=component, transport=transport
            )
        return created

    async def drop(self, who: Principal, user: str, component: str, *, reason: str) -> bool:
        """Drop the consumer of ``user``, stop its delivery and announce it with ``reason``;
        False when there is no such consumer that ``who`` may act on."""
        users = self._lifecycle.users
        assert users is not None, "a drop needs the users"
        if not self.guard.acts_for(who, user):
            return False
        owner = await users.get_user(user)
        if owner is None or not await self._store.drop_consumer(owner.id, component):
            return False
        self._stop_delivery(owner.id, component)
        self._announce(
            CONSUMER_DROPPED, user=owner.name, component=component, by=who.name, reason=reason
        )
        return True

    async def seek(self, who: Principal, owner: UserId, component: str, position: int) -> bool:
        """Put the position of ``owner``'s consumer anywhere up to the head (not an
        acknowledgement) and stop its delivery; False when there is no such consumer that
        ``who`` may act on, :class:`PositionPastHead` past the head."""
        if not self.guard.acts_for(who, owner):
            return False
        if not self._given_already(position) and not await self._may_move(
            owner, component, position, "position"
        ):
            return False
        if not await self._store.set_position(owner, component, position):
            return False
        self._stop_delivery(owner, component)
        return True

    def _announce(self, event_type: str, **fields: Value) -> None:
        """Publish a management event about one of the partition's consumers."""
        bus = self._lifecycle.bus
        if bus is not None:
            partition = self._store.partition
            bus.publish(event_type, stream=partition.stream, partition=partition.number, **fields)

    def _stop_delivery(self, owner: UserId, component: str) -> None:
        deliveries = self._lifecycle.deliveries
        if deliveries is not None:
            deliveries.stop_stream(owner, component, self._store.partition)

    async def acknowledge(
        self, who: Principal, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        """Durably move ``who``'s position forward to ``up_to`` (never back); the position
        after, or None when the consumer is not registered (or, with ``epoch``, was claimed
        by a newer delivery). :class:`PositionPastHead` past the head."""
        self.guard.read(who)
        if not self._given_already(up_to) and not await self._may_move(
            who.user_id, component, up_to
        ):
            return None
        return await self._store.acknowledge(who.user_id, component, up_to, epoch=epoch)

    async def within_head(self, position: int, name: str = "last_id") -> None:
        """:class:`PositionPastHead` when ``position`` is past the head (for a door that
        moves a position by another way, an AMQP consumer group's)."""
        if not self._given_already(position):
            await self._within_head(position, name)

    def _given_already(self, position: int) -> bool:
        """Whether ``position`` is known to be given, without asking the database."""
        return position <= self._given or position <= self._store.head.head

    async def _within_head(self, position: int, name: str = "last_id") -> None:
        self._given = max(self._given, await check_given(self._store, position, name))

    async def _may_move(
        self, owner: UserId, component: str, position: int, name: str = "last_id"
    ) -> bool:
        """True when ``position`` is within the head; past it, False when the consumer is
        not registered (that answer comes first), else :class:`PositionPastHead`."""
        try:
            await self._within_head(position, name)
        except PositionPastHead:
            if await self._store.position(owner, component) is None:
                return False
            raise
        return True

    async def claim(self, who: Principal, component: str) -> tuple[int, int] | None:
        """Make the caller the consumer's one delivery in the whole cluster: (its new epoch,
        position), or None when it is not registered."""
        self.guard.read(who)
        return await self._store.claim_consumer(who.user_id, component)

    @property
    def claims(self) -> ClaimWatch:
        """Told of the claims of this partition's consumers, other processes' too."""
        return self._store.claims

    # -- positions and reads ----------------------------------------------------------------

    async def position(self, who: Principal, component: str) -> int | None:
        self.guard.read(who)
        return await self._store.position(who.user_id, component)

    async def state(self, who: Principal, component: str) -> tuple[int, int] | None:
        """(position, last given id) in one snapshot; None when not registered."""
        self.guard.read(who)
        return await self._store.consumer_state(who.user_id, component)

    async def read(
        self,
        who: Principal,
        component: str,
        *,
        at_least: int = 0,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        """A page after the consumer's position (or ``at_least`` when higher); None when the
        consumer is not registered."""
        self.guard.read(who)
        return await self._store.read_consumer_events(
            who.user_id,
            component,
            at_least=at_least,
            types=types,
            limit=limit,
            max_bytes=max_bytes,
            ftn18_only=ftn18_only,
        )

    async def read_range(
        self,
        who: Principal,
        component: str,
        after_id: int,
        upto_id: int | None,
        *,
        types: Sequence[str] | None = None,
        max_bytes: int,
        data_as_text: bool = False,
    ) -> EventPage | None:
        """Events with ``after_id < id <= upto_id``, the position left alone (a range
        reader's); the page's ``start_id`` is the position. None when not registered."""
        self.guard.read(who)
        return await self._store.read_range(
            who.user_id,
            component,
            after_id,
            upto_id,
            types=types,
            max_bytes=max_bytes,
            data_as_text=data_as_text,
        )

    # -- what an operator sees ---------------------------------------------------------------

    async def listed(self, who: Principal) -> list[ConsumerRow]:
        """The consumers ``who`` is shown, with how far behind each is."""
        self.guard.read(who)
        return await self._store.consumers(self.guard.shown_to(who))

    async def first(self, who: Principal, limit: int) -> list[ConsumerRow]:
        """:meth:`listed`, the first ``limit`` (everyone's in one pass)."""
        self.guard.read(who)
        shown = self.guard.shown_to(who)
        if shown is None:
            return await self._store.consumer_lags(limit)
        return (await self._store.consumers(shown))[:limit]

    async def find(self, who: Principal, user: str, component: str) -> ConsumerRow | None:
        """The consumer of ``user``, when ``who`` may act on it."""
        users = self._lifecycle.users
        assert users is not None, "finding a consumer needs the users"
        owner = await users.get_user(user) if self.guard.acts_for(who, user) else None
        rows = await self._store.consumers(owner.id) if owner is not None else []
        return next((row for row in rows if row.component == component), None)

    async def lowest(self, who: Principal) -> tuple[str, UserId, str] | None:
        """(user, user id, component) of the consumer with the lowest position: the one
        that holds back discarding (who may be shown it is the door's)."""
        self.guard.read(who)
        return await self._store.lowest_consumer()
