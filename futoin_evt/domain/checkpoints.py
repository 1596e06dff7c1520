"""The Event Hubs checkpoint store's values, and the calls a store serves it with: who owns
each partition of a consumer group (a claim names the etag it read; the etag changes with each
claim) and the checkpoint each partition resumes from, per user, hub, consumer group and
partition id."""

from __future__ import annotations

from typing import NamedTuple, Protocol


class Ownership(NamedTuple):
    partition_id: str
    #: The owning processor ('' when it let the partition go).
    owner_id: str
    etag: str
    #: Seconds since the epoch (the SDK's ``last_modified_time``: a claim older than its
    #: ownership timeout has expired).
    modified_at: float


class Checkpoint(NamedTuple):
    partition_id: str
    offset: str | None
    sequence_number: int | None


class EventHubCheckpoints(Protocol):
    """The checkpoint store's calls, per user, hub (a stream), consumer group and partition."""

    async def list_ownership(self, user_id: int, hub: str, group: str) -> list[Ownership]: ...

    async def claim_ownership(
        self, user_id: int, hub: str, group: str, partition_id: str, owner_id: str, etag: str | None
    ) -> Ownership | None:
        """Claim (or release, with owner ''): granted when nobody held the partition yet, or
        when ``etag`` is still its etag; None when another claim came first."""

    async def list_checkpoints(self, user_id: int, hub: str, group: str) -> list[Checkpoint]: ...

    async def update_checkpoint(
        self, user_id: int, hub: str, group: str, checkpoint: Checkpoint
    ) -> None: ...
