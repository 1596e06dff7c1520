"""Kept AMQP link termini (AMQP 1.0 2.6.13 "Resuming Deliveries", 3.5.5 terminus
durability): what a suspended consumer link left for its successor, found again by the user,
the peer's container id and the link name, and the calls a store keeps them with for every
process on the database. Event ids only, never messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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


class KeptTermini(Protocol):
    """The kept termini of every process on the database. A row expires at a time of the
    database's clock: its timeout after its session or connection ended, or, while that
    lives, its timeout after a lease its process renews (so the termini of a process that
    died expire too). Each call is one transaction."""

    async def keep_termini(
        self, termini: Sequence[tuple[KeptTerminus, float]], per_user: int
    ) -> list[int | None]:
        """Keep each terminus (replacing the one kept under its key) until ``grace`` (the
        float) plus its timeout from now; beyond ``per_user`` of a user's, the oldest go;
        expired ones go too. The row of each (to :meth:`expire_termini`), None for one not
        kept (its user or partition is gone)."""

    async def take_terminus(self, key: TerminusKey) -> KeptTerminus | None:
        """The terminus kept under ``key``, no longer kept (another process cannot take it
        too); None when there is none, or it expired."""

    async def discard_termini(self, keys: Sequence[TerminusKey]) -> None:
        """Forget the termini kept under these keys."""

    async def expire_termini(self, rows: Sequence[int], grace: float) -> list[int]:
        """These rows expire ``grace`` plus their timeout from now; the rows still kept."""

    async def purge_termini(self) -> int:
        """Delete the expired termini; how many."""

    async def count_termini(self, user_id: UserId | None = None) -> int:
        """The termini kept (of one user, or of all) that have not expired."""
