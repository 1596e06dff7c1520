"""Parsing DCB requests into the values of :mod:`futoin_evt.domain.dcb`. No I/O.

Two request forms map onto one model. The current one (``{"items": [{"types", "tags"}]}``
and ``{"failIfEventsMatch", "after"}``), which eventsourcing's ``eventsourcing.dcb`` and UmaDB
speak, and the first draft's (``{"version": "1.0", "criteria": [...]}`` and
``expectedHighestSequenceNumber``). In the draft, a criterion's tag without ``:value`` matches
every value of that key: :attr:`QueryItem.tag_keys`.

Every parse error is a :class:`DcbInputError` that names the field, so each door can answer
"400, field X: why" without knowing the rules.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Final

from ..domain.dcb import (
    MATCH_ALL,
    MAX_EVENTS_PER_APPEND,
    MAX_ITEM_VALUES,
    MAX_QUERY_ITEMS,
    AppendCondition,
    DcbInputError,
    NewEvent,
    Query,
    QueryItem,
    check_tags,
    check_type,
    list_of,
    new_event,
)
from ..quoting import quote_input

DRAFT_VERSION: Final = "1.0"
_EVENT_FIELDS: Final = frozenset({"type", "data", "tags", "id", "bytes"})
_QUERY_FIELDS: Final = frozenset({"items"})
_ITEM_FIELDS: Final = frozenset({"types", "tags"})
_CONDITION_FIELDS: Final = frozenset({"failIfEventsMatch", "after"})
_NONE: Final[frozenset[str]] = frozenset()
# -- parsing requests ---------------------------------------------------------------------------


def parse_events(value: Any, field: str = "events") -> list[NewEvent]:
    """A JSON list of ``{"type", "data", "tags"?, "id"?}``; at least one."""
    if not isinstance(value, list) or not value:
        raise DcbInputError(field, "a non-empty list of events is needed")
    if len(value) > MAX_EVENTS_PER_APPEND:
        raise DcbInputError(field, f"at most {MAX_EVENTS_PER_APPEND} events per append")
    events = []
    for index, raw in enumerate(value):
        try:
            if not isinstance(raw, dict):
                raise DcbInputError("", "an event is an object")
            if not raw.keys() <= _EVENT_FIELDS:
                unknown = raw.keys() - _EVENT_FIELDS
                raise DcbInputError(sorted(unknown)[0], "unknown field")
            if "type" not in raw:
                raise DcbInputError("type", "missing")
            data = raw.get("data")
            if raw.get("bytes", False) is not False:
                data = _base64_data(raw.get("bytes"), data, "data")
            events.append(new_event(raw["type"], data, raw.get("tags", []), raw.get("id")))
        except DcbInputError as exc:
            raise _inside(f"{field}[{index}]", exc) from None
    if len(events) > 1:
        ids = [e.id for e in events if e.id is not None]
        if len(ids) != len(set(ids)):
            raise DcbInputError(field, "the same event id twice in one append")
    return events


def _inside(where: str, exc: DcbInputError) -> DcbInputError:
    """The error of a part (its field relative to the part, "" for the part itself), named
    from ``where`` on: built only when there is an error."""
    return DcbInputError(f"{where}.{exc.field}" if exc.field else where, exc.message)


def _base64_data(flag: Any, data: Any, field: str) -> bytes:
    """``"bytes": true`` carries opaque bytes as base64 text in ``data``."""
    if flag is not True or not isinstance(data, str):
        raise DcbInputError(field, 'with "bytes": true, data is a base64 string')
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error:
        raise DcbInputError(field, "not base64") from None


def parse_query(value: Any, field: str = "query") -> Query:
    """``{"items": [...]}``, the draft's ``{"version": "1.0", "criteria": [...]}``, or None."""
    if value is None:
        return MATCH_ALL
    if not isinstance(value, dict):
        raise DcbInputError(field, "a query is an object")
    if "criteria" in value:
        return _parse_draft_query(value, field)
    if not value.keys() <= _QUERY_FIELDS:
        unknown = value.keys() - _QUERY_FIELDS
        raise DcbInputError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    items = list_of(value.get("items", []), f"{field}.items", MAX_QUERY_ITEMS)
    parsed = []
    for index, raw in enumerate(items):
        try:
            if not isinstance(raw, dict):
                raise DcbInputError("", "a query item is an object")
            if not raw.keys() <= _ITEM_FIELDS:
                unknown = raw.keys() - _ITEM_FIELDS
                raise DcbInputError(sorted(unknown)[0], "unknown field")
            types = frozenset(_types(raw["types"], "types")) if "types" in raw else _NONE
            tags = check_tags(raw.get("tags", []), "tags", allow_empty=True)
        except DcbInputError as exc:
            raise _inside(f"{field}.items[{index}]", exc) from None
        parsed.append(QueryItem(types, frozenset(tags) if tags else _NONE))
    return Query(tuple(parsed))


def _parse_draft_query(value: Mapping[str, Any], field: str) -> Query:
    if value.get("version", DRAFT_VERSION) != DRAFT_VERSION:
        raise DcbInputError(f"{field}.version", f"only version {DRAFT_VERSION} is known")
    unknown = value.keys() - {"version", "criteria"}
    if unknown:
        raise DcbInputError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    criteria = list_of(value["criteria"], f"{field}.criteria", MAX_QUERY_ITEMS)
    items = []
    for index, raw in enumerate(criteria):
        where = f"{field}.criteria[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("properties"), dict):
            raise DcbInputError(where, 'a criterion is {"type": ..., "properties": {...}}')
        kind, properties = raw.get("type"), raw["properties"]
        types: list[str] = []
        tags: tuple[str, ...] = ()
        if kind in ("EventTypes", "EventTypesAndTags"):
            types = _types(properties.get("event_types"), f"{where}.properties.event_types")
            if not types:
                raise DcbInputError(f"{where}.properties.event_types", "at least one type")
        if kind in ("Tags", "EventTypesAndTags"):
            tags = check_tags(properties.get("tags"), f"{where}.properties.tags")
        if kind not in ("EventTypes", "Tags", "EventTypesAndTags"):
            raise DcbInputError(f"{where}.type", f"unknown criterion type {quote_input(kind)}")
        items.append(
            QueryItem(
                types=frozenset(types),
                tags=frozenset(t for t in tags if ":" in t),
                tag_keys=frozenset(t for t in tags if ":" not in t),
            )
        )
    return Query(tuple(items))


def parse_condition(value: Any, field: str = "condition") -> AppendCondition | None:
    """``{"failIfEventsMatch": QUERY, "after": N?}``, or the draft's ``{"query": QUERY,
    "expectedHighestSequenceNumber": N | "NONE" | "ANY"}``; None: no condition."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DcbInputError(field, "a condition is an object")
    if "expectedHighestSequenceNumber" in value:
        unknown = value.keys() - {"query", "expectedHighestSequenceNumber"}
        if unknown:
            raise DcbInputError(f"{field}.{sorted(unknown)[0]}", "unknown field")
        expected = value["expectedHighestSequenceNumber"]
        query = parse_query(value.get("query"), f"{field}.query")
        if expected == "ANY":
            return None
        if expected == "NONE":
            return AppendCondition(query, None)
        return AppendCondition(query, position(expected, f"{field}.expectedHighestSequenceNumber"))
    if not value.keys() <= _CONDITION_FIELDS:
        unknown = value.keys() - _CONDITION_FIELDS
        raise DcbInputError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    if "failIfEventsMatch" not in value:
        raise DcbInputError(f"{field}.failIfEventsMatch", "missing")
    query = parse_query(value["failIfEventsMatch"], f"{field}.failIfEventsMatch")
    after = value.get("after")
    return AppendCondition(query, None if after is None else position(after, f"{field}.after"))


def position(value: Any, field: str) -> int:
    """A position: an integer from 0 (before the first event) up."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise DcbInputError(field, f"{quote_input(value)} is not a position (an integer from 0)")
    return value


def limit_value(value: Any, field: str = "limit") -> int | None:
    if value is None:
        return None
    return position(value, field)


def _types(value: Any, field: str) -> list[str]:
    types = list_of(value, field, MAX_ITEM_VALUES)
    for index, event_type in enumerate(types):
        check_type(event_type, f"{field}[{index}]")
    return types
