"""The Event Hubs checkpoint store at ``$management``, for the client in
:mod:`futoin_evt.eventhubs`: ownership and checkpoints of the caller, per hub (a stream),
consumer group and partition.

A request names its call in ``type`` (``operation`` is ``READ``, as the SDK's management
client sends every request), the hub in ``name`` and the group in ``consumer-group``:

- ``futoin-evt:list-ownership`` answers a list of maps ``partition_id``, ``owner_id``,
  ``etag``, ``last_modified_time`` (seconds since the epoch, a double);
- ``futoin-evt:claim-ownership`` takes a list of maps ``partition_id``, ``owner_id``,
  ``etag`` (null for a partition never claimed) and answers the claims it granted;
- ``futoin-evt:list-checkpoints`` answers a list of maps ``partition_id``, ``offset``,
  ``sequence_number``;
- ``futoin-evt:update-checkpoint`` takes one such map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..domain.checkpoints import Checkpoint, Ownership
from ..domain.principal import Principal
from ..log.checkpoints import HubCheckpoints
from ..quoting import quote_input

PREFIX: Final = "futoin-evt:"
LIST_OWNERSHIP: Final = PREFIX + "list-ownership"
CLAIM_OWNERSHIP: Final = PREFIX + "claim-ownership"
LIST_CHECKPOINTS: Final = PREFIX + "list-checkpoints"
UPDATE_CHECKPOINT: Final = PREFIX + "update-checkpoint"
MAX_GROUP_CHARS: Final = 256
#: Owner ids, etags and offsets are short (a UUID, 32 hex digits, 20 digits).
MAX_TEXT_CHARS: Final = 256

Answer = tuple[int, str, Any]


class BadRequest(ValueError):
    pass


def _text(value: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS or (not value and not empty):
        raise BadRequest(
            f"{what} must be a string of {0 if empty else 1}-{MAX_TEXT_CHARS} characters"
        )
    return value


def _ownership(row: Ownership) -> dict[str, Any]:
    return {
        "partition_id": row.partition_id,
        "owner_id": row.owner_id,
        "etag": row.etag,
        "last_modified_time": row.modified_at,
    }


async def answer(
    store: HubCheckpoints,
    who: Principal,
    partitions: int,
    kind: str,
    properties: Mapping[str, Any],
    body: Any,
) -> Answer:
    """The answer to one checkpoint store request of ``who`` on a hub of ``partitions``."""
    group = properties.get("consumer-group")
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
        return 400, f"consumer-group must be a string of 1-{MAX_GROUP_CHARS} characters", None
    hub = str(properties.get("name"))
    ids = {str(number) for number in range(partitions)}

    def partition_of(entry: Any) -> str:
        partition = entry.get("partition_id") if isinstance(entry, Mapping) else None
        if partition not in ids:
            raise BadRequest(f"no such partition: {quote_input(partition, 40)}")
        return str(partition)

    try:
        if kind == LIST_OWNERSHIP:
            rows = await store.list_ownership(who, hub, group)
            return 200, "OK", [_ownership(row) for row in rows]
        if kind == LIST_CHECKPOINTS:
            checkpoints = await store.list_checkpoints(who, hub, group)
            return 200, "OK", [c._asdict() for c in checkpoints]
        if kind == CLAIM_OWNERSHIP:
            if not isinstance(body, Sequence) or len(body) > partitions:
                raise BadRequest(f"a claim is a list of at most {partitions} ownerships")
            claims = []
            for entry in body:
                partition = partition_of(entry)
                etag = entry.get("etag")
                claims.append(
                    (
                        partition,
                        _text(entry.get("owner_id"), "owner_id", empty=True),
                        None if etag is None else _text(etag, "etag"),
                    )
                )
            granted = []
            for partition, owner, etag in claims:
                row = await store.claim_ownership(who, hub, group, partition, owner, etag)
                if row is not None:
                    granted.append(_ownership(row))
            return 200, "OK", granted
        if kind == UPDATE_CHECKPOINT:
            partition = partition_of(body)
            offset = body.get("offset")
            sequence = body.get("sequence_number")
            if sequence is not None and (
                not isinstance(sequence, int) or isinstance(sequence, bool)
            ):
                raise BadRequest("sequence_number must be an integer")
            checkpoint = Checkpoint(
                partition,
                None if offset is None else _text(offset, "offset"),
                None if sequence is None else int(sequence),
            )
            await store.update_checkpoint(who, hub, group, checkpoint)
            return 200, "OK", None
    except BadRequest as exc:
        return 400, str(exc), None
    return 400, f"unsupported type: {quote_input(kind)}", None
