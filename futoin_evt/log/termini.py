"""The kept termini of suspended AMQP consumer links (:mod:`futoin_evt.domain.termini`) as the
AMQP door keeps them: in the database every process shares, so a link resumes on any worker.

No call takes an acting user: the termini are written in rounds that span users and links
that already ended, and each terminus's key names its user, the peer's container and the
link, so a link finds only what a link of its own user left under its name. The right to
read the stream is checked when the link attaches, before a terminus is taken."""

from __future__ import annotations

from collections.abc import Sequence

from ..domain.stream import UserId
from ..domain.termini import KeptTerminus, TerminusKey
from ..storage.base import KeptTermini


class LinkTermini:
    """:class:`~futoin_evt.storage.base.KeptTermini`'s calls (each one transaction)."""

    def __init__(self, store: KeptTermini) -> None:
        self._store = store

    async def keep_termini(
        self, termini: Sequence[tuple[KeptTerminus, float]], per_user: int
    ) -> list[int | None]:
        """Keep each terminus for its lease (the float) plus its timeout; the row of each,
        None for one not kept (its user or partition is gone)."""
        return await self._store.keep_termini(termini, per_user)

    async def take_terminus(self, key: TerminusKey) -> KeptTerminus | None:
        """The terminus kept under ``key``, no longer kept; None when there is none."""
        return await self._store.take_terminus(key)

    async def discard_termini(self, keys: Sequence[TerminusKey]) -> None:
        await self._store.discard_termini(keys)

    async def expire_termini(self, rows: Sequence[int], grace: float) -> list[int]:
        """These rows expire ``grace`` plus their timeout from now; the rows still kept."""
        return await self._store.expire_termini(rows, grace)

    async def count_termini(self, user_id: UserId | None = None) -> int:
        """The termini kept (of one user, or of all) that have not expired."""
        return await self._store.count_termini(user_id)
