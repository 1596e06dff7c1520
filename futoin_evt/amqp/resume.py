"""The kept termini of suspended consumer links (AMQP 1.0 2.6.13 "Resuming Deliveries", 3.5.5
terminus durability), in the database every process shares
(:class:`~futoin_evt.log.termini.LinkTermini`), so a link resumes on any worker, on any
process on a PostgreSQL database, and after a restart.

A terminus is written once, when its link is suspended (never per delivery), and kept until
it expires: its timeout after the end of its session or connection (as its expiry policy
says). While that session lives, its row expires its timeout after a lease this process
renews (:data:`LEASE_SECONDS`), so the termini of a process that dies expire all the same, at
most the lease later. Within bounds: so many per user (the oldest goes first), so many ids
per terminus.

This process's writes go one round at a time, in order, each in one transaction (what is
kept on one loop turn, a dropped connection's links say, goes in one); a take here waits for
the writes of its key on their way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..domain.stream import UserId
from ..domain.termini import KeptTerminus, TerminusKey
from ..log.termini import LinkTermini

__all__ = [
    "LEASE_SECONDS",
    "MAX_TERMINI_PER_USER",
    "MAX_TIMEOUT",
    "MAX_UNSETTLED",
    "Kept",
    "KeptTerminus",
    "Termini",
    "TerminusKey",
]

logger = logging.getLogger(__name__)

#: Termini kept per user at once; a newer one evicts the oldest.
MAX_TERMINI_PER_USER: Final = 64
#: Event ids kept per terminus; a link that had more keeps the oldest (incomplete-unsettled).
MAX_UNSETTLED: Final = 10_000
#: The longest timeout granted, in seconds.
MAX_TIMEOUT: Final = 300
#: While its session lives, a terminus is kept its timeout after this lease, which its
#: process renews every third of it.
LEASE_SECONDS: Final = 30.0


@dataclass(eq=False, slots=True)
class Kept:
    """A terminus this process kept: its row once written, and whether its session (or
    connection) still lives."""

    terminus: KeptTerminus
    #: The row written (None before, or when it was not kept).
    row: int | None = None
    #: Its session or connection ended: it expires its timeout from then.
    ended: bool = False
    #: Stops waiting for the end of its session or connection.
    cancel_wait: Callable[[], None] | None = field(default=None, repr=False)

    def forget(self) -> None:
        if self.cancel_wait is not None:
            self.cancel_wait()
            self.cancel_wait = None


class Termini:
    """The kept termini: :meth:`keep` on suspension, :meth:`expire_later` when its session
    or connection ends, :meth:`take` on re-attach."""

    def __init__(
        self,
        store: LinkTermini,
        *,
        per_user: int = MAX_TERMINI_PER_USER,
        lease: float = LEASE_SECONDS,
    ) -> None:
        self._store = store
        self._per_user = per_user
        self._lease = lease
        #: Waiting for the next round: to keep, to expire, to forget.
        self._keeping: list[Kept] = []
        self._ending: list[Kept] = []
        self._forgetting: list[TerminusKey] = []
        #: The round that writes each key, while on its way.
        self._writes: dict[TerminusKey, asyncio.Future[None]] = {}
        #: The termini kept here whose session lives, by key (their leases are renewed).
        self._mine: dict[TerminusKey, Kept] = {}
        #: The round that takes what is kept now, and the newest round (rounds go in turn).
        self._round: asyncio.Future[None] | None = None
        self._last: asyncio.Future[None] | None = None
        self._turn = asyncio.Lock()
        self._renewing: asyncio.Task[None] | None = None

    def keep(self, terminus: KeptTerminus) -> tuple[Kept, asyncio.Future[None]]:
        """Keep ``terminus`` (replacing one kept under its key); the handle for
        :meth:`expire_later`, and the write's future (done when stored, or failed)."""
        older = self._mine.pop(terminus.key, None)
        if older is not None:
            older.forget()
        kept = Kept(terminus)
        self._mine[terminus.key] = kept
        self._keeping.append(kept)
        return kept, self._schedule([terminus.key])

    def expire_later(self, kept: Kept) -> None:
        """Its session or connection ended: it is kept for its timeout from now on."""
        if kept.ended:
            return
        kept.ended = True
        kept.cancel_wait = None
        if self._mine.get(kept.terminus.key) is kept:
            del self._mine[kept.terminus.key]
        if kept.row is not None:  # written with a lease: its expiry is written now
            self._ending.append(kept)
            self._schedule([kept.terminus.key])

    async def take(
        self, key: TerminusKey, partition_key: int, group: str | None
    ) -> KeptTerminus | None:
        """The terminus kept under ``key`` for that partition and consumer group, no longer
        kept; None when there is none (one kept for another address is dropped)."""
        self._stop_waiting(key)
        writing = self._writes.get(key)
        if writing is not None:
            await asyncio.wait([writing])
        found = await self._store.take_terminus(key)
        if found is None or found.partition_key != partition_key or found.group != group:
            return None
        return found

    def discard(self, key: TerminusKey) -> None:
        """Forget the terminus kept under ``key``, if any (written on the next round)."""
        self._stop_waiting(key)
        self._keeping = [kept for kept in self._keeping if kept.terminus.key != key]
        self._forgetting.append(key)
        self._schedule([key])

    def restore(self, terminus: KeptTerminus) -> None:
        """Keep again a terminus taken for a link that went before it was answered."""
        kept, _written = self.keep(terminus)
        self.expire_later(kept)

    async def count(self, user_id: UserId | None = None) -> int:
        """The termini kept (of one user, or of all), once the writes on their way here are
        done."""
        await self._written()
        return await self._store.count_termini(user_id)

    async def close(self) -> None:
        """Write what is on its way; stop renewing."""
        await self._written()
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing

    async def _written(self) -> None:
        while self._last is not None and not self._last.done():
            await asyncio.wait([self._last])

    def _stop_waiting(self, key: TerminusKey) -> None:
        mine = self._mine.pop(key, None)
        if mine is not None:
            mine.forget()

    def _schedule(self, keys: list[TerminusKey]) -> asyncio.Future[None]:
        if self._round is None:
            self._round = self._last = asyncio.ensure_future(self._write_round())
        written = self._round
        for key in keys:
            self._writes[key] = written
        return written

    async def _write_round(self) -> None:
        """Write what waits: the keys forgotten, the termini kept (each with its lease, or
        expiring from now when its session already ended), the expiries."""
        async with self._turn:
            this, self._round = self._round, None
            forgetting, self._forgetting = self._forgetting, []
            keeping, self._keeping = self._keeping, []
            ending, self._ending = self._ending, []
            try:
                await self._write(forgetting, keeping, ending)
            except Exception as exc:  # kept no longer: the successor starts afresh
                logger.warning("writing kept link termini failed: %s", exc)
            finally:
                for key, writing in list(self._writes.items()):
                    if writing is this:
                        del self._writes[key]

    async def _write(
        self, forgetting: list[TerminusKey], keeping: list[Kept], ending: list[Kept]
    ) -> None:
        store = self._store
        if forgetting:
            await store.discard_termini(forgetting)
        if keeping:
            leases = [0.0 if kept.ended else self._lease for kept in keeping]
            rows = await store.keep_termini(
                [(kept.terminus, lease) for kept, lease in zip(keeping, leases, strict=True)],
                self._per_user,
            )
            for kept, lease, row in zip(keeping, leases, rows, strict=True):
                kept.row = row
                if row is None:  # its user or partition is gone
                    self._forget_kept(kept)
                elif lease and kept.ended:  # its session ended while it was written
                    self._ending.append(kept)
                    self._schedule([kept.terminus.key])
            if any(kept.row is not None for kept in self._mine.values()):
                self._renew_later()
        if ending:
            await store.expire_termini([k.row for k in ending if k.row is not None], 0.0)

    def _forget_kept(self, kept: Kept) -> None:
        if self._mine.get(kept.terminus.key) is kept:
            del self._mine[kept.terminus.key]
        kept.forget()

    def _renew_later(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        """Renew the leases of the termini kept here whose session lives, while there are
        any; one whose row went (taken, replaced or evicted elsewhere) is forgotten."""
        while any(k.row is not None for k in self._mine.values()):
            await asyncio.sleep(self._lease / 3)
            async with self._turn:
                live = {k.row: k for k in self._mine.values() if k.row is not None}
                try:
                    still = set(await self._store.expire_termini(list(live), self._lease))
                except Exception as exc:  # the next round tries again
                    logger.warning("renewing kept link termini failed: %s", exc)
                    continue
                for row, kept in live.items():
                    if row not in still:
                        self._forget_kept(kept)
