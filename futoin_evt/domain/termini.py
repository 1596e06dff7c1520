"""Kept AMQP link termini (AMQP 1.0 2.6.13 "Resuming Deliveries", 3.5.5 terminus
durability): what a suspended consumer link left for its successor, found again by the user,
the peer's container id and the link name. A store keeps them for every process on the
database (:class:`~futoin_evt.storage.base.KeptTermini`). Event ids only, never messages."""

from __future__ import annotations

from dataclasses import dataclass

from .stream import UserId


@dataclass(frozen=True, slots=True)
class TerminusKey:
    """Who may resume a terminus: the user, the peer's container id, the link name."""

    user: UserId
    container: str
    name: str


@dataclass(frozen=True, slots=True)
class KeptTerminus:
    """What a suspended link leaves for its successor."""

    key: TerminusKey
    #: The partition the link read (its key: the terminus goes with the partition).
    partition_key: int
    #: The consumer group of the link's address, or None.
    group: str | None
    #: 1: the position alone; 2: the unsettled deliveries too.
    durable: int
    #: Ids of events sent and not settled, ascending (durable 2).
    unsettled: tuple[int, ...]
    #: More were unsettled than kept.
    incomplete: bool
    #: The successor sends the events after this id.
    after: int
    #: Ids holding a consumer group's position back (sent, not accepted or rejected).
    held: tuple[int, ...] = ()
    #: The consumer group's position the former link had stored.
    acked: int = 0
    #: The seconds it is kept once its session or connection ended (as its policy says).
    timeout: float = 0.0
