"""Producers' keys of events (idempotent appends), as both backends keep them. No I/O here.

An append may carry a key (:data:`~futoin_evt.domain.stream.EVENT_KEY_RE`). A key belongs
to the user who writes it (a :class:`WriterKey`): the same key from another user is another
key, so no writer can take a key before another, nor learn which keys others used. Within
the dedup window of its partition, an append whose writer's key is already stored stores
nothing and answers the first event's id. The check is part of the commit. A keyed event's
own row holds its key (:data:`KEY_COLUMNS`: the user id, the key, and when it was stored,
ms since the epoch), under one unique partial index of each partition's events table
(:func:`key_index_sql`), which decides between processes and workers; an event without a
key pays nothing for it. A batch is inserted with its keys after the partition's write lock
is held (SQLite's one writer, :mod:`.sqlite.keys`; PostgreSQL's append lock,
:func:`.postgres.schema.keyed_append_sql`), so nothing committed before can be missed. A
key older than the window counts as unknown: the append stores a new event, which takes
the key over (the old event's row loses it). A key lives as long as its event: discarding
the event, or dropping its stream, drops the key; there is nothing else to forget.

Within one process, :class:`PendingKeys` answers an append whose key is still being
committed (a retry that arrives while the first is in flight, or two copies in one batch)
with the first one's outcome, so a batch never holds one key twice.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Final, NamedTuple

from ..domain.stream import EventId, StoredForm, UserId

#: The table of every partition's keys before :data:`KEYED_ROWS_VERSION`.
TABLE: Final = "dedup_keys"
#: The schema version that adds the keys table.
KEYS_VERSION: Final = 13
#: The schema version that gives each key its writer (the keys stored before are dropped:
#: events do not record who wrote them, and a key given to no one or to anyone would let
#: one writer answer for another for a window more).
WRITER_KEYS_VERSION: Final = 15
#: The schema version that moves the keys into their events' rows (:func:`keyed_rows_sql`)
#: and drops :data:`TABLE`.
KEYED_ROWS_VERSION: Final = 19
#: The columns of an events table that hold a keyed event's key: its writer's user id, the
#: key, and when it was stored (ms since the epoch). NULL in an event without a key.
KEY_COLUMNS: Final = ("key_user_id", "key", "key_at")


def key_index_sql(table: str) -> str:
    """The unique index of ``table``'s keys (its rows with one only)."""
    return f"CREATE UNIQUE INDEX {table}_by_key ON {table} (key_user_id, key) WHERE key IS NOT NULL"


def keyed_rows_sql(table: str, partition_key: int, *, postgres: bool) -> list[str]:
    """The step of :data:`KEYED_ROWS_VERSION` for one events table (of partition
    ``partition_key``): its key columns and their index, then the keys of :data:`TABLE` of
    its events still stored (a key whose event was discarded goes: keys live as long as their
    events from now on)."""
    integer, text = "BIGINT", 'TEXT COLLATE "C"' if postgres else "TEXT"
    columns = zip(KEY_COLUMNS, (integer, text, integer), strict=True)
    added = [f"ALTER TABLE {table} ADD COLUMN {name} {kind}" for name, kind in columns]
    if postgres:  # one rewrite of the catalog rather than three
        added = [f"ALTER TABLE {table} " + ", ".join(a.split(f"{table} ", 1)[1] for a in added)]
    copied = (
        f"UPDATE {table} SET key_user_id = d.user_id, key = d.key, key_at = d.at"
        f" FROM {TABLE} d WHERE d.partition_key = {partition_key} AND d.event_id = {table}.id"
    )
    return [*added, key_index_sql(table), copied]


class WriterKey(NamedTuple):
    """A producer's key as the store keeps it: with the user who wrote it."""

    writer: UserId
    key: str


def window_ms(seconds: float) -> int:
    """The window as whole milliseconds (0: keys are ignored)."""
    if not 0 <= seconds < math.inf:
        raise ValueError(f"the dedup window must be 0 or more seconds, not {seconds}")
    return round(seconds * 1000)


class PendingKeys:
    """The keys of one partition's appends that are queued and not committed yet, in this
    process, each with the appends that came with it meanwhile (its followers). The store
    tells :meth:`answered` each keyed append's outcome as its commit ends (whether its
    caller still waits or not), which answers the followers alike and forgets the key: the
    next append with it asks the database."""

    def __init__(self) -> None:
        self._followers: dict[WriterKey, list[asyncio.Future[EventId]]] = {}

    def follows(self, key: WriterKey, future: asyncio.Future[EventId]) -> bool:
        """True when an append with ``key`` is in flight: ``future`` gets its outcome. Else
        ``key`` is in flight from now on, and the caller queues its append."""
        followers = self._followers.get(key)
        if followers is None:
            self._followers[key] = []
            return False
        followers.append(future)
        return True

    def split(
        self, keys: Sequence[WriterKey | None]
    ) -> tuple[list[asyncio.Future[EventId] | None], list[asyncio.Future[EventId]]]:
        """For appends with these keys, in order: the future of each one to queue (None for
        one that follows an append with its key in flight, here or earlier in ``keys``), and
        the future of each one for its caller (the same for one queued)."""
        loop = asyncio.get_running_loop()
        owned: list[asyncio.Future[EventId] | None] = []
        answers: list[asyncio.Future[EventId]] = []
        for key in keys:
            future: asyncio.Future[EventId] = loop.create_future()
            answers.append(future)
            owned.append(None if key is not None and self.follows(key, future) else future)
        return owned, answers

    def answered(self, key: WriterKey, outcome: int | BaseException) -> None:
        """The commit of the append queued with ``key`` ended: its id (stored now or
        before), or why it failed."""
        for future in self._followers.pop(key, ()):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(EventId(outcome))

    def __len__(self) -> int:
        return len(self._followers)


#: An event a store is asked to append: :data:`~futoin_evt.domain.stream.StoredForm`, or
#: (type, data JSON, content type) for one without attributes.
AppendedForm = StoredForm | tuple[str, str, str | None]


def full_form(event: AppendedForm) -> StoredForm:
    """``event`` with its attributes' JSON (None when it was left out)."""
    return event if len(event) == 4 else (event[0], event[1], event[2], None)


#: One event to queue: its :data:`AppendedForm`, its store future, its key (None: none, or
#: ignored), and whether the next one is committed with it.
Queued = tuple[AppendedForm, "asyncio.Future[EventId]", WriterKey | None, bool]


def plan_appends(
    pending: PendingKeys | None,
    events: Sequence[AppendedForm],
    keys: Sequence[WriterKey | None] | None,
) -> tuple[list[Queued], list[asyncio.Future[EventId]]]:
    """What a store queues for ``events`` that are committed together, and the future of
    each for its caller; keys are ignored without ``pending`` (no window)."""
    if pending is None or keys is None:
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[EventId]] = [loop.create_future() for _ in events]
        owned: Sequence[asyncio.Future[EventId] | None] = answers
        keys = [None] * len(events)
    else:
        owned, answers = pending.split(keys)
    queued = [
        (event, future, key, True)
        for event, future, key in zip(events, owned, keys, strict=True)
        if future is not None
    ]
    if queued:
        event, future, key, _joined = queued[-1]
        queued[-1] = (event, future, key, False)
    return queued, answers
