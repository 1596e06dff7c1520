"""The storage contract: value types and the roles a store plays. No I/O here.

Every backend (``SqliteStore``, ``PostgresStore``) implements :class:`Store`; code above
``storage/`` depends on these Protocols only, each part on the narrowest role it needs, and
gets a store from :func:`futoin_evt.storage.open_store`.

The ordering rule every backend keeps (the point of the contract):

    Event ids grow in commit order. Once a reader has seen id ``p`` committed, no event with
    an id ``<= p`` commits later. So a reader that asks for ``id > p`` never skips an event
    that commits after it asked, and a reliable consumer at position ``p`` never misses one.

Ids are never reused, not even after the newest events are discarded. An ``append`` that
returned is durable; acknowledgements only move a position forward. What the calls raise
is in :mod:`futoin_evt.storage.errors`.

Streams and partitions: every partition is a log of its own with the roles above
(:meth:`Store.partition_log`); the :class:`Store` itself plays them as the view of
``events``/0, the log every door serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, NamedTuple, Protocol

from ..domain.checkpoints import Checkpoint, Ownership
from ..domain.dcb import AppendCondition, NewEvent, Query, SequencedEvent
from ..domain.groups import GroupClaim, GroupHold
from ..domain.partition import Partition, StreamInfo
from ..domain.schemas import SchemaRow
from ..domain.sessions import SessionLimits, SessionRow
from ..domain.stream import MAX_EVENTS_PER_CALL, EventId, UserId
from ..domain.termini import KeptTerminus, TerminusKey
from ..stats import DamageStats, WriteStats
from .dedup import AppendedForm, WriterKey
from .errors import SchemaTooNew
from .head import ClaimWatch, HeadWatch
from .user_roles import (
    Grants,
    ScramSource,
    Users,
    UserSource,
)

#: The schema version this futoin-evt writes; both backends number their migrations alike.
SCHEMA_VERSION: Final = 19


def migrations_to_run(current: int, known: int = SCHEMA_VERSION) -> range:
    """The migration steps from ``current`` up to ``known`` (step ``n`` makes version ``n``).

    Version 0 is an empty database. Raises :class:`SchemaTooNew` for a newer schema.
    """
    if current > known:
        raise SchemaTooNew(current, known)
    return range(current + 1, known + 1)


def joined_count(items: Sequence[object], limit: int) -> int:
    """How many queued writes one commit takes: up to ``limit``, more to end a run of
    appends that belong together (``joined``)."""
    count = min(len(items), limit)
    while count < len(items) and getattr(items[count - 1], "joined", False):
        count += 1
    return count


class Durability(Enum):
    """``FULL``: no acknowledged write is lost even on power loss. ``NORMAL``: survives a crash
    of the process, may lose the last commits on power loss; several times faster."""

    FULL = "FULL"
    NORMAL = "NORMAL"


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """PostgreSQL: the pooled connections for reads and the other writes (the writer and
    the listener have their own), and how long a call waits for one before it fails with
    :class:`~.errors.StoreUnreachable`; and how long a connection may go without an answer from the
    database's host before it counts as broken (``link_timeout``: TCP keepalives and user
    timeout on both ends, and the server's ``idle_in_transaction_session_timeout``). SQLite
    has no pool and ignores them."""

    size: int = 8
    timeout: float = 10.0
    link_timeout: float = 10.0


DEFAULT_POOL: Final = PoolLimits()


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
    #: The lowest position of the aggregates that copy this partition (None: none does);
    #: nothing above it may go, whatever the consumers and the policy allow.
    copied_up_to: int | None = None


class AggregateCopy(NamedTuple):
    """What one copying transaction did."""

    #: Events copied into the aggregate.
    copied: int
    #: The aggregate's newest id after it (0 when nothing was copied).
    head: int


#: A stored event as (id, type, data JSON, ts), for copying it elsewhere.
#: (id, type, data JSON, ts, content type, attrs): the content type of the AMQP ``data``
#: section the event came as (``""`` for none), or None for an event that came otherwise; its
#: partition key and properties as stored (:mod:`futoin_evt.domain.attrs`), or None.
EventRow = tuple[int, str, str, str, str | None, str | None]


class EventLog(Protocol):
    """The ordered log: append, read, and the head that wakes waiting readers."""

    @property
    def head(self) -> HeadWatch:
        """The newest committed id this process knows of (other processes' commits reach it
        within the backend's wake-up delay) and its waiters."""

    async def append(self, event_type: str, data_json: str) -> EventId:
        """Store one event (type and data already checked); its id once durable.
        Cancelling the caller does not cancel the write."""

    def submit_append(
        self,
        event_type: str,
        data_json: str,
        content_type: str | None = None,
        key: WriterKey | None = None,
        attrs: str | None = None,
    ) -> asyncio.Future[EventId]:
        """Queue one event; the future gets its id once it is durable. ``content_type``: the
        event came as an AMQP ``data`` section with this content type; ``attrs``: its
        attributes' JSON (see :data:`EventRow`).

        ``key`` (checked already), with the user who writes it: within
        :attr:`Keys.dedup_window` of this partition, when an event with that key from that
        user is stored (by any process) or being stored (by this one), nothing is stored and
        the future gets the first event's id. Another user's events with the same key are
        never found. The check is part of the commit. With no window the key is ignored."""

    def submit_appends(
        self,
        events: Sequence[AppendedForm],
        keys: Sequence[WriterKey | None] | None = None,
    ) -> asyncio.Future[list[EventId]]:
        """Queue events (type, data JSON, content type[, attrs JSON]) that are stored together
        or not at all: one transaction holds them all (a group commit never splits them). ``keys``:
        one per event, as :meth:`submit_append` takes it (an event whose key is known is
        left out of the transaction and answered with the first event's id)."""

    async def read_events(
        self,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
        up_to_head: bool = False,
    ) -> EventPage:
        """Events with id > ``after_id`` in id order, as many as fit ``limit`` and
        ``max_bytes`` (the encoded array, UTF-8); at least one when there is one.

        ``types`` keeps those types; ``ftn18_only`` keeps the events whose type is an FTN18
        EventType (all that FTN18 consumers may receive; DCB and AMQP types may not be).
        With either filter, ``head_id`` is the newest id, to skip what the filter left out.

        Every event committed before the call, by any process, is read (as far as the page
        goes); with ``up_to_head``, those up to :attr:`head` are enough, for a reader that
        reads on when the head moves.
        """

    def read_recent(
        self,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        """:meth:`read_events` with ``up_to_head`` when the recent events held in memory
        answer it, without waiting (in the loop turn of the commit that moved the head);
        None when the store must be read."""

    async def read_rows(
        self, after_id: int, *, limit: int, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        """Stored events after ``after_id`` as :data:`EventRow`; with ``types``, only
        those types, found through the index on (type, id) rather than by reading the rest."""

    async def newest_event_id(self) -> int:
        """The newest stored event's id (0 when there is none)."""

    async def last_given_id(self) -> int:
        """The newest id ever given to an event, even if that event is discarded."""

    async def stream_id(self) -> str:
        """A random name of this database: ids start again in another one."""


class Consumers(Protocol):
    """Registered reliable consumers and their positions (highest acknowledged id)."""

    async def register_consumer(self, user_id: UserId, component: str) -> bool:
        """Register (idempotent; marks it seen); True when it was new. A new consumer starts
        before the oldest retained event."""

    async def acknowledge(
        self, user_id: UserId, component: str, up_to: int, *, epoch: int | None = None
    ) -> int | None:
        """Durably move a position forward to ``up_to`` (never back); the position after,
        or None when the consumer is not registered, or (with ``epoch``) when its epoch has
        moved on: another stream claimed it."""

    async def position(self, user_id: UserId, component: str) -> int | None: ...

    async def claim_consumer(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """Make the caller the consumer's one push stream in the whole cluster: bump its
        epoch and return (new epoch, position), or None when it is not registered.
        Acknowledgements with an older epoch no longer move the position."""

    @property
    def claims(self) -> ClaimWatch:
        """Told of other processes' claims of a consumer (:meth:`claim_consumer`) and of
        an AMQP consumer group (:meth:`ConsumerGroups.claim_group`) where the backend
        hears of them (PostgreSQL: on the notification channel, this process's own too;
        SQLite: those of the other workers of a server, see :meth:`Store.join_peers`)."""

    async def consumer_state(self, user_id: UserId, component: str) -> tuple[int, int] | None:
        """(position, last given id) in one snapshot; None when not registered."""

    async def set_position(self, user_id: UserId, component: str, position: int) -> bool:
        """Put a position anywhere (an operator's seek, not an acknowledgement)."""

    async def drop_consumer(self, user_id: UserId, component: str) -> bool: ...

    async def consumers(self, user_id: UserId | None = None) -> list[ConsumerRow]:
        """Registered consumers (of one user, or all) with how far behind each is."""

    async def consumer_lags(self, limit: int) -> list[ConsumerRow]:
        """What :meth:`consumers` returns, for the first ``limit`` consumers by user id and
        component, in one pass over the events after the lowest of their positions."""

    async def count_consumers(self) -> int:
        """How many consumers are registered."""

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
        """Like ``read_events`` after the consumer's position (or ``at_least`` when higher),
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
        """Events with ``after_id < id <= upto_id``, the position left alone; the page's
        ``start_id`` is the position read in the same snapshot. None when not registered.
        With ``data_as_text`` each event's data is a string holding its JSON text."""

    async def touch_consumers(self, keys: Sequence[tuple[UserId, str]]) -> None:
        """Mark consumers as seen now (connected push streams)."""

    async def expire_consumers(self, seen_before: str) -> list[tuple[str, str]]:
        """Drop consumers not seen since ``seen_before``; (user, component) of each."""

    async def lowest_consumer(self) -> tuple[str, UserId, str] | None:
        """(user, user id, component) of the consumer with the lowest position."""


class ConsumerGroups(Protocol):
    """A partition's AMQP consumer groups in the whole cluster: which link holds each group
    of a user (one at a time), with its epoch (owner level), and a claim number every new
    holder bumps. A holder keeps the group while its process renews the hold
    (:meth:`hold_groups`); a process that died loses it once the hold runs out."""

    async def claim_group(
        self,
        user_id: UserId,
        group: str,
        epoch: int | None,
        *,
        hold_seconds: float,
        equal_takes_over: bool = False,
        free_only: bool = False,
    ) -> GroupClaim:
        """Take the group for a new link, held for ``hold_seconds``: when nobody holds it
        (never claimed, released, or its hold ran out), or, unless ``free_only``, when
        ``epoch`` is above the holder's (or equal, with ``equal_takes_over``). No epoch
        takes a free group only, held with epoch 0. A group taken is told to the other
        processes (:attr:`Consumers.claims`), and its older holder's
        :meth:`acknowledge_group` is fenced off."""

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        """Renew these holds for ``hold_seconds``; returns those that are no longer held
        (another claim took the group)."""

    async def release_group(self, user_id: UserId, group: str, claim: int) -> None:
        """The link of ``claim`` ended: the group is free, unless a newer claim holds it."""

    async def acknowledge_group(
        self, user_id: UserId, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        """:meth:`Consumers.acknowledge` of ``component`` by the link of the group's
        ``claim``: None when the consumer is not registered, or another claim took the
        group (ordered with the claims: the newer holder reads the position after it)."""


class Retention(Protocol):
    """What discarding needs: its limits, the deletion, and the stream's extent."""

    async def discard_limits(self, keep_since_ts: str | None) -> DiscardLimits:
        """What bounds discarding, read in one snapshot."""

    async def delete_events(self, up_to: int, limit: int, *, dcb_events: bool = False) -> int:
        """Delete at most ``limit`` of the oldest events with id <= ``up_to``; how many.
        Callers pass a bound at or below every consumer's position (``discard_limits``).
        Events appended through DCB are the system of record: they stay unless
        ``dcb_events``."""

    async def stream_bounds(self) -> StreamBounds: ...

    async def id_before(self, ts: str) -> int | None:
        """The newest id before the first event at or after ``ts``; None when that is the
        oldest retained event (or there are none)."""


class Keys(Protocol):
    """Producers' keys of events, each its writer's (see :meth:`EventLog.submit_append`),
    store-wide."""

    @property
    def dedup_window(self) -> float:
        """Seconds a key is remembered in each partition (0: keys are ignored)."""


class EventHubCheckpoints(Protocol):
    """The Event Hubs checkpoint store's calls, per user, hub (a stream), consumer group and
    partition: who owns each partition of a consumer group (a claim names the etag it read;
    the etag changes with each claim) and the checkpoint each partition resumes from."""

    async def list_ownership(self, user_id: int, hub: str, group: str) -> list[Ownership]: ...

    async def claim_ownership(
        self, user_id: int, hub: str, group: str, partition_id: str, owner_id: str, etag: str | None
    ) -> Ownership | None:
        """Claim (or release, with owner ''): granted when nobody held the partition yet, or
        when ``etag`` is still its etag; None when another claim came first."""

    async def list_checkpoints(self, user_id: int, hub: str, group: str) -> list[Checkpoint]: ...

    async def update_checkpoint(
        self, user_id: int, hub: str, group: str, checkpoint: Checkpoint
    ) -> None: ...


class KeptTermini(Protocol):
    """The kept AMQP link termini (:mod:`futoin_evt.domain.termini`) of every process on the
    database. A row expires at a time of the database's clock: its timeout after its session
    or connection ended, or, while that lives, its timeout after a lease its process renews
    (so the termini of a process that died expire too). Each call is one transaction."""

    async def keep_termini(
        self, termini: Sequence[tuple[KeptTerminus, float]], per_user: int
    ) -> list[int | None]:
        """Keep each terminus (replacing the one kept under its key) until ``grace`` (the
        float) plus its timeout from now; beyond ``per_user`` of a user's, the oldest go;
        expired ones go too. The row of each (to :meth:`expire_termini`), None for one not
        kept (its user or partition is gone)."""

    async def take_terminus(self, key: TerminusKey) -> KeptTerminus | None:
        """The terminus kept under ``key``, no longer kept (another process cannot take it
        too); None when there is none, or it expired."""

    async def discard_termini(self, keys: Sequence[TerminusKey]) -> None:
        """Forget the termini kept under these keys."""

    async def expire_termini(self, rows: Sequence[int], grace: float) -> list[int]:
        """These rows expire ``grace`` plus their timeout from now; the rows still kept."""

    async def purge_termini(self) -> int:
        """Delete the expired termini; how many."""

    async def count_termini(self, user_id: UserId | None = None) -> int:
        """The termini kept (of one user, or of all) that have not expired."""


class KafkaState(Protocol):
    """What the Kafka door keeps for every process on the database
    (:mod:`futoin_evt.storage.sql.kafka`). Each call is one transaction."""

    async def new_producer_id(self) -> int:
        """A producer id never given before (by any process)."""

    async def producer_batches(
        self, producer_id: int, partition_key: int
    ) -> tuple[int, list[tuple[int, int, int]]] | None:
        """The epoch and last batches (first sequence, last sequence, base offset) kept of a
        producer on a partition; None when none are."""

    async def keep_producer_batches(
        self, kept: Sequence[tuple[int, int, int, Sequence[tuple[int, int, int]]]]
    ) -> None:
        """Keep, for each (producer id, partition key, epoch, batches), its last batches
        (those of a partition that is gone are not kept)."""

    async def register_broker(self, host: str, port: int, lease: float) -> int:
        """The node id of the broker at this address, with a lease of ``lease`` seconds: the
        one it has while its row lasts, else a new one."""

    async def renew_broker(
        self, node_id: int, host: str, port: int, lease: float
    ) -> list[tuple[int, str, int]] | None:
        """Renew the lease; the brokers whose lease runs (node id, host, port), or None when
        this broker's row is gone (register again)."""

    async def drop_broker(self, node_id: int) -> None: ...

    async def group_state(self, group_id: str) -> tuple[int, str] | None:
        """A consumer group's state with its version; None when none is kept."""

    async def put_group_state(self, group_id: str, version: int, state: str) -> bool:
        """Replace the state kept at ``version`` (0: none kept yet); False when another
        version is kept (another process changed it first)."""

    async def group_ids(self) -> list[str]: ...

    async def forget_idle_kafka_state(self, idle_seconds: float) -> int:
        """Forget the producers' batches and the groups not changed for ``idle_seconds``;
        how many rows went."""


class RetentionLog(Retention, Consumers, Protocol):
    """One partition's discarding and consumers."""


class RetentionStore(Keys, UserSource, Protocol):
    """What discarding needs of a store: the partitions' logs, the producers' keys of every
    partition, and the kept AMQP link termini."""

    def partition_log(self, partition: Partition) -> RetentionLog: ...

    async def purge_termini(self) -> int:
        """:meth:`KeptTermini.purge_termini`."""


class ConsoleSessionStore(Protocol):
    """The web console's sessions (:mod:`futoin_evt.domain.sessions`) of every process on
    the database, by the digest of their token; the rules are the console's."""

    async def add_console_session(
        self, digest: bytes, user_id: int, now: float, limits: SessionLimits
    ) -> list[bytes]:
        """Store a new session, then end those past ``limits`` at ``now`` (the least recently
        used beyond the bound first); returns the digests of the sessions ended."""

    async def console_sessions(self, digests: Sequence[bytes]) -> dict[bytes, SessionRow]:
        """The stored sessions among ``digests``, with their users."""

    async def touch_console_sessions(self, digests: Sequence[bytes], used: float) -> None:
        """The sessions were used at ``used`` (a session used later keeps its time)."""

    async def end_console_session(self, digest: bytes) -> None: ...

    async def set_console_notice(self, digest: bytes, notice: str) -> None: ...

    async def clear_console_notice(self, digest: bytes, notice: str) -> None:
        """Forget the notice, if it is still ``notice`` (shown once, not a newer one)."""


class Schemas(Protocol):
    """The schema registry's subjects (``STREAM-TYPE``), versions, schemas and levels;
    the rules (names, rights, compatibility) are the caller's. A change of versions moves
    :meth:`Streams.streams_version` on, so every process learns of it as of a stream's."""

    async def schema_rows(
        self, *, subject: str | None = None, schema_id: int | None = None, guid: str | None = None
    ) -> list[SchemaRow]:
        """Versions, deleted ones too, by subject and version: of one subject, of one
        schema id or guid, or (none given) all."""

    async def latest_schemas(self) -> list[SchemaRow]:
        """The newest live version of each subject that has one."""

    async def add_schema_version(
        self, stream: str, subject: str, text: str, fingerprint: str, *, after: int
    ) -> SchemaRow:
        """Add the next version of ``subject`` (of ``stream``), under the id the stream
        gives ``fingerprint`` (a new one for a new text). KeyError when there is no such
        stream; :class:`~.errors.SchemaChanged` when the subject's newest live version is no longer
        ``after`` (0 for none), or another registration of the same moment came first."""

    async def delete_schema_versions(
        self, subject: str, versions: Sequence[int], *, permanent: bool
    ) -> None:
        """Soft-delete the versions, or (``permanent``) remove them."""

    async def schema_levels(self) -> dict[str, str]:
        """Compatibility levels by subject; ``''`` is the global one (when set)."""

    async def set_schema_level(self, subject: str, stream: str | None, level: str | None) -> None:
        """Set the level of ``subject`` (of ``stream``; ``''`` and None for the global
        one); None removes it."""


class ConsumerLog(EventLog, Consumers, Protocol):
    """The log with its consumers: what polling and pushing need."""


class DcbLog(EventLog, Protocol):
    """The log as a DCB event store: events with tags, queries, conditional appends."""

    def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        """Append atomically; the future gets the position of the last event (a future, not
        a coroutine: a door answers from its callback, without a task per call). The
        condition is checked in the write transaction, against every event committed before
        (those of earlier appends in the same group commit included). Fails with
        AppendConditionFailed or EventIdConflict; a retry of a stored batch (same ids, same
        content) stores nothing and gets the stored position."""

    async def dcb_read(
        self, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[SequencedEvent], int]:
        """Events of the whole log matching ``query``, after ``after`` in id order, or before
        ``before`` newest first; at most ``limit``. Also the newest position given, read in
        the same snapshot."""


class Aggregates(Protocol):
    """Aggregated streams (FTN18 2.3.3): a one-partition stream that holds every event of
    every partition of its source, with new ids, each source partition's order kept.

    The copying is done in transactions that each take the aggregate's lease, copy a batch
    and move the source positions together, so every source event is copied exactly once
    whatever happens to the process copying. The lease keeps the copying to one process;
    the positions, read and moved under the aggregate's write lock, keep it exact even if
    two processes hold a lease they think is theirs."""

    async def copy_into_aggregate(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int = 0
    ) -> AggregateCopy | None:
        """One transaction: take or renew the lease of ``aggregate`` for ``holder`` (for
        ``lease_seconds``), copy at most ``limit`` events of its sources after their
        positions (the sources in key order, turned by ``start``, so none waits behind
        another for long), and move the positions. None when another holder's lease has
        not expired, or the aggregate is gone: nothing was done."""

    async def release_aggregate(self, aggregate: Partition, holder: str) -> None:
        """Give the lease up (another process takes over at its next try)."""

    async def aggregate_sources(self, aggregate: Partition) -> list[tuple[int, int]]:
        """(source partition key, the newest source id copied) of each source, by key."""


class PartitionLog(ConsumerLog, ConsumerGroups, DcbLog, Retention, Protocol):
    """One partition's log: its events (ids from 1), consumers, positions and retention."""

    @property
    def partition(self) -> Partition: ...


class Streams(Protocol):
    """The registry of streams and their partitions. ``events``/0 always exists.

    Bad names and counts raise ValueError (:func:`~futoin_evt.domain.partition.check_stream_name`,
    :func:`~futoin_evt.domain.partition.check_partition_count`), with one sentence."""

    async def add_stream(
        self, name: str, partitions: int, *, aggregate_of: str | None = None
    ) -> StreamInfo:
        """Create a stream and its partitions' tables; KeyError when the name is taken.
        With ``aggregate_of``: one partition that aggregates that stream (ValueError when
        there is no such stream, or ``partitions`` is not 1); it is filled by
        :meth:`Aggregates.copy_into_aggregate`, and clients cannot append to it
        (:class:`~.errors.NotWritable`)."""

    async def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        """Add partitions up to ``partitions`` (never fewer: ValueError); KeyError when there
        is no such stream. The aggregates of the stream copy the new partitions too; an
        aggregate itself cannot grow (ValueError)."""

    async def drop_stream(self, name: str) -> bool:
        """Remove a stream with its events, consumers and tables; False when there is none.
        ValueError for ``events``, which cannot be dropped, and for a stream another one
        aggregates (naming that one)."""

    async def streams(self) -> list[StreamInfo]:
        """Every stream, by name."""

    async def stream(self, name: str) -> StreamInfo | None: ...

    async def streams_version(self) -> int:
        """A number every add, grow and drop moves on (in any process), and every change of
        a subject's schema versions (:class:`Schemas`): cheap to poll."""

    def listen_streams(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(version)`` after a change of the registry this store learns of at
        once (its own; on PostgreSQL, any process's); returns the function that stops it."""

    @property
    def hears_all_stream_changes(self) -> bool:
        """True when :meth:`listen_streams` hears every process's changes (PostgreSQL: also
        after its notification connection is restored): polling is then only a fallback."""

    async def consumer_counts(self, user_id: UserId | None = None) -> dict[int, int]:
        """Consumers (of one user, or all) by partition key, for the partitions that have
        any: one read, however many partitions there are."""

    def partition_log(self, partition: Partition) -> PartitionLog:
        """The log of one partition of this store (the same object for the same key while
        the store is open). ``events``/0 is the store itself."""


class PeerNews(Protocol):
    """What the worker processes of one server on one machine tell each other when the
    database itself does not carry it between processes (SQLite; PostgreSQL's notification
    channel does): a partition's new head, a claim of a consumer or of a consumer group, a
    change of the streams. Each method returns at once (the news goes out after the current
    loop turn)."""

    def committed(self, key: int, head: int) -> None:
        """Events up to id ``head`` of partition ``key`` are committed."""

    def claimed(self, key: int, user_id: UserId, component: str, epoch: int) -> None:
        """A push stream claimed the consumer (:meth:`Consumers.claim_consumer`)."""

    def group_claimed(self, key: int, user_id: UserId, group: str, claim: int, epoch: int) -> None:
        """A link took an AMQP consumer group (:meth:`ConsumerGroups.claim_group`)."""

    def streams_changed(self) -> None:
        """A stream was added, grown or dropped."""


class Store(
    PartitionLog,
    Streams,
    Aggregates,
    Keys,
    Users,
    Grants,
    Schemas,
    EventHubCheckpoints,
    KeptTermini,
    KafkaState,
    ConsoleSessionStore,
    ScramSource,
    Protocol,
):
    """A whole backend, opened by :func:`futoin_evt.storage.open_store`; as a log, the view
    of ``events``/0."""

    #: What group commit did, for the metrics.
    write_stats: WriteStats
    #: The damaged events its reads found (read by the metrics).
    damage_stats: DamageStats

    @property
    def description(self) -> str:
        """Where the data is, for logs (a path, or a URL without its password)."""

    def watch_other_writers(self, interval: float) -> None:
        """Notice events other processes commit within ``interval`` seconds (at the latest)."""

    def join_peers(self, peers: PeerNews, turns: Path | None = None) -> PeerNews | None:
        """Tell ``peers`` of this process's commits, claims and stream changes that the
        database does not carry to other processes; returns what applies the same news heard
        from them, or None when the database carries it all (PostgreSQL). ``turns``: a file
        the peers lock in turn around each commit where writers wait for one another
        (SQLite's one write lock)."""

    async def close(self) -> None:
        """Commit what is queued, then close; later writes raise :class:`~.errors.StoreClosed`."""

    async def __aenter__(self) -> Store: ...

    async def __aexit__(self, *_exc: object) -> None: ...
