"""Retention: discard events every registered reliable consumer has read, expire dead consumers.

FTN18 keeps an event in the active store until the last registered reliable consumer has
read it (2.3.1). Every partition of every stream is a log of its own, with its own
consumers and positions, and is discarded on its own under the one retention config. The
discarder deletes events at or below the partition's lowest consumer position, in chunks
that each hold the write lock only briefly, and pauses between chunks (``duty``), so
producers keep going at most of their speed while a large backlog is deleted. Without any
registered consumer nothing is discarded, unless a retention policy is set: then events
are deleted once they are outside the policy. A policy also always keeps the newest
``keep_events`` events and those younger than ``keep_seconds``, whatever was read. Events
an aggregated stream has not copied yet stay, whatever the rest allows.

A consumer whose user may no longer read the stream (a revoke) holds nothing back: before
each discard the discarding process drops the partition's lowest consumer while its user
lacks read there (after reading the grants again, so a grant this process has not loaded yet
is not taken for a revoke), announced as ``consumerDropped`` and listed with the expired
ones. A consumer of such a user that is not the lowest holds back nothing yet; it is
dropped when it would. Admins' consumers and the server's own (the built-in archiver's,
whose user cannot log in) are not judged by grants. A removed user's consumers go with them.

A consumer not seen for ``expire_consumers_after`` seconds (no poll, no acknowledgement, no
connected push stream) is dropped, logged, and listed in the stream information, so a dead
consumer cannot pin the store forever. The kept AMQP link termini that expired are deleted
too, every ``termini_purge_seconds`` (a resuming link deletes the one it looks at).

What was discarded and expired is kept in the memory of the process that did it. Of a
server's workers (``serve --workers``) one discards and expires; the others ask it for its
:class:`DiscardRecord` (:class:`DiscarderPeers`), so the stream information is the server's
whichever worker answers.

One task serves every partition: each turn visits at most ``partitions_per_turn`` of them,
round the registry from where the last turn stopped, and deletes at most
``chunks_per_turn`` chunks in all, so a turn's cost stays bounded with thousands of
partitions (each is visited every ``ceil(P / partitions_per_turn)`` turns). Processes
sharing a database each run one: the store lets one of them delete from a partition at a
time (PostgreSQL: a per-partition try-lock per chunk; SQLite: its one writer), and each
chunk's transaction bounds the deletion by the lowest position it reads itself, so two
processes never delete what a consumer has not acknowledged, and each counts only what it
deleted.

The same turns forget the producers' keys of events older than the dedup window (of every
partition at once, oldest first, in chunks of ``chunk`` within the turn's
``chunks_per_turn``), in the discarding process only; a key is stored with its event, so
this keeps their number to what the window holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from ..domain.management import (
    CONSUMER_DROPPED,
    CONSUMER_EXPIRED,
    EVENTS_DISCARDED,
    ManagementBus,
)
from ..domain.partition import DEFAULT_PARTITION, Partition, StreamInfo
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import UserId, utc_timestamp
from ..storage.base import DiscardLimits, RetentionStore
from .archive import NO_LOGIN

logger = logging.getLogger(__name__)


class Grants(Protocol):
    """Who may read which stream now (:class:`~.access.AccessControl`)."""

    def allows(self, caller: Principal, right: Right | int, stream: str) -> bool: ...

    async def catch_up(self) -> None:
        """Returns once the grants in the database are in use."""
        ...


#: Why a consumer of a user who lost read on its stream is dropped.
LOST_READ: Final = "its user may no longer read the stream"


#: Expired consumers remembered for the stream information (of every partition together).
_EXPIRED_SHOWN: Final = 100


@dataclass(frozen=True, slots=True)
class DiscardRecord:
    """What was discarded and expired on one partition since the discarding process started."""

    discarded: int
    #: (user, component) of the consumers expired lately, oldest first.
    expired: tuple[tuple[str, str], ...]


class DiscarderPeers(Protocol):
    """The other workers of the server, as one that does not discard sees them."""

    async def record_of(self, partition: Partition) -> DiscardRecord | None:
        """The discarding worker's record of ``partition``; None when it does not answer."""
        ...


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    #: Seconds between discard turns.
    interval: float = 1.0
    #: Events deleted per transaction.
    chunk: int = 1000
    #: Share of the time a discard pass may keep the writer busy; it pauses between chunks
    #: for the rest, so producers keep most of their throughput during a big discard.
    duty: float = 0.3
    keep_events: int | None = None
    keep_seconds: float | None = None
    expire_consumers_after: float | None = None
    #: Events appended through DCB are the system of record: discarded only when set.
    discard_dcb_events: bool = False
    #: Partitions visited per turn at most (the next turn goes on from there).
    partitions_per_turn: int = 100
    #: Chunks deleted per turn at most, over all the partitions it visits.
    chunks_per_turn: int = 100
    #: Seconds between two purges of the expired AMQP link termini (the first turn purges).
    termini_purge_seconds: float = 60.0

    @property
    def has_policy(self) -> bool:
        return self.keep_events is not None or self.keep_seconds is not None


def discard_bound(limits: DiscardLimits, config: RetentionConfig) -> int:
    """The newest id that may be deleted now (0: none)."""
    if limits.lowest_position is not None:
        bound = limits.lowest_position
    elif config.has_policy:
        bound = limits.newest_id
    else:
        return 0
    if config.keep_events is not None:
        bound = min(bound, limits.newest_id - config.keep_events)
    if config.keep_seconds is not None:
        bound = min(bound, limits.older_than_kept or 0)
    if limits.copied_up_to is not None:  # an aggregate has yet to copy the rest
        bound = min(bound, limits.copied_up_to)
    return max(bound, 0)


class PushStreams(Protocol):
    """The push door, as retention sees it: a connected reliable stream keeps its consumer."""

    def connected_consumers(self, partition: Partition) -> list[tuple[UserId, str]]:
        """(user, component) of each reliable push stream connected now on ``partition``."""
        ...


class Discarder:
    """Discards and expires on every partition ``streams`` lists (None: ``events``/0 only;
    the server passes its :class:`~.streams.StreamRegistry`, so partitions added or dropped
    while it runs are followed)."""

    def __init__(
        self,
        store: RetentionStore,
        push: PushStreams,
        config: RetentionConfig,
        notices: ManagementBus | None = None,
        streams: Iterable[StreamInfo] | None = None,
        *,
        discarding: bool = True,
        grants: Grants | None = None,
    ) -> None:
        """``grants``: the rights of the users; when given, a consumer whose user lost read
        on its stream no longer holds back discarding (see the module)."""
        self._store = store
        self._grants = grants
        #: False: another process of the server discards and expires; this one only keeps
        #: the consumers of its connected push streams seen.
        self._discarding = discarding
        self._notices = notices
        self._push = push
        self._streams = streams
        self.config = config
        #: Events discarded by this process since it started, per partition.
        self.discarded: dict[Partition, int] = {}
        self._expired: deque[tuple[Partition, str, str]] = deque(maxlen=_EXPIRED_SHOWN)
        #: The worker that discards, asked for its record when this one does not.
        self.peers: DiscarderPeers | None = None
        #: The key the next turn starts at (round the partitions by key).
        self._next_key = 0
        #: When the expired termini were purged last (monotonic clock).
        self._purged_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def with_config(self, config: RetentionConfig) -> Discarder:
        """Another discarder of the same partitions, under ``config``."""
        other = Discarder(
            self._store,
            self._push,
            config,
            self._notices,
            self._streams,
            discarding=self._discarding,
            grants=self._grants,
        )
        other.peers = self.peers
        return other

    @property
    def discarded_total(self) -> int:
        return sum(self.discarded.values())

    def discarded_in(self, partition: Partition) -> int:
        return self.discarded.get(partition, 0)

    def expired_in(self, partition: Partition) -> list[tuple[str, str]]:
        """(user, component) of the consumers of ``partition`` expired lately."""
        return list(self.record(partition.key).expired)

    def record(self, key: int) -> DiscardRecord:
        """What this process discarded and expired on the partition whose key is ``key``."""
        discarded = next((n for p, n in self.discarded.items() if p.key == key), 0)
        expired = tuple((user, component) for p, user, component in self._expired if p.key == key)
        return DiscardRecord(discarded, expired)

    async def server_record(self, partition: Partition) -> DiscardRecord:
        """The server's record of ``partition``, whichever worker asks: this process's when
        it discards, else the discarding worker's (this one's, when it does not answer)."""
        if not self._discarding and self.peers is not None:
            answer = await self.peers.record_of(partition)
            if answer is not None:
                return answer
        return self.record(partition.key)

    def partitions(self) -> list[Partition]:
        """The partitions served now, by key."""
        if self._streams is None:
            return [DEFAULT_PARTITION]
        return sorted((p for info in self._streams for p in info.partitions), key=_key)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="futoin-evt-discarder")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.turn()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("discard turn failed")
            await asyncio.sleep(self.config.interval)

    async def turn(self) -> int:
        """Expire and discard on the next partitions, within the turn's bounds; how many
        events went."""
        if self._discarding:
            await self._purge_termini()
        partitions = self.partitions()
        self._forget_dropped(partitions)
        start = next((i for i, p in enumerate(partitions) if p.key >= self._next_key), 0)
        due = (partitions[start:] + partitions[:start])[: self.config.partitions_per_turn]
        chunks = self.config.chunks_per_turn
        deleted = 0
        for partition in due:
            self._next_key = partition.key + 1
            try:
                await self.expire_consumers(partition)
                if not self._discarding:
                    continue
                count, used = await self._discard(partition, chunks)
            except Exception:
                if partition in self.partitions():
                    raise  # the store failed: the next turn goes on from the next partition
                continue  # dropped meanwhile
            deleted += count
            chunks -= used
            if chunks <= 0:
                break
        return deleted

    async def _purge_termini(self) -> None:
        now = time.monotonic()
        if (
            self._purged_at is not None
            and now - self._purged_at < self.config.termini_purge_seconds
        ):
            return
        self._purged_at = now
        purged = await self._store.purge_termini()
        if purged:
            logger.debug("purged %d expired AMQP link termini", purged)

    def _forget_dropped(self, partitions: list[Partition]) -> None:
        if self.discarded.keys() - set(partitions):
            served = set(partitions)
            self.discarded = {p: n for p, n in self.discarded.items() if p in served}

    async def bound(self, partition: Partition = DEFAULT_PARTITION) -> int:
        return discard_bound(await self._limits(partition), self.config)

    async def _limits(self, partition: Partition) -> DiscardLimits:
        keep_since = None
        if self.config.keep_seconds is not None:
            keep_since = utc_timestamp(time.time() - self.config.keep_seconds)
        return await self._store.partition_log(partition).discard_limits(keep_since)

    async def discard(self, partition: Partition = DEFAULT_PARTITION) -> int:
        """Delete everything of ``partition`` that may go now, chunk by chunk."""
        deleted, _chunks = await self._discard(partition, None)
        return deleted

    async def _discard(self, partition: Partition, max_chunks: int | None) -> tuple[int, int]:
        """(events deleted, chunks tried) in at most ``max_chunks`` chunks."""
        limits = await self._limits(partition)
        if limits.lowest_position is not None and await self._drop_unreadable(partition):
            limits = await self._limits(partition)
        bound = discard_bound(limits, self.config)
        if not bound:
            return 0, 0
        partition_log = self._store.partition_log(partition)
        dcb_events = self.config.discard_dcb_events
        deleted, chunks = await self._in_chunks(
            lambda chunk: partition_log.delete_events(bound, chunk, dcb_events=dcb_events),
            max_chunks,
        )
        if deleted:
            self.discarded[partition] = self.discarded.get(partition, 0) + deleted
            logger.debug("%s: discarded %d events up to id %d", partition, deleted, bound)
            if self._notices is not None:
                self._notices.publish(
                    EVENTS_DISCARDED,
                    stream=partition.stream,
                    partition=partition.number,
                    count=deleted,
                    upToId=bound,
                    reason="retention policy",
                )
        return deleted, chunks

    async def _drop_unreadable(self, partition: Partition) -> bool:
        """Drop the lowest consumer of ``partition`` while its user may not read the stream,
        as the grants are in the database (one look at the lowest when nothing is dropped);
        whether one was dropped."""
        grants = self._grants
        if grants is None:
            return False
        partition_log = self._store.partition_log(partition)
        fresh = dropped = False
        while (lowest := await partition_log.lowest_consumer()) is not None:
            name, user_id, component = lowest
            if grants.allows(Principal(user_id, name, False), Right.READ, partition.stream):
                break
            user = await self._store.get_user(name)
            if user is None or user.is_admin or user.password_hash == NO_LOGIN:
                break  # removed meanwhile (its consumers with it), or judged by no grant
            if not fresh:  # a grant given elsewhere may not be loaded here yet
                await grants.catch_up()
                fresh = True
                continue
            if await partition_log.drop_consumer(user_id, component):
                dropped = True
                self._lost_read(partition, name, component)
        return dropped

    def _lost_read(self, partition: Partition, user: str, component: str) -> None:
        logger.warning("consumer %s of user %s on %s dropped: %s", component, user, partition,
                    LOST_READ)  # fmt: skip
        # without ``by``: the server dropped it
        self._gone(CONSUMER_DROPPED, partition, user, component, LOST_READ)

    def _gone(
        self, event_type: str, partition: Partition, user: str, component: str, reason: str
    ) -> None:
        """A consumer the server dropped or expired: remembered for the stream's
        information, and announced."""
        self._expired.append((partition, user, component))
        if self._notices is not None:
            self._notices.publish(
                event_type,
                stream=partition.stream,
                partition=partition.number,
                user=user,
                component=component,
                reason=reason,
            )

    async def _in_chunks(
        self, delete: Callable[[int], Awaitable[int]], max_chunks: int | None
    ) -> tuple[int, int]:
        """(rows deleted, chunks tried): ``delete(chunk)`` until it deletes fewer than a
        chunk, or ``max_chunks`` times, pausing between chunks for the duty's share."""
        deleted = chunks = 0
        pause_per_busy = (1 - self.config.duty) / self.config.duty
        while max_chunks is None or chunks < max_chunks:
            started = time.monotonic()
            count = await delete(self.config.chunk)
            chunks += 1
            deleted += count
            if count < self.config.chunk:
                break
            await asyncio.sleep((time.monotonic() - started) * pause_per_busy)
        return deleted, chunks

    async def expire_consumers(self, partition: Partition = DEFAULT_PARTITION) -> None:
        if self.config.expire_consumers_after is None:
            return
        partition_log = self._store.partition_log(partition)
        # a connected stream is a live consumer
        await partition_log.touch_consumers(self._push.connected_consumers(partition))
        if not self._discarding:
            return
        seen_before = utc_timestamp(time.time() - self.config.expire_consumers_after)
        for user, component in await partition_log.expire_consumers(seen_before):
            logger.warning("consumer %s of user %s on %s expired: not seen since %s", component,
                        user, partition, seen_before)  # fmt: skip
            reason = f"not seen since {seen_before}"
            self._gone(CONSUMER_EXPIRED, partition, user, component, reason)


def _key(partition: Partition) -> int:
    return partition.key
