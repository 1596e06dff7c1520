"""What both checkpoint stores send to the server's ``$management`` node and read back (the
calls are listed in :mod:`futoin_evt.amqp.checkpoints`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

LIST_OWNERSHIP: Final = b"futoin-evt:list-ownership"
CLAIM_OWNERSHIP: Final = b"futoin-evt:claim-ownership"
LIST_CHECKPOINTS: Final = b"futoin-evt:list-checkpoints"
UPDATE_CHECKPOINT: Final = b"futoin-evt:update-checkpoint"


def plain(value: Any) -> Any:
    """An answer as the SDK's AMQP decoder gives it (strings as bytes), with str."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def scope(namespace: str, hub: str, group: str) -> dict[str, str]:
    """The keys the SDK gives every ownership and checkpoint."""
    return {"fully_qualified_namespace": namespace, "eventhub_name": hub, "consumer_group": group}


def properties(hub: str, group: str) -> dict[str, Any]:
    return {"name": hub, "consumer-group": group}


def by_group(ownerships: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], list[Any]]:
    """Claims grouped by namespace, hub and consumer group, each as the server takes it."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for ownership in ownerships:
        key = (
            ownership["fully_qualified_namespace"],
            ownership["eventhub_name"],
            ownership["consumer_group"],
        )
        groups.setdefault(key, []).append(
            {
                "partition_id": ownership["partition_id"],
                "owner_id": ownership.get("owner_id") or "",
                "etag": ownership.get("etag"),
            }
        )
    return groups


def checkpoint_body(checkpoint: dict[str, Any]) -> dict[str, Any]:
    offset = checkpoint.get("offset")
    sequence = checkpoint.get("sequence_number")
    return {
        "partition_id": checkpoint["partition_id"],
        "offset": None if offset is None else str(offset),
        "sequence_number": None if sequence is None else int(sequence),
    }
