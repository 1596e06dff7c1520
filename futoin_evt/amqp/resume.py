"""The kept termini of suspended consumer links (AMQP 1.0 2.6.13 "Resuming Deliveries", 3.5.5
terminus durability): what a link of the event log node sent and the peer had not settled, as
event ids, found again by the user, the peer's container id and the link name.

A terminus is kept from the link's suspension until its expiry (the end of its session or
connection, as its expiry policy says, and then its timeout), within bounds: so many per
user (the oldest goes first), so many ids per terminus. Timed with the event loop's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..domain.stream import UserId

#: Termini kept per user at once; a newer one evicts the oldest.
MAX_TERMINI_PER_USER: Final = 64
#: Event ids kept per terminus; a link that had more keeps the oldest (incomplete-unsettled).
MAX_UNSETTLED: Final = 10_000
#: The longest timeout granted, in seconds.
MAX_TIMEOUT: Final = 300


@dataclass(frozen=True, slots=True)
class TerminusKey:
    """Who may resume a terminus: the user, the peer's container id, the link name."""

    user: UserId
    container: str
    name: str


@dataclass(slots=True)
class KeptTerminus:
    """What a suspended link leaves for its successor."""

    key: TerminusKey
    #: The stream and the consumer group (or none) of the link, and its partition.
    address: tuple[str, str | None]
    partition: int
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
    #: Loop time it expires at, once its timeout runs.
    expires: float | None = None
    #: Stops waiting for the end of its session or connection.
    cancel_wait: Callable[[], None] | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Termini:
    """The kept termini of one node: :meth:`keep` on suspension, :meth:`take` on re-attach."""

    def __init__(
        self,
        *,
        per_user: int = MAX_TERMINI_PER_USER,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: the loop's when None (and expiries are timed on the loop); a test's own
        clock otherwise (expired termini are then dropped as they are looked at)."""
        self._per_user = per_user
        self._clock = clock
        self._kept: dict[TerminusKey, KeptTerminus] = {}
        #: Each user's keys, oldest first.
        self._by_user: dict[UserId, dict[TerminusKey, None]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def keep(self, kept: KeptTerminus) -> None:
        """Keep ``kept`` (a terminus kept under its key before is replaced)."""
        self.discard(kept.key)
        self._kept[kept.key] = kept
        users = self._by_user.setdefault(kept.key.user, {})
        users[kept.key] = None
        while len(users) > self._per_user:
            self.discard(next(iter(users)))

    def expire_later(self, kept: KeptTerminus) -> None:
        """Its session or connection ended: it is kept for its timeout from now on."""
        if self._kept.get(kept.key) is not kept or kept.expires is not None:
            return
        kept.cancel_wait = None
        kept.expires = self._now() + kept.timeout
        if self._clock is None:
            loop = asyncio.get_running_loop()
            kept.timer = loop.call_at(kept.expires, lambda: self._expired(kept))

    def _expired(self, kept: KeptTerminus) -> None:
        if self._kept.get(kept.key) is kept:
            self.discard(kept.key)

    def take(
        self, key: TerminusKey, address: tuple[str, str | None], partition: int
    ) -> KeptTerminus | None:
        """The terminus kept under ``key`` for that address and partition, no longer kept;
        None when there is none (one kept for another address is dropped)."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        self.discard(key)
        if kept.expires is not None and kept.expires <= self._now():
            return None
        if kept.address != address or kept.partition != partition:
            return None
        return kept

    def discard(self, key: TerminusKey) -> None:
        kept = self._kept.pop(key, None)
        if kept is None:
            return
        users = self._by_user.get(key.user)
        if users is not None:
            users.pop(key, None)
            if not users:
                del self._by_user[key.user]
        if kept.cancel_wait is not None:
            kept.cancel_wait()
            kept.cancel_wait = None
        if kept.timer is not None:
            kept.timer.cancel()
            kept.timer = None
