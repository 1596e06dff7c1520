"""Producers' keys of events (idempotent appends), as both backends keep them. No I/O here.

An append may carry a key (:data:`~futoin_evt.domain.stream.EVENT_KEY_RE`). Within the
dedup window of its partition, an append whose key is already stored stores nothing and
answers the first event's id. The check is part of the commit: one table, ``dedup_keys``,
holds a row per (partition key, key) with the first event's id and when it was stored (ms
since the epoch); its primary key decides between processes and workers. A batch's keys are
read and written in the batch's own transaction, one statement each, after the partition's
write lock is held (SQLite's one writer, PostgreSQL's append lock), so nothing committed
before can be missed. A key older than the window counts as unknown (the append stores a
new event and takes the key over), and :func:`forget_sql` deletes such rows in bounded
chunks (the discarder's turns), so they stop costing space.

Within one process, :class:`PendingKeys` answers an append whose key is still being
committed (a retry that arrives while the first is in flight, or two copies in one batch)
with the first one's result, so a batch never holds one key twice.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Sequence
from typing import Final

from ..domain.stream import EventId

#: The table of every partition's keys.
TABLE: Final = "dedup_keys"


def window_ms(seconds: float) -> int:
    """The window as whole milliseconds (0: keys are ignored)."""
    if not 0 <= seconds < math.inf:
        raise ValueError(f"the dedup window must be 0 or more seconds, not {seconds}")
    return round(seconds * 1000)


def lookup_sql(mark: str, count: int) -> str:
    """The stored keys among ``count`` of one partition, with their event id, kept since at
    least the cutoff: params partition key, the cutoff (ms), the keys. PostgreSQL passes the
    keys as one array (``count`` 0)."""
    keys = f"= ANY({mark})" if count == 0 else f"IN ({','.join([mark] * count)})"
    return (
        f"SELECT key, event_id FROM {TABLE} WHERE partition_key = {mark} AND at >= {mark}"
        f" AND key {keys}"
    )


def remember_sql(mark: str, count: int) -> str:
    """Store ``count`` keys (partition key, key, event id, ms each); a key found stored is
    older than the window (the lookup said so in the same transaction): it is taken over."""
    rows = ",".join([f"({mark}, {mark}, {mark}, {mark})"] * count)
    return (
        f"INSERT INTO {TABLE} (partition_key, key, event_id, at) VALUES {rows}"
        " ON CONFLICT (partition_key, key) DO UPDATE SET event_id = excluded.event_id,"
        " at = excluded.at"
    )


def forget_sql(mark: str, cutoff: str | None = None) -> str:
    """Delete the oldest keys stored before the cutoff, at most a limit of them (params: the
    cutoff, the limit; ``cutoff``: an SQL expression instead of the first param). The outer
    condition is checked again on a row another transaction took over meanwhile (PostgreSQL
    reads it anew), so a key stored again is never forgotten."""
    cutoff = cutoff or mark
    return (
        f"DELETE FROM {TABLE} WHERE at < {cutoff} AND (partition_key, key) IN"
        f" (SELECT partition_key, key FROM {TABLE} WHERE at < {cutoff} ORDER BY at LIMIT {mark})"
    )


class PendingKeys:
    """The keys of one partition's appends that are queued and not answered yet, in this
    process, each with the future of its append (the store's own, never handed out, so a
    caller that gives up cannot end it before the commit does)."""

    def __init__(self) -> None:
        self._first: dict[str, asyncio.Future[EventId]] = {}

    def split(
        self, keys: Sequence[str | None]
    ) -> tuple[list[asyncio.Future[EventId] | None], list[asyncio.Future[EventId]]]:
        """For appends with these keys, in order: the future of each one to queue (None for
        one that follows an append with its key in flight, here or earlier in ``keys``), and
        the future of each one for its caller."""
        loop = asyncio.get_running_loop()
        owned: list[asyncio.Future[EventId] | None] = []
        answers: list[asyncio.Future[EventId]] = []
        for key in keys:
            first = self._first.get(key) if key is not None else None
            if first is not None:
                owned.append(None)
                answers.append(_copy_of(first))
                continue
            future: asyncio.Future[EventId] = loop.create_future()
            owned.append(future)
            if key is None:
                answers.append(future)
                continue
            self._first[key] = future
            future.add_done_callback(functools.partial(self._answered, key))
            answers.append(_copy_of(future))
        return owned, answers

    def _answered(self, key: str, future: asyncio.Future[EventId]) -> None:
        """The commit is over (the key is stored, or the append failed): the next append
        with this key asks the database."""
        if self._first.get(key) is future:
            del self._first[key]

    def __len__(self) -> int:
        return len(self._first)


#: One event to queue: (type, data JSON, content type), its store future, its key (None:
#: none, or ignored), and whether the next one is committed with it.
Queued = tuple[tuple[str, str, str | None], "asyncio.Future[EventId]", str | None, bool]


def plan_appends(
    pending: PendingKeys | None,
    events: Sequence[tuple[str, str, str | None]],
    keys: Sequence[str | None] | None,
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


def _copy_of(first: asyncio.Future[EventId]) -> asyncio.Future[EventId]:
    copy: asyncio.Future[EventId] = asyncio.get_running_loop().create_future()
    first.add_done_callback(functools.partial(_settle, copy))
    return copy


def _settle(copy: asyncio.Future[EventId], first: asyncio.Future[EventId]) -> None:
    if copy.done():
        return
    if first.cancelled():
        copy.cancel()
    elif (exc := first.exception()) is not None:
        copy.set_exception(exc)
    else:
        copy.set_result(first.result())
