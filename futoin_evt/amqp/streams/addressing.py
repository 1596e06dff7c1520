"""What an attach to an event log node names, checked: the stream, consumer group and
partition of its address (:func:`parse_address`), the partition its link properties ask for,
the start its source filters give; and the AMQP error conditions the node's links use."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...log.eventlog import EventLog
from ...quoting import quote_input
from ..codec import (
    DELIVERY_ANNOTATIONS_FILTER,
    SELECTOR_FILTER,
    SQL_FILTER,
    BadFilter,
    Position,
    delivery_annotations_start,
    described_filter,
    filter_kind,
)
from ..engine.conditions import (
    INVALID_FIELD,
    NOT_FOUND,
)
from ..engine.session import Link
from ..engine.types import Symbol
from ..filters import compile_filter
from ..links import PARTITION_PROPERTY
from ..table import Hubs, LinkRefused, address_path

NODE: Final = "events"
INFO: Final = "$info"
PARTITION: Final = "0"
GROUP_PROPERTY: Final = Symbol("event-streams-consumer-group")
EPOCH_PROPERTY: Final = Symbol("event-streams-epoch")
#: Event Hubs' epoch (the SDK's ``owner_level``; 0 with a checkpoint store).
OWNER_LEVEL_PROPERTY: Final = Symbol("com.microsoft:epoch")
#: A consumer group named ``ftn18:<component>`` keeps its position as the user's registered
#: FTN18 consumer ``<component>`` (registered on attach if need be).
FTN18_GROUP_PREFIX: Final = "ftn18:"
MAX_GROUP_CHARS: Final = 256
#: Event Hubs' default consumer group: in an address, the same as no group.
DEFAULT_GROUP: Final = "$Default"


def key_partition(key: str, count: int) -> int:
    """The partition of a partition key: CRC-32 (IEEE 802.3, as zlib's) of its UTF-8 bytes,
    modulo the partition count. The same key, the same partition while the count stays."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % count


@dataclass(frozen=True, slots=True)
class Address:
    """What an address names: a stream, its partitions' logs, and perhaps a consumer group,
    a partition, or the ``$info`` source."""

    hub: str
    logs: Sequence[EventLog]
    group: str | None = None
    partition: int | None = None
    info: bool = False


def parse_address(hubs: Hubs, address: str | None) -> Address:
    """``NAME``, ``NAME/$info``, ``NAME/Partitions/P``, ``NAME/ConsumerGroups/G`` and
    ``NAME/ConsumerGroups/G/Partitions/P`` (Event Hubs' forms; its default group
    ``$Default`` is no group), also as the path of a URI (``amqps://host:port/NAME``, as
    Event Hubs clients give it). Raises :class:`LinkRefused` for any other address."""
    parts = address_path(address or "").split("/")
    logs = hubs.partitions(parts[0])
    if logs is None or len(parts) > 5:
        raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
    hub = parts[0]
    if parts[1:] == [INFO]:
        return Address(hub, logs, info=True)
    group = None
    if len(parts) >= 3 and parts[1] == "ConsumerGroups" and parts[2]:
        group = None if parts[2] == DEFAULT_GROUP else parts[2]
        parts = [parts[0], *parts[3:]]
    if len(parts) == 1:
        return Address(hub, logs, group)
    if len(parts) != 3 or parts[1] != "Partitions":
        raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
    number = partition_number(parts[2], len(logs))
    if number is None:
        raise LinkRefused(NOT_FOUND, _no_partition(parts[2], len(logs)))
    return Address(hub, logs, group, number)


def partition_number(text: str, count: int) -> int | None:
    """The partition a partition id names (``"0".."count-1"``, in canonical form)."""
    if not text.isdigit() or not text.isascii() or (text != "0" and text.startswith("0")):
        return None
    number = int(text)
    return number if number < count else None


def _no_partition(text: Any, count: int) -> str:
    return f"no such partition: {quote_input(text, 40)} (the partitions are '0'..'{count - 1}')"


def requested_partition(properties: Mapping[Any, Any], parsed: Address) -> int | None:
    """The partition the address or the ``event-streams-partition`` link property names
    (both: the same), or None."""
    requested = properties.get(PARTITION_PROPERTY)
    if requested is None:
        return parsed.partition
    if not isinstance(requested, str):
        raise LinkRefused(INVALID_FIELD, "event-streams-partition must be a symbol")
    number = partition_number(requested, len(parsed.logs))
    if number is None:
        raise LinkRefused(NOT_FOUND, _no_partition(requested, len(parsed.logs)))
    if parsed.partition is not None and number != parsed.partition:
        raise LinkRefused(
            INVALID_FIELD,
            f"event-streams-partition {requested} is not the partition of the address"
            f" ({parsed.partition})",
        )
    return number


def link_properties(link: Link) -> Mapping[Any, Any]:
    properties = link.remote_properties
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise LinkRefused(INVALID_FIELD, "link properties must be a map")
    return properties


def start_position(link: Link, head: int) -> Position | None:
    """The consumer's start from its source filters; None without a filter."""
    filters = _filter_set(link)
    if not filters:
        return None
    if not isinstance(filters, Mapping):
        raise LinkRefused(INVALID_FIELD, "the source filter must be a map")
    position: Position | None = None
    try:
        for value in filters.values():
            descriptor, argument = described_filter(value)
            kind = filter_kind(descriptor)
            if kind == DELIVERY_ANNOTATIONS_FILTER:
                this = delivery_annotations_start(argument, head=head)
            elif kind in (SQL_FILTER, SELECTOR_FILTER):
                if not isinstance(argument, str):
                    raise BadFilter("an SQL or selector filter is a string")
                this = compile_filter(argument, head=head)
            else:
                raise BadFilter(f"filter not supported: {quote_input(descriptor, 60)}")
            position = this if position is None else position.both(this)
    except BadFilter as exc:
        raise LinkRefused(INVALID_FIELD, str(exc)) from None
    return position


def _filter_set(link: Link) -> Any:
    source = link.remote_source
    return source.filter if source is not None else None
