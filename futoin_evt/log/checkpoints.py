"""The Event Hubs checkpoint store as a door calls it: the ownership and checkpoints of the
acting user, per hub (a stream), consumer group and partition. Each call needs the read right
on the hub (:class:`~.access.AccessDenied` otherwise): a processor that may not read a hub
keeps no place in it."""

from __future__ import annotations

from ..domain.checkpoints import Checkpoint, Ownership
from ..domain.principal import Principal
from ..domain.rights import Right
from ..storage.base import EventHubCheckpoints
from .access import Access


class HubCheckpoints:
    """What a user's processors share of a hub's consumer group: each partition's owner and
    the checkpoint it resumes from (each user's are their own)."""

    def __init__(self, store: EventHubCheckpoints, access: Access) -> None:
        self._store = store
        self._access = access

    async def list_ownership(self, who: Principal, hub: str, group: str) -> list[Ownership]:
        self._access.check(who, Right.READ, hub)
        return await self._store.list_ownership(who.user_id, hub, group)

    async def claim_ownership(
        self,
        who: Principal,
        hub: str,
        group: str,
        partition_id: str,
        owner_id: str,
        etag: str | None,
    ) -> Ownership | None:
        """Claim (or release, with owner ''): granted when nobody held the partition yet, or
        when ``etag`` is still its etag; None when another claim came first."""
        self._access.check(who, Right.READ, hub)
        return await self._store.claim_ownership(
            who.user_id, hub, group, partition_id, owner_id, etag
        )

    async def list_checkpoints(self, who: Principal, hub: str, group: str) -> list[Checkpoint]:
        self._access.check(who, Right.READ, hub)
        return await self._store.list_checkpoints(who.user_id, hub, group)

    async def update_checkpoint(
        self, who: Principal, hub: str, group: str, checkpoint: Checkpoint
    ) -> None:
        self._access.check(who, Right.READ, hub)
        await self._store.update_checkpoint(who.user_id, hub, group, checkpoint)
