"""The storage contract: what the layers above storage may ask of a store. No I/O.

Everything above ``storage/`` depends on :class:`EventStore` (and the value types here), never
on a backend class; :func:`futoin_evt.storage.open_store` picks the backend from the ``--db``
value. Each backend keeps these rules:

- **Commit order.** Event ids increase in commit order: once a reader has seen id ``N``, no
  event with an id below ``N`` commits later. A reader at ``id > position`` therefore never
  skips an event, however many writers (threads, processes) there are.
- **Durability.** :meth:`EventStore.append` returns (and a submitted future resolves) only
  once the event is committed at the store's durability.
- **Positions only move forward** through :meth:`EventStore.acknowledge`; only an operator's
  :meth:`EventStore.set_position` moves one anywhere.
- **Ids are never reused**, even after their events are discarded.
- :attr:`EventStore.head` tells waiters about every commit, this process's and others'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from ..dcb.model import AppendCondition, NewEvent, Query, StoredEvent
from ..model import MAX_EVENTS_PER_CALL, EventId, UserId
from .head import HeadWatch


class Durability(Enum):
    """``FULL``: no acknowledged write is lost even on power loss. ``NORMAL``: survives a crash
    of the process, may lose the last commits on power loss; several times faster."""

    FULL = "FULL"
    NORMAL = "NORMAL"


class StoreUnavailable(Exception):
    """The database cannot be opened or used as configured (a one-sentence reason)."""


class StoreClosed(RuntimeError):
    """The store was closed before the write could be committed."""


@dataclass(frozen=True, slots=True)
class EventPage:
    """Events read for one reply, already encoded as a JSON array."""

    json: str
    count: int
    last_id: int
    #: With a type filter: the newest id in the store (to skip ahead to when nothing matched).
    head_id: int
    #: The id the read started after.
    start_id: int
    #: More events were there but did not fit ``max_bytes``.
    truncated: bool = False
    #: Each event's JSON text (``json`` is these, joined into an array).
    items: Sequence[str] = ()


class ConsumerRow(NamedTuple):
    user: str
    user_id: UserId
    component: str
    position: int
    registered_at: str
    last_seen_at: str
    behind: int
    oldest_unread_ts: str | None


class StreamBounds(NamedTuple):
    first_id: int | None
    first_ts: str | None
    last_id: int | None
    last_ts: str | None
    events: int


class DiscardLimits(NamedTuple):
    #: The lowest consumer position, or None without consumers.
    lowest_position: int | None
    newest_id: int
    oldest_id: int
    #: The newest id older than the time retention keeps (None: no such event or no policy).
    older_than_kept: int | None


@dataclass(frozen=True, slots=True)
class User:
    id: UserId
    name: str
    password_hash: str
    is_admin: bool


class EventStore(Protocol):
    """Events, consumers and users in one store (see the module docstring for the rules)."""

    #: Wakes waiters when events commit (in this process or, once noticed, in another).
    head: HeadWatch

    async def close(self) -> None:
        """Commit what is queued, then close; later writes raise :class:`StoreClosed`."""

    def watch_other_writers(self, interval: float = 0.2) -> None:
        """Notice commits of other processes within ``interval`` seconds while someone waits."""

    # -- the log --------------------------------------------------------------------------------

    async def append(self, event_type: str, data_json: str) -> EventId:
        """Store one checked event; its id once it is durable. Cancelling does not unstore it."""

    def submit_append(self, event_type: str, data_json: str) -> asyncio.Future[EventId]:
        """Queue one event (group commit); the future gets its id once it is durable."""

    async def read_events(
        self,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage:
        """Events with id > ``after_id`` in id order, within ``limit`` and ``max_bytes`` (at
        least one event when there is one).

        ``types`` keeps those types only; ``ftn18_only`` keeps events whose type is an FTN18
        EventType (what FTN18 consumers may receive). With either filter, ``head_id`` is the
        newest id, so that a reader can skip what the filter left out.
        """

    async def read_consumer_events(
        self,
        user_id: UserId,
        component: str,
        *,
        at_least: int = 0,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        """:meth:`read_events` after the consumer's position (or ``at_least`` when higher),
        in one snapshot; None when the consumer is not registered."""

    async def read_range(
        self,
        user_id: UserId,
        component: str,
        after_id: int,
        upto_id: int | None,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        data_as_text: bool = False,
    ) -> EventPage | None:
        """Events with ``after_id < id <= upto_id`` of a registered consumer whose position is
        at most ``after_id`` (``start_id`` is -1 when it is past it); None: not registered."""

    async def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> int:
        """Append DCB events atomically; the position of the last. The condition is checked in
        the same write transaction, against every event committed before, those of earlier
        appends in the same group commit included. Raises AppendConditionFailed or
        EventIdConflict; a retry of a stored batch (same ids, same content) stores nothing
        and returns the stored position."""

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[StoredEvent], int]:
        """Events matching ``query`` (every event of the log, with or without tags) after
        ``after`` in id order, or before ``before`` newest first; at most ``limit``. Also the
        newest position of the store, read in the same snapshot."""

    async def read_rows(self, after_id: int, *, limit: int) -> list[tuple[int, str, str, str]]:
        """Stored events as (id, type, data JSON, ts), for copying them elsewhere."""

    async def last_given_id(self) -> int:
        """The newest id ever given to an event, even if that event is discarded."""

    async def newest_event_id(self) -> int:
        """The newest stored event's id; 0 when there is none."""

    async def stream_id(self) -> str:
        """A random id of this store, fixed when it was created."""

    # -- consumers ------------------------------------------------------------------------------

    async def register_consumer(self, user_id: UserId, component: str) -> bool:
        """Register (idempotent); True when new. It starts before the oldest retained event."""

    async def acknowledge(self, user_id: UserId, component: str, up_to: int) -> int | None:
        """Move a position forward to ``up_to`` (never back); the position, or None."""

    async def position(self, user_id: UserId, component: str) -> int | None: ...

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """(position, last given id) in one snapshot; None when not registered."""

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        """Put a position anywhere (an operator's seek, not an acknowledgement)."""

    async def drop_consumer(self, user_id: UserId, component: str) -> bool: ...

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        """Registered consumers (of one user, or all) with how far behind each is."""

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        """Mark consumers as seen now (connected push streams)."""

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        """Drop consumers not seen since ``seen_before``; (user, component) of each."""

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        """(user, user id, component) of the consumer with the lowest position."""

    # -- retention ------------------------------------------------------------------------------

    async def stream_bounds(self) -> StreamBounds: ...

    async def id_before(self, ts: str) -> int | None:
        """The newest id before the first event at or after ``ts``; None when that is the
        oldest retained event (or there are none)."""

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        """What bounds discarding, read in one snapshot."""

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """Delete at most ``limit`` of the oldest events with id <= ``up_to``; how many.
        Events appended through DCB stay unless ``dcb_events``."""

    # -- users ----------------------------------------------------------------------------------

    async def add_user(self, name: str, password_hash: str, *, is_admin: bool = False) -> UserId:
        """The new user's id; KeyError when the name is taken."""

    async def set_password(self, name: str, password_hash: str) -> bool: ...

    async def remove_user(self, name: str) -> bool:
        """Remove a user and their consumers."""

    async def get_user(self, name: str) -> User | None: ...

    async def list_users(self) -> list[User]: ...
