"""Push delivery (``futoin.evt.push`` readyToReceive, ``futoin.evt.receiver`` onEvents).

One :class:`PushStream` per readyToReceive. It reads groups of events from the store and
sends them to the consumer's own connection as ``onEvents`` requests, several at a time;
while one group is sent, the next one is read (one page ahead at most).

Reliable streams start after the consumer's stored position. ``seq`` counts from 0 with no
gap; a group is acknowledged by any reply that is not an error, and the stored position
moves (durably, as with pollEvents) to the end of the highest group acknowledged together
with all before it. An error reply or no reply in time sends the same group again after a
backoff that doubles up to a cap. A disconnect ends the stream; the next readyToReceive
resumes from the stored position, so a group that was in flight is sent again.

LIVE streams start at the newest event and store nothing. When the consumer reads slower
than events come, the oldest queued groups are dropped and ``seq`` skips one number for
each; replies, errors included, never stop delivery.

Streams wait for new events on the store's head watch: the writer wakes them on commit, and
no stream polls the database while it is caught up.

One stream per (partition, user, component): a new readyToReceive takes over and the older
stream stops, so a consumer that restarts is never blocked by its own half-open old connection.
The claim reaches the other processes on one database through the partition's claim watch
(PostgreSQL: the notification channel, naming the partition), and their older stream stops
too; one that missed the claim stops at its next acknowledgement, fenced by the epoch. For
LIVE, one stream per connection and user.

When the database does not answer (:class:`StoreUnreachable`: a restart, an exhausted pool),
a stream keeps its connection and tries again after a backoff, for reads and for storing its
position alike. A read that finds a damaged event (:class:`DamagedEvent`) ends the stream and
closes its connection with the error's sentence: the receiver is told, and reconnects to the
same refusal until the event is repaired.

A stream needs ``read`` on its stream, at readyToReceive and for as long as it runs: when
that right is revoked, the stream stops and its connection is closed with WebSocket code
1008 and the refusal's sentence (a receiver that connects again is refused with it).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ..domain.management import CONSUMER_TAKEN_OVER, PUSH_RETRY, ManagementBus
from ..domain.partition import DEFAULT_PARTITION, Partition
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import LIVE_COMPONENT, UserId
from ..ftn3.calls import CallContext, Deferred, PeerLink
from ..ftn3.errors import FTN3Error
from ..ftn3.messages import Response
from ..log.access import AccessDenied, Refused
from ..log.consumers import PositionPastHead
from ..log.eventlog import (
    DamagedEvent,
    EventLog,
    EventPage,
    StoreUnreachable,
    retrieve_quietly,
)
from ..storage.head import HeadWatch
from .services import NOT_REGISTERED

logger = logging.getLogger(__name__)

ON_EVENTS: Final = "futoin.evt.receiver:1.1:onEvents"
#: ``{"seq":...,"events":`` ... ``}`` and the request envelope around a group.
_GROUP_ENVELOPE_BYTES: Final = 256
#: onEvents of receiver 1.1 accepts 8 MiB: no configured group size goes above it.
_RECEIVER_MAX_GROUP_BYTES: Final = 8 * 1024 * 1024 - _GROUP_ENVELOPE_BYTES
#: Longest wait before a stream tries an unreachable database again.
_STORE_RETRY_MAX: Final = 1.0
#: Seconds a reliable stream sends on after the database last confirmed its claim (the
#: claim itself, or an acknowledgement fenced by its epoch); past that it confirms again
#: before it sends. A process cut off from the database, or paused, stops sending to its
#: receiver within this once another process may have taken the consumer over; a link to
#: the database whose round trips take longer slows delivery down to one turn per round trip.
CLAIM_FRESH: Final = 0.25
#: How often a group waiting to be sent again looks whether the claim was confirmed.
_CONFIRM_POLL: Final = CLAIM_FRESH / 5
#: Seconds from a claim's check to the end of the write it allowed past which the process
#: was stalled (paused) in between; with the claim lapsed by then, the write is reported.
_STALLED: Final = CLAIM_FRESH / 5


@dataclass(frozen=True, slots=True)
class PushConfig:
    #: Groups a reliable stream has in flight at once.
    window: int = 4
    #: Largest group; receiver 1.1 accepts 8 MiB, smaller groups bound memory per stream.
    max_group_bytes: int = 1024 * 1024
    #: How long to wait for more events before sending a group (0: send at once).
    batch_delay: float = 0.0
    #: How long a receiver may take to answer onEvents before the group counts as failed.
    reply_timeout: float = 30.0
    #: First retry delay of a failed group; doubles on each failure up to ``retry_max``.
    retry_initial: float = 0.05
    retry_max: float = 10.0
    #: LIVE: groups queued for a slow consumer before the oldest are dropped.
    live_queue_groups: int = 8


@dataclass(slots=True)
class _Group:
    seq: int
    last_id: int
    #: The onEvents parameters, built once (not between a claim's check and the write).
    params_json: str
    attempts: int = 0
    retry: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, seq: int, last_id: int, events_json: str) -> _Group:
        return cls(seq, last_id, f'{{"seq":{seq},"events":{events_json}}}')


@dataclass(slots=True)
class StreamStats:
    """What an operator sees of a stream (consumer info)."""

    groups_sent: int = 0
    groups_acked: int = 0
    groups_failed: int = 0
    groups_dropped: int = 0
    #: Failures in a row of the group now being retried (0: nothing failing).
    retrying: int = 0


@dataclass(slots=True)
class PushStream:
    service: PushService
    #: The partition's log: where the events come from and the position is stored.
    log: EventLog
    #: (partition key, user, component), and the connection's id for LIVE.
    key: tuple[Any, ...]
    link: PeerLink
    #: The consumer's user: the stream reads and acknowledges as them.
    who: Principal
    component: str
    want: list[str] | None
    reliable: bool
    next_id: int
    #: The consumer's epoch when this stream claimed it (reliable streams).
    epoch: int = 0
    stats: StreamStats = field(default_factory=StreamStats)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _in_flight: dict[int, _Group] = field(default_factory=dict)
    _queued: deque[_Group] = field(default_factory=deque)
    #: Acknowledged groups (seq -> last id) waiting for a lower seq to be acknowledged.
    _acked: dict[int, int] = field(default_factory=dict)
    _next_contiguous: int = 0
    _acked_to: int = 0
    #: Read past unwanted events up to here; acknowledged once nothing is in flight.
    _skip_to: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    #: Storing the position again after the database did not answer.
    _ack_retry: asyncio.TimerHandle | None = None
    #: The stored (durable) position, as this stream moved it.
    durable: HeadWatch = field(default_factory=HeadWatch)
    #: The page being read ahead, and the id it starts after.
    _ahead: tuple[int, asyncio.Future[EventPage]] | None = None
    #: Stops watching the consumer's read right on the stream.
    unwatch: Callable[[], None] = field(default=lambda: None)
    #: When (monotonic) the query that last confirmed the claim was sent; a confirmation is
    #: under way.
    confirmed_at: float = 0.0
    _confirming: bool = False
    #: When the claim was last found fresh (:meth:`_claim_fresh`), before a send.
    _checked_at: float = 0.0
    #: The task waits for news (the head, a reply, room to write): a commit may send at once.
    _waiting: bool = False
    #: The context the stream's task runs in (the connection's, for its log lines), for what
    #: a commit sends at once.
    _context: contextvars.Context = field(default_factory=contextvars.Context)

    @property
    def config(self) -> PushConfig:
        return self.service.config

    @property
    def user_id(self) -> UserId:
        return self.who.user_id

    @property
    def partition(self) -> Partition:
        return self.log.partition

    def start(self) -> None:
        self._acked_to = self.next_id
        self._context = contextvars.copy_context()
        self._task = asyncio.create_task(self._run(), name=f"push {self.component}")

    def stop(self) -> None:
        self.unwatch()
        if self._task is not None:
            self._task.cancel()
        if self._ack_retry is not None:
            self._ack_retry.cancel()
        for group in self._in_flight.values():
            if group.retry is not None:
                group.retry.cancel()

    @property
    def _group_bytes(self) -> int:
        return min(self.config.max_group_bytes, _RECEIVER_MAX_GROUP_BYTES)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def queued(self) -> int:
        return len(self._queued)

    async def _run(self) -> None:
        try:
            await self._deliver()
        except asyncio.CancelledError:
            raise
        except DamagedEvent as exc:  # logged once per event by the store
            self.link.close_refused(str(exc))
        except Exception:
            logger.exception("push stream %s of user %s failed", self.component, self.user_id)
        finally:
            self.unwatch()
            self.service.forget(self)

    async def _deliver(self) -> None:
        events = self.log
        closed = self.link.closed
        stop_listening = events.listen(self._head_moved)
        stop_waiting = self.link.on_writable(self._wake.set)
        closed.add_done_callback(lambda _closed: self._wake.set())
        failures = 0
        try:
            while not closed.done():
                if self._room_for_more() and events.head > self.next_id:
                    try:
                        page = await self._next_page()
                    except StoreUnreachable as exc:
                        failures += 1
                        await self._wait_for_store(exc, failures)
                        continue
                    failures = 0
                    if page.count:
                        self._read_ahead(page)
                        self._enqueue(page)
                        self._send_queued()
                        continue
                    if page.head_id > self.next_id:  # nothing wanted up to the head
                        self.next_id = page.head_id
                        self._skip_to = page.head_id
                self._skip_unwanted()
                self._send_queued()
                self._wake.clear()
                if self._room_for_more() and events.head > self.next_id:
                    continue  # more came while this turn ran
                self._waiting = True
                try:
                    await self._wake.wait()
                finally:
                    self._waiting = False
                if self.config.batch_delay and events.head > self.next_id:
                    await asyncio.sleep(self.config.batch_delay)
        finally:
            stop_listening()
            stop_waiting()
            if self._ahead is not None:
                self._ahead[1].cancel()

    def _head_moved(self) -> None:
        """New events: sent at once, in the loop turn of the commit that made them, when the
        stream waits with nothing queued and the recent events hold them; else the stream's
        task wakes to read them."""
        if self._waiting and not self.config.batch_delay:
            try:  # as the task would: its log lines and replies in the connection's context
                if self._context.run(self._send_recent):
                    return
            except Exception:  # the task reads again, meets it and handles it
                pass
        self._wake.set()

    def _send_recent(self) -> bool:
        """Send what the recent events hold after :attr:`next_id`; True when that was all
        up to the head and went out."""
        if self._queued or not (self._room_for_more() and self.link.writable):
            return False
        page = self.log.read_recent_page(
            self.who,
            self.next_id,
            types=self.want,
            max_bytes=self._group_bytes,
            ftn18_only=True,
        )
        if page is None or not page.count:
            return False
        self._enqueue(page)
        self._send_queued()
        return not self._queued and self.log.head <= self.next_id

    async def _wait_for_store(self, exc: StoreUnreachable, failures: int) -> None:
        delay = min(self.config.retry_initial * 2 ** (failures - 1), _STORE_RETRY_MAX)
        logger.warning(
            "push stream %s of user %s cannot read (%s); again in %.2fs",
            self.component, self.user_id, exc, delay,
        )  # fmt: skip
        await asyncio.sleep(delay)

    def _room_for_more(self) -> bool:
        if self.reliable:
            return len(self._in_flight) + len(self._queued) < self.config.window
        return True  # LIVE keeps reading and drops the oldest queued groups instead

    async def _next_page(self) -> EventPage:
        """The page after ``next_id``: the one read ahead when it starts there."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            after_id, page = ahead
            if after_id == self.next_id:
                return await page
            page.cancel()
        return await self._read(self.next_id)

    def _read_ahead(self, page: EventPage) -> None:
        """Start reading the page after ``page`` while ``page`` is sent: at most one page
        ahead, and only when there is more and room in the window to send it."""
        room = not self.reliable or (
            len(self._in_flight) + len(self._queued) + 1 < self.config.window
        )
        if room and self.log.head > page.last_id:
            ahead = asyncio.ensure_future(self._read(page.last_id))
            ahead.add_done_callback(retrieve_quietly)
            self._ahead = (page.last_id, ahead)

    async def _read(self, after_id: int) -> EventPage:
        # up to the head this process knows: the stream reads on when it moves
        return await self.log.read_page(
            self.who,
            after_id,
            types=self.want,
            max_bytes=self._group_bytes,
            ftn18_only=True,
            up_to_head=True,
        )

    def _skip_unwanted(self) -> None:
        """Nothing wanted was left: once every group before is acknowledged, the unwanted
        tail counts as delivered too (FTN18 2.2.3)."""
        if self.reliable and self._skip_to and not self._in_flight and not self._queued:
            self._advance_position(self._skip_to)
            self._skip_to = 0

    def _enqueue(self, page: EventPage) -> None:
        group = _Group.of(next(self._seq), page.last_id, page.json)
        self.next_id = page.last_id
        self._queued.append(group)
        if not self.reliable:
            while len(self._queued) > self.config.live_queue_groups:
                self._queued.popleft()  # its seq is skipped: the receiver sees the gap
                self.stats.groups_dropped += 1

    def _claim_fresh(self) -> bool:
        """LIVE, or the claim confirmed within :data:`CLAIM_FRESH` (else it is confirmed
        again, and the stream woken when it is)."""
        if not self.reliable:
            return True
        now = time.monotonic()
        if now - self.confirmed_at <= CLAIM_FRESH:
            self._checked_at = now
            return True
        if not self._confirming:
            self._confirming = True
            self.service.acknowledge(self, self._acked_to)
        return False

    def _send_queued(self) -> None:
        while self._queued and self.link.writable and self.link.is_open:
            if self.reliable and len(self._in_flight) >= self.config.window:
                return
            if not self._claim_fresh():
                return
            self._send(self._queued.popleft())

    def _send(self, group: _Group) -> None:
        """Send ``group``: a reliable one is written to the socket at once, while the claim
        is known to be fresh (not at the end of the loop turn, which a pause of the process
        could put after a takeover)."""
        group.attempts += 1
        self.stats.groups_sent += 1
        self._in_flight[group.seq] = group
        reply = self.link.request(
            ON_EVENTS, group.params_json, self.config.reply_timeout, now=self.reliable
        )
        reply.add_done_callback(lambda done: self._on_reply(group, done))
        if self.reliable:
            now = time.monotonic()
            if now - self._checked_at > _STALLED and now - self.confirmed_at > CLAIM_FRESH:
                self._written_late(group)

    def _written_late(self, group: _Group) -> None:
        """The process was paused (or stalled) between the claim's check and the write, and
        the claim lapsed meanwhile: the group may have left after another process took the
        consumer over. Nothing can take it back (FTN18's receivers take no fencing token);
        the log says which it was."""
        logger.warning(
            "onEvents seq %d (events to id %d) to user %s %s was written %.2f s after its "
            "claim was last confirmed (this process was paused or stalled): the consumer's "
            "new owner may deliver these events again",
            group.seq, group.last_id, self.user_id, self.component,
            time.monotonic() - self.confirmed_at,
        )  # fmt: skip

    def _on_reply(self, group: _Group, done: Deferred[Response]) -> None:
        failure = _failure(done)  # always look: an unread exception would be logged as lost
        if self._task is None or self._task.done():
            return  # stopped: a newer stream or a closed connection owns the consumer now
        if failure is not None and self.reliable:
            if self.link.is_open:  # else the stream ends; the next one starts over
                self._schedule_retry(group, failure)
            return
        del self._in_flight[group.seq]
        self.stats.groups_acked += 1
        self.stats.retrying = 0
        if self.reliable:
            self._acked[group.seq] = group.last_id
            last_id = 0
            while self._next_contiguous in self._acked:
                last_id = self._acked.pop(self._next_contiguous)
                self._next_contiguous += 1
            if last_id:
                self._advance_position(last_id)
        self._wake.set()

    def _schedule_retry(self, group: _Group, failure: str) -> None:
        self.stats.groups_failed += 1
        self.stats.retrying = group.attempts
        delay = min(self.config.retry_initial * 2 ** (group.attempts - 1), self.config.retry_max)
        logger.warning(
            "onEvents seq %d to user %s %s failed (%s); retry %d in %.2fs",
            group.seq, self.user_id, self.component, failure, group.attempts, delay,
        )  # fmt: skip
        group.retry = asyncio.get_running_loop().call_later(delay, self._retry, group)
        notices = self.service.notices
        if notices is not None:
            notices.publish(
                PUSH_RETRY,
                stream=self.partition.stream,
                partition=self.partition.number,
                user=self.who.name,
                component=self.component,
                seq=group.seq,
                attempts=group.attempts,
                delaySeconds=delay,
                reason=failure[:200],
            )

    def _retry(self, group: _Group) -> None:
        group.retry = None
        if self._task is None or self._task.done() or self.link.closed.done():
            return
        if not self._claim_fresh():
            group.retry = asyncio.get_running_loop().call_later(_CONFIRM_POLL, self._retry, group)
            return
        del self._in_flight[group.seq]
        self._send(group)

    def _advance_position(self, last_id: int) -> None:
        if last_id > self._acked_to:
            self._acked_to = last_id
            self.service.acknowledge(self, last_id)


def _failure(reply: Deferred[Response]) -> str | None:
    """Why an onEvents reply does not acknowledge its group, or None when it does."""
    if reply.cancelled():
        return "cancelled"
    exc = reply.exception()
    if exc is not None:
        return str(exc) or type(exc).__name__
    error: str | None = reply.result().error
    return error


#: A reliable consumer's push stream: partition key, user, component.
StreamKey = tuple[int, UserId, str]


class PushPeers(Protocol):
    """The other workers of this server (``serve --workers``), as the push streams see them."""

    def pushes_changed(self) -> None:
        """This worker's reliable streams may have changed (the others learn of it)."""

    def pushing_elsewhere(self) -> set[StreamKey]:
        """The reliable streams the other workers hold."""

    def stop_elsewhere(self, key: StreamKey) -> None:
        """Stop the stream of ``key`` on the other workers (an operator's seek or drop)."""


class PushService:
    """``readyToReceive``: starts, and takes over, push streams, on every partition served.

    A partition's streams start with :meth:`receiver` of its log; ``events`` is the log of
    ``events``/0, whose claims are heard from the start. Streams are keyed by partition key
    first. It is the consumers' :class:`~futoin_evt.log.consumers.Deliveries`: a drop or a
    seek stops a consumer's stream (:meth:`stop_stream`).
    """

    def __init__(
        self,
        events: EventLog,
        config: PushConfig = PushConfig(),
        notices: ManagementBus | None = None,
    ) -> None:
        self.config = config
        #: Told of takeovers and retries (management events), when given.
        self.notices = notices
        self._streams: dict[tuple[Any, ...], PushStream] = {}
        self._acks: set[asyncio.Task[Any]] = set()
        #: Partition key -> how to stop hearing its claims (listened to from its first stream).
        self._claim_stops: dict[int, Callable[[], None]] = {
            DEFAULT_PARTITION.key: events.consumers.claims.listen(
                functools.partial(self._claimed, DEFAULT_PARTITION.key)
            )
        }
        #: Partitions whose head watch this process has read from the database once.
        self._primed: set[int] = {DEFAULT_PARTITION.key}
        #: The other workers of this server, when it is one of several.
        self.peers: PushPeers | None = None

    @property
    def streams(self) -> list[PushStream]:
        """The streams of ``events``/0 (what the ops calls and the metrics show)."""
        return [s for s in self._streams.values() if s.key[0] == DEFAULT_PARTITION.key]

    @property
    def all_streams(self) -> list[PushStream]:
        """The streams of every partition (keyed by partition key first)."""
        return list(self._streams.values())

    def reliable_keys(self) -> set[StreamKey]:
        """The reliable streams of this process, on every partition."""
        return {(s.key[0], s.user_id, s.component) for s in self._streams.values() if s.reliable}

    def pushing_elsewhere(self) -> set[StreamKey]:
        """The reliable streams other workers of this server hold (none with one process)."""
        return set() if self.peers is None else self.peers.pushing_elsewhere()

    def _changed(self) -> None:
        if self.peers is not None:
            self.peers.pushes_changed()

    def connected_consumers(self, partition: Partition) -> list[tuple[UserId, str]]:
        """The reliable consumers with a push stream connected now on ``partition``."""
        return [
            (s.user_id, s.component)
            for s in self._streams.values()
            if s.reliable and s.key[0] == partition.key
        ]

    def receiver(
        self, events: EventLog
    ) -> Callable[[CallContext[Principal], dict[str, Any]], Coroutine[Any, Any, bool]]:
        """``readyToReceive`` on the partition of ``events``."""
        key = events.partition.key

        async def ready_to_receive(ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
            events.guard.read(ctx.principal)  # LIVE too, and before anything is done
            if key not in self._primed:
                await events.catch_up()
                self._primed.add(key)
            if key not in self._claim_stops:
                claims = events.consumers.claims
                self._claim_stops[key] = claims.listen(functools.partial(self._claimed, key))
            return await self._start(events, key, ctx, params)

        return ready_to_receive

    async def _start(
        self,
        events: EventLog,
        partition_key: int,
        ctx: CallContext[Principal],
        params: dict[str, Any],
    ) -> bool:
        if ctx.link is None:
            raise FTN3Error("SecurityError", "Bi-directional channel is required")
        component: str = params["component"]
        who = ctx.principal
        user_id = who.user_id
        reliable = component != LIVE_COMPONENT
        key: tuple[Any, ...]
        epoch = 0
        confirmed_at = 0.0
        if reliable:
            # The stream owns the consumer in the whole cluster until another one claims it.
            claiming = time.monotonic()
            claimed = await events.consumers.claim(who, component)
            if claimed is None:
                raise FTN3Error(NOT_REGISTERED, f"Consumer is not registered: {component}")
            epoch, position = claimed
            key = (partition_key, user_id, component)
            # the claim's query was sent at or after this
            confirmed_at = claiming
        else:
            position = events.head
            key = (partition_key, user_id, component, id(ctx.link))
        events.guard.read(who)  # again: a revoke while claiming is not watched for
        previous = self._streams.pop(key, None)
        if previous is not None:
            logger.info("push stream %s of user %s taken over", component, user_id)
            previous.stop()
            if self.notices is not None and reliable:
                self.notices.publish(
                    CONSUMER_TAKEN_OVER,
                    stream=events.partition.stream,
                    partition=events.partition.number,
                    user=who.name,
                    component=component,
                    transport="ws",
                    epoch=epoch,
                    reason="a newer readyToReceive took the consumer over",
                )
        stream = PushStream(
            service=self,
            log=events,
            key=key,
            link=ctx.link,
            who=who,
            component=component,
            want=params["want"],
            reliable=reliable,
            next_id=position,
            epoch=epoch,
            confirmed_at=confirmed_at,
        )
        self._streams[key] = stream
        stream.unwatch = events.guard.watch(who, Right.READ, lambda: self._revoked(stream))
        stream.start()
        if reliable:
            self._changed()
        return True

    def _revoked(self, stream: PushStream) -> None:
        """The consumer's read right went: the stream stops, its connection is closed with
        the refusal."""
        logger.info("push stream %s of user %s: read right revoked", stream.component,
                 stream.user_id)  # fmt: skip
        self.forget(stream)
        stream.stop()
        stream.link.close_refused(str(AccessDenied(Right.READ, stream.partition.stream)))

    def acknowledge(self, stream: PushStream, last_id: int) -> None:
        """Store the stream's position, fenced by its epoch: stored, it confirms the claim
        as of when it was sent; refused, the stream stops."""
        asked = time.monotonic()
        task = asyncio.ensure_future(
            stream.log.consumers.acknowledge(
                stream.who, stream.component, last_id, epoch=stream.epoch
            )
        )
        self._acks.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._acks.discard(task)
            stream._confirming = False
            if task.cancelled():
                return
            failure = task.exception()
            if isinstance(failure, StoreUnreachable):
                self._store_again(stream, failure)
            elif isinstance(failure, PositionPastHead):  # only ids sent move it: a fault
                logger.error("push stream %s of user %s stops: %s", stream.component,
                          stream.user_id, failure)  # fmt: skip
                self.forget(stream)
                stream.stop()
            elif isinstance(failure, Refused):  # revoked meanwhile: the stream is ending
                logger.debug("push acknowledgement refused: %s", failure)
            elif failure is not None:
                logger.error("storing a push acknowledgement failed: %s", failure)
            elif task.result() is None:
                # Claimed by a newer stream (perhaps on another process), or dropped.
                logger.info("push stream %s of user %s taken over", stream.component,
                         stream.user_id)  # fmt: skip
                self.forget(stream)
                stream.stop()
            else:
                stream.confirmed_at = max(stream.confirmed_at, asked)
                stream.durable.advance(last_id)
                stream._wake.set()  # sends held for a confirmation go on

        task.add_done_callback(done)

    def _store_again(self, stream: PushStream, failure: StoreUnreachable) -> None:
        """Store the stream's position again later (once at a time, newest position)."""
        if self._streams.get(stream.key) is not stream or stream._ack_retry is not None:
            return
        logger.warning("storing the position of %s failed (%s); again in %.2fs",
                    stream.component, failure, _STORE_RETRY_MAX)  # fmt: skip

        def again() -> None:
            stream._ack_retry = None
            if self._streams.get(stream.key) is stream:
                self.acknowledge(stream, stream._acked_to)

        stream._ack_retry = asyncio.get_running_loop().call_later(_STORE_RETRY_MAX, again)

    def _claimed(self, partition_key: int, user_id: UserId, component: str, epoch: int) -> None:
        """A claim, perhaps on another process: a stream here with an older epoch stops."""
        stream = self._streams.get((partition_key, user_id, component))
        if stream is None or stream.epoch >= epoch:
            return
        logger.info("push stream %s of user %s taken over elsewhere", component, user_id)
        del self._streams[stream.key]
        stream.stop()
        self._changed()
        if self.notices is not None:
            self.notices.publish(
                CONSUMER_TAKEN_OVER,
                stream=stream.partition.stream,
                partition=stream.partition.number,
                user=stream.who.name,
                component=component,
                transport="ws",
                epoch=epoch,
                reason="a newer readyToReceive on another process took the consumer over",
            )

    def stop_stream(
        self, user_id: UserId, component: str, partition: Partition = DEFAULT_PARTITION
    ) -> None:
        """Stop a consumer's stream and drop its connection, so its receiver reconnects and
        starts from the stored position (after a seek or a drop), on every worker."""
        self.stop_here((partition.key, user_id, component))
        if self.peers is not None:
            self.peers.stop_elsewhere((partition.key, user_id, component))

    def stop_here(self, key: StreamKey) -> None:
        """:meth:`stop_stream` in this process only."""
        stream = self._streams.pop(key, None)
        if stream is not None:
            stream.stop()
            stream.link.abort()
            self._changed()

    def forget_partition(self, partition: Partition) -> None:
        """The partition is gone (its stream dropped): its streams stop and their connections
        drop, so receivers reconnect and learn it is gone."""
        for key, stream in list(self._streams.items()):
            if key[0] == partition.key:
                del self._streams[key]
                stream.stop()
                stream.link.abort()
        self._changed()
        stop = self._claim_stops.pop(partition.key, None)
        if stop is not None:
            stop()
        self._primed.discard(partition.key)

    def forget(self, stream: PushStream) -> None:
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]
            if stream.reliable:
                self._changed()

    async def close(self) -> None:
        """Stop every stream and let stored acknowledgements finish."""
        for stop in self._claim_stops.values():
            stop()
        self._claim_stops.clear()
        for stream in list(self._streams.values()):
            stream.stop()
        self._streams.clear()
        self._changed()
        if self._acks:
            await asyncio.gather(*self._acks, return_exceptions=True)
