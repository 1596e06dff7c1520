"""The Event Hubs checkpoint store's values: who owns each partition of a consumer group (a
claim names the etag it read; the etag changes with each claim) and the checkpoint each
partition resumes from, per user, hub, consumer group and partition id. A store keeps them
as :class:`~futoin_evt.storage.base.EventHubCheckpoints`."""

from __future__ import annotations

from typing import NamedTuple


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
