"""What both checkpoint stores send to the server's ``$management`` node and read back (the
calls are listed in :mod:`futoin_evt.amqp.checkpoints`), with no I/O.

Each store call is a generator that yields the :class:`Request` values it needs answered and
returns the call's result; the blocking store and the asyncio store only carry the requests
(:func:`drive` and its ``await`` twin), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

LIST_OWNERSHIP: Final = b"futoin-evt:list-ownership"
CLAIM_OWNERSHIP: Final = b"futoin-evt:claim-ownership"
LIST_CHECKPOINTS: Final = b"futoin-evt:list-checkpoints"
UPDATE_CHECKPOINT: Final = b"futoin-evt:update-checkpoint"

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One ``$management`` request: its type, the hub and consumer group, and its body."""

    kind: bytes
    hub: str
    group: str
    body: Any = None

    @property
    def application_properties(self) -> dict[str, Any]:
        return {"name": self.hub, "consumer-group": self.group}


#: A store call: yields requests, is sent each answer (as :func:`plain` gives it), returns.
Call = Generator[Request, Any, T]


def drive(call: Call[T], answer: Callable[[Request], Any]) -> T:
    """Run a store call, answering each of its requests with ``answer``."""
    try:
        request = next(call)
        while True:
            request = call.send(answer(request))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


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


def list_ownership(namespace: str, hub: str, group: str) -> Call[list[dict[str, Any]]]:
    rows = yield Request(LIST_OWNERSHIP, hub, group)
    return [{**scope(namespace, hub, group), **row} for row in rows or ()]


def claim_ownership(ownerships: Iterable[dict[str, Any]]) -> Call[list[dict[str, Any]]]:
    claimed: list[dict[str, Any]] = []
    for (namespace, hub, group), claims in by_group(ownerships).items():
        rows = yield Request(CLAIM_OWNERSHIP, hub, group, claims)
        claimed += [{**scope(namespace, hub, group), **row} for row in rows or ()]
    return claimed


def update_checkpoint(checkpoint: dict[str, Any]) -> Call[None]:
    hub, group = checkpoint["eventhub_name"], checkpoint["consumer_group"]
    yield Request(UPDATE_CHECKPOINT, hub, group, checkpoint_body(checkpoint))


def list_checkpoints(namespace: str, hub: str, group: str) -> Call[list[dict[str, Any]]]:
    rows = yield Request(LIST_CHECKPOINTS, hub, group)
    return [{**scope(namespace, hub, group), **row} for row in rows or ()]
