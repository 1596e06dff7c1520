"""SQL for DCB queries, shared by the backends (only the placeholder differs). No I/O.

A query becomes the set of matching event ids: one ``SELECT`` per query item, joined by
``UNION``. An item with tags is driven by the ``event_tags`` index on its first tag (or tag
key), so it costs what matches that tag, not the size of the log; an item with types only
uses the ``(type, id)`` index of ``events``. A query that matches everything has no set.

Nothing from a request is put into the SQL text: every value is a parameter.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any, Final

from ...domain.dcb import (
    AppendCondition,
    AppendConditionFailed,
    BlindAppend,
    EventIdConflict,
    EventIdTaken,
    NewEvent,
    Query,
    QueryItem,
    SequencedEvent,
)
from ...ftn3.messages import encode_json
from ..checksums import check_event
from ..tables import DEFAULT_TABLES, Tables

#: Columns of a DCB read, in order: id, type, data, ts, client id, tags (JSON), is_bytes,
#: and what checks the event: its content type, attributes (a DCB event has none) and
#: checksum.
READ_COLUMNS: Final = (
    "e.id, e.type, e.data, e.ts, d.client_id, d.tags, d.is_bytes, e.content_type, e.attrs,"
    " e.checksum"
)
#: How many they are.
READ_WIDTH: Final = READ_COLUMNS.count(",") + 1
#: FTN18 EventType (``^[A-Z_]{1,16}$``) in SQLite: its consumers see only such events.
SQLITE_FTN18_TYPE: Final = "(length(type) BETWEEN 1 AND 16 AND type NOT GLOB '*[^A-Z_]*')"
PG_FTN18_TYPE: Final = """(type COLLATE "C" ~ '^[A-Z_]{1,16}$')"""
#: A row's tags as the store writes them (compact JSON, each tag by the tag rule, so without
#: a quote, comma or escape): read by splitting, and spliced into an answer as they are.
_PLAIN_TAGS: Final = re.compile(r'\[(?:"[\w:\-]+"(?:,"[\w:\-]+")*)?\]', re.ASCII)


def _key_range(key: str) -> list[Any]:
    """A bare ``key`` tag, or any ``key:value`` (``:`` is just below ``;``)."""
    return [key, key + ":", key + ";"]


def _in(values: Sequence[Any], mark: str) -> str:
    return ",".join([mark] * len(values))


def _item_sql(
    item: QueryItem, bound: str, bound_value: object, mark: str, tables: Tables
) -> tuple[str, list[Any]]:
    params: list[Any] = []
    tags_table = tables.event_tags
    tags = sorted(item.tags)
    keys = sorted(item.tag_keys)
    if tags or keys:
        if tags:
            ref = "t.event_id"
            sql = f"SELECT t.event_id AS id FROM {tags_table} t WHERE t.tag = {mark}"
            sql += f" AND t.event_id {bound} {mark}"
            params += [tags[0], bound_value]
            rest_tags, rest_keys = tags[1:], keys
        else:
            # two index ranges: the bare key, and every key:value
            ref = "t.id"
            sql = (
                f"SELECT t.id AS id FROM (SELECT event_id AS id FROM {tags_table}"
                f" WHERE tag = {mark} AND event_id {bound} {mark}"
                f" UNION SELECT event_id FROM {tags_table}"
                f" WHERE tag > {mark} AND tag < {mark} AND event_id {bound} {mark})"
                " AS t WHERE 1 = 1"
            )
            key, low, high = _key_range(keys[0])
            params += [key, bound_value, low, high, bound_value]
            rest_tags, rest_keys = [], keys[1:]
        for tag in rest_tags:
            sql += (
                f" AND EXISTS (SELECT 1 FROM {tags_table} o"
                f" WHERE o.tag = {mark} AND o.event_id = {ref})"
            )
            params.append(tag)
        for key in rest_keys:
            sql += (
                f" AND EXISTS (SELECT 1 FROM {tags_table} o WHERE o.event_id = {ref}"
                f" AND (o.tag = {mark} OR (o.tag > {mark} AND o.tag < {mark})))"
            )
            params.extend(_key_range(key))
        if item.types:
            types = sorted(item.types)
            sql += (
                f" AND EXISTS (SELECT 1 FROM {tables.events} x WHERE x.id = {ref}"
                f" AND x.type IN ({_in(types, mark)}))"
            )
            params.extend(types)
        return sql, params
    types = sorted(item.types)
    sql = f"SELECT id FROM {tables.events} WHERE type IN ({_in(types, mark)}) AND id {bound} {mark}"
    return sql, [*types, bound_value]


def matching_ids(
    query: Query, bound: str, bound_value: int, mark: str = "?", tables: Tables = DEFAULT_TABLES
) -> tuple[str, list[Any]] | None:
    """``SELECT id ...`` of the events matching ``query`` with ``id <bound> bound_value``
    (``bound`` is ``>`` or ``<``); None when the query matches every event."""
    template = _matching_template(query, bound, mark, tables)
    if template is None:
        return None
    sql, params = template
    return sql, [bound_value if p is _BOUND else p for p in params]


#: Where the bound's value goes in the parameters of a query's SQL made once.
_BOUND: Final = object()


@functools.lru_cache(maxsize=1024)
def _matching_template(
    query: Query, bound: str, mark: str, tables: Tables
) -> tuple[str, tuple[Any, ...]] | None:
    """:func:`matching_ids` with :data:`_BOUND` for the bound's value, made once per query
    (a client asks the same queries again and again: a condition on its own tags)."""
    if query.matches_all:
        return None
    parts = [_item_sql(item, bound, _BOUND, mark, tables) for item in query.items]
    return " UNION ".join(sql for sql, _ in parts), tuple(p for _, ps in parts for p in ps)


def read_sql(
    query: Query,
    *,
    after: int | None,
    before: int | None,
    limit: int,
    mark: str = "?",
    tables: Tables = DEFAULT_TABLES,
) -> tuple[str, list[Any]]:
    """Events matching ``query`` after ``after`` in id order, or, with ``before``, before it
    newest first; at most ``limit``."""
    backwards = before is not None
    bound, value = ("<", before) if backwards else (">", after or 0)
    assert value is not None
    sql = (
        f"SELECT {READ_COLUMNS} FROM {tables.events} e"
        f" LEFT JOIN {tables.dcb_events} d ON d.event_id = e.id"
    )
    ids = matching_ids(query, bound, value, mark, tables)
    if ids is None:
        sql += f" WHERE e.id {bound} {mark}"
        params: list[Any] = [value]
    else:
        sql += f" WHERE e.id IN ({ids[0]})"
        params = ids[1]
    sql += f" ORDER BY e.id {'DESC' if backwards else 'ASC'} LIMIT {mark}"
    params.append(limit)
    return sql, params


def condition_sql(
    query: Query, after: int | None, mark: str = "?", tables: Tables = DEFAULT_TABLES
) -> tuple[str, list[Any]]:
    """The first position after ``after`` (any, when None) of an event matching ``query``;
    no row when there is none."""
    ids = matching_ids(query, ">", after or 0, mark, tables)
    if ids is None:
        return f"SELECT id FROM {tables.events} WHERE id > {mark} ORDER BY id LIMIT 1", [after or 0]
    return f"SELECT MIN(id) FROM ({ids[0]}) AS m HAVING MIN(id) IS NOT NULL", ids[1]


def stored_event(row: Sequence[Any]) -> SequencedEvent:
    """A row of :func:`read_sql` (the columns of :data:`READ_COLUMNS`), checked against its
    checksum (:class:`~.checksums.ChecksumMismatch`)."""
    position, event_type, data, ts, client_id, tags, is_bytes, content_type, attrs, checksum = row[
        :READ_WIDTH
    ]
    check_event(position, event_type, data, ts, content_type, checksum, attrs)
    if tags is None:  # an event not appended through DCB
        tag_values: tuple[str, ...] = ()
        tags = "[]"
    elif _PLAIN_TAGS.fullmatch(tags) is not None:
        tag_values = tuple(tags[2:-2].split('","')) if len(tags) > 2 else ()
    else:  # not as this store writes tags: decoded, and encoded again when answered
        tag_values = tuple(json.loads(tags))
        tags = None
    return SequencedEvent(
        int(position), str(event_type), str(data), tag_values, str(ts), client_id,
        bool(is_bytes), tags,
    )  # fmt: skip


def stored_retry(events: Sequence[NewEvent], rows: Sequence[Sequence[Any]]) -> int:
    """The last stored position when ``events`` is a batch stored before with the same ids
    and content (rows: client id, position, type, data, tags JSON, is_bytes); raises
    EventIdConflict otherwise. A :class:`~futoin_evt.domain.dcb.BlindAppend` is never a
    retry: :class:`~futoin_evt.domain.dcb.EventIdTaken` names its first stored id, whatever
    the content (its writer may not learn what is stored)."""
    if isinstance(events, BlindAppend):
        taken = {row[0] for row in rows}
        raise EventIdTaken(next(e.id for e in events if e.id is not None and e.id in taken))
    stored = {
        client_id: (int(position), NewEvent(t, data, tuple(json.loads(tags)), client_id, bool(b)))
        for client_id, position, t, data, tags, b in rows
    }
    last = 0
    for event in events:
        found = stored.get(event.id) if event.id is not None else None
        if found is None or not found[1].same_content(event):
            raise EventIdConflict(event.id or next(iter(stored)))
        last = max(last, found[0])
    return last


#: A DCB append as the store gets it: its events and its condition.
DcbAppend = tuple[Sequence[NewEvent], AppendCondition | None]


def judge_batch(
    appends: Sequence[DcbAppend],
    next_id: int,
    stored: Sequence[Sequence[Any]],
    conflicts: Sequence[int | None],
) -> tuple[list[tuple[int, NewEvent]], list[int | Exception]]:
    """The appends of one commit judged in queue order, each as if appended after the ones
    before it: a retry against what was stored before and what the batch added, a condition
    against the store (``conflicts``) and then the batch's accepted events.

    ``stored``: the rows (as :func:`stored_retry` takes them) of the events stored before the
    batch that carry the batch's client ids; ``conflicts``: for each append, the first
    position stored before the batch that its condition's query matches (None: none, or no
    condition); the accepted events get the positions from ``next_id`` on. Returns those
    events with their positions, and each append's result: its last position (a retry's:
    the stored one), AppendConditionFailed or EventIdConflict.
    """
    by_client_id = {row[0]: row for row in stored}
    run = _RunEvents()
    accepted: list[tuple[int, NewEvent]] = []
    results: list[int | Exception] = []
    for (events, condition), conflict in zip(appends, conflicts, strict=True):
        client_ids = [e.id for e in events if e.id is not None]
        rows = [by_client_id[i] for i in client_ids if i in by_client_id]
        if rows:
            try:
                results.append(stored_retry(events, rows))
            except EventIdConflict as exc:
                results.append(exc)
            continue
        if condition is not None:
            if conflict is None:
                conflict = run.first_match(condition)
            if conflict is not None:
                results.append(AppendConditionFailed(conflict))
                continue
        for event in events:
            accepted.append((next_id, event))
            run.add(next_id, event)
            if event.id is not None:
                tags = encode_json(list(event.tags))
                by_client_id[event.id] = (
                    event.id, next_id, event.type, event.data_json, tags, event.is_bytes
                )  # fmt: skip
            next_id += 1
        results.append(next_id - 1)
    return accepted, results


class _RunEvents:
    """The events a batch of DCB appends accepted so far, by tag and by type, in position
    order: what a later append's condition is checked against besides the store."""

    def __init__(self) -> None:
        self._all: list[tuple[int, str, frozenset[str]]] = []
        self._by_tag: dict[str, list[tuple[int, str, frozenset[str]]]] = {}
        self._by_type: dict[str, list[tuple[int, str, frozenset[str]]]] = {}

    def add(self, position: int, event: NewEvent) -> None:
        entry = (position, event.type, frozenset(event.tags))
        self._all.append(entry)
        self._by_type.setdefault(event.type, []).append(entry)
        for tag in entry[2]:
            self._by_tag.setdefault(tag, []).append(entry)

    def first_match(self, condition: AppendCondition) -> int | None:
        """The first position after the condition's of an event matching its query."""
        if not self._all:
            return None
        query, after = condition.fail_if_events_match, condition.after or 0
        if query.matches_all:
            return next((p for p, _t, _tags in self._all if p > after), None)
        found: int | None = None
        for item in query.items:
            if item.tags:
                lists = [self._by_tag.get(min(item.tags), [])]
            elif item.types:
                lists = [self._by_type.get(t, []) for t in item.types]
            else:
                lists = [self._all]
            for entries in lists:
                for position, event_type, tags in entries:
                    if position > after and item.matches(event_type, tags):
                        if found is None or position < found:
                            found = position
                        break
        return found
