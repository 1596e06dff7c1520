""":class:`ConsumerLink`: the events of one partition for a receiving link (bound to a consumer
or a consumer group, perhaps resuming a durable terminus), and :class:`Attaching`, such a link
while what its attach waits for is on its way to the database."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final

from ...domain.stream import StoredEvent, UserId
from ...log.consumers import PositionPastHead
from ...log.eventlog import EventLog, retrieve_quietly
from ...quoting import quote_input
from ..codec import EventEncoder, Position
from ..engine.conditions import INTERNAL_ERROR, LINK_STOLEN, PRECONDITION_FAILED
from ..engine.performatives import Accepted, Modified, Rejected, Released
from ..engine.session import Delivery, Link
from ..links import SourceLink
from ..resume import MAX_UNSETTLED, KeptTerminus
from ..table import ConnectionView
from .recovery import SESSION_END, Recovery

logger = logging.getLogger(__name__)

#: Events read from the store for a consumer at once (less when its credit is lower).
READ_BATCH: Final = 1000
#: Encodes the events the consumer links send (this one and the partition-agnostic).
ENCODER: Final = EventEncoder()

#: A tag the peer's unsettled map does not have.
_ABSENT: Final = object()


class ConsumerLink(SourceLink):
    """Events after the start position, one per unit of credit, in id order.

    Bound to a registered consumer, the link starts at its stored position when it has no
    filter, and moves that position as the consumer settles what it was sent: up to just
    before the oldest delivery not yet accepted (or rejected), in one write at a time. With
    ``fence`` (its consumer group and claim), a write after another link took the group
    moves nothing, and the link is detached as stolen.

    With ``recovery`` (a durable source), a suspended link leaves its terminus to the node's
    :class:`~.resume.Termini`, and a link that resumes one settles, sends again and goes on
    as AMQP 2.6.13 says (:meth:`_resume`).
    """

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        events: EventLog,
        start: Position | None,
        *,
        properties: Mapping[Any, Any] | None = None,
        binding: tuple[UserId, str] | None = None,
        fence: tuple[str, int] | None = None,
        on_closed: Callable[[asyncio.Future[None] | None], asyncio.Future[None] | None]
        | None = None,
        event_hubs: bool = False,
        partition: int = 0,
        recovery: Recovery | None = None,
        head: int | None = None,
    ) -> None:
        """``on_closed`` is given the write of the position still on its way (if any) and
        returns what the detach's answer waits for; ``head``: the log's head at the attach
        (now when None)."""
        #: Opened through an Event Hubs address: JSON goes out as a ``data`` section.
        self._event_hubs = event_hubs
        #: No filter: events added from the attach on (seed 3.2), or the bound consumer's
        #: position.
        self._start = (
            start if start is not None else Position(events.head if head is None else head)
        )
        self._filtered = start is not None
        self._binding = binding
        self._fence = fence
        self._released = on_closed
        self._after = 0
        self._unsettled: deque[int] = deque()
        self._done: set[int] = set()
        self._ack_wanted = 0
        self._acked = 0
        self._acking: asyncio.Task[None] | None = None
        self._recovery = recovery
        self._partition = partition
        #: Ids sent and not settled, kept when the link is suspended (a durable source).
        self._open: set[int] | None = set() if recovery is not None else None
        self._stop_listening = events.listen(self._on_head)
        kept = recovery.kept if recovery is not None else None
        ours = None
        if kept is not None and recovery is not None and recovery.durable == 2:
            ours = dict.fromkeys((b"%d" % i for i in kept.unsettled), None)
        super().__init__(
            conn,
            link,
            events,
            properties,
            partition,
            source=recovery.source if recovery is not None else None,
            unsettled=ours,
            incomplete_unsettled=ours is not None and kept is not None and kept.incomplete,
        )

    def _on_head(self) -> None:
        self._wake.set()

    def on_closed(self) -> asyncio.Future[None] | None:
        """The detach is answered once the accepted part of what was sent is stored (and
        the consumer group released), and the terminus of a suspended link."""
        self._stop_listening()
        keeping = None
        if self._recovery is not None and self._link.suspended and not self._closed:
            keeping = self._keep(self._recovery)
        super().on_closed()
        if self._released is not None:
            return _joined(self._released(self._acking), keeping)
        return _joined(self._acking, keeping)

    def _keep(self, recovery: Recovery) -> asyncio.Future[None]:
        """Leave the terminus to the node: the oldest ids, within the bound; the future of
        its write."""
        assert self._open is not None
        held = [i for i in self._unsettled if i not in self._done]
        unsettled = sorted(self._open)
        after = self._after
        ids = sorted({*held, *unsettled})
        incomplete = len(ids) > MAX_UNSETTLED
        if incomplete:  # beyond the bound: what follows the newest kept id is sent again
            after = ids[MAX_UNSETTLED - 1]
            held = [i for i in held if i <= after]
            unsettled = [i for i in unsettled if i <= after]
        if recovery.durable == 1:  # the position alone: from the oldest unsettled on
            after = min(after, unsettled[0] - 1) if unsettled else after
            unsettled = []
        terminus = KeptTerminus(
            recovery.key,
            self._events.partition.key,
            recovery.group,
            recovery.durable,
            tuple(unsettled),
            incomplete,
            after,
            tuple(held),
            self._acked,
            float(recovery.timeout),
        )
        termini = recovery.termini
        kept, written = termini.keep(terminus)
        session = recovery.expiry == SESSION_END
        kept.cancel_wait = self._conn.when_ended(
            self._link, session, lambda: termini.expire_later(kept)
        )
        return written

    async def _start_after(self) -> int:
        after = self._start.after_id
        if self._binding is not None:
            _user_id, component = self._binding
            consumers = self._events.consumers
            await consumers.register(self._who, component, transport="amqp")
            position = await consumers.position(self._who, component)
            if not self._filtered and position is not None:
                after = position
        return await self._after_time(self._events, self._start, after)

    def _resume(self, kept: KeptTerminus) -> list[tuple[int, Any]]:
        """Take over the kept terminus: where to go on, what holds a group's position, and
        what to send first, as (event id, the peer's state): by the peer's unsettled map, a
        terminal accepted or rejected is settled (a resumed transfer with no payload), a
        released or modified one is settled and sent again, one with no state is resumed
        whole, one the peer does not know is sent again as a new delivery."""
        recovery = self._recovery
        assert recovery is not None
        self._after = kept.after
        self._acked = kept.acked
        if recovery.durable != 2 or kept.durable != 2:
            if kept.unsettled:  # kept with its deliveries, resumed with the position alone
                self._after = min(self._after, kept.unsettled[0] - 1)
            # what is read again from the position is held back by its new deliveries
            self._unsettled.extend(i for i in kept.held if i <= self._after)
            return []
        self._unsettled.extend(kept.held)
        peer = recovery.peer_unsettled
        if self._open is not None:  # unsettled until settled again (or suspended again)
            self._open.update(kept.unsettled)
        return [(event_id, peer.get(b"%d" % event_id, _ABSENT)) for event_id in kept.unsettled]

    async def _send_first(self, first: list[tuple[int, Any]]) -> None:
        """Send what the resumed terminus owes, as credit allows (each item a transfer)."""
        link = self._link
        encode = ENCODER.encode
        items: deque[tuple[int, Any]] = deque()
        for event_id, state in first:
            items.append((event_id, state))
            if isinstance(state, Released | Modified):
                items.append((event_id, _ABSENT))  # settled, then sent again
        while items:
            self._wake.clear()
            if link.credit <= 0 or not self._conn.writable:
                await self._wake.wait()
                continue
            chunk = list(itertools.islice(items, min(link.credit, READ_BATCH)))
            found = await self._read_ids({event_id for event_id, _state in chunk})
            for event_id, state in chunk:
                if link.credit <= 0:
                    break
                items.popleft()
                tag = b"%d" % event_id
                event = found.get(event_id)
                opened = self._open
                assert opened is not None
                if isinstance(state, Accepted | Rejected | Released | Modified):
                    link.send(b"", tag, settled=True, resume=True, state=state)
                    if isinstance(state, Accepted | Rejected):
                        self._done.add(event_id)
                        opened.discard(event_id)
                elif event is None:  # gone from the log (retention): nothing to send again
                    if state is not _ABSENT:
                        link.send(b"", tag, settled=True, resume=True)
                    self._done.add(event_id)
                    opened.discard(event_id)
                else:
                    message = encode(event, self._event_hubs)
                    delivery = link.send(message, tag, resume=state is not _ABSENT)
                    if delivery.settled:
                        opened.discard(event_id)
            self._acknowledge()
            self._conn.wake()

    async def _read_ids(self, ids: set[int]) -> dict[int, StoredEvent]:
        """The events of these ids that the log still has."""
        found: dict[int, StoredEvent] = {}
        after, top = min(ids) - 1, max(ids)
        while after < top:
            page = await self._events.read_after(self._who, after, READ_BATCH)
            if not page:
                break
            found.update((event.id, event) for event in page if event.id in ids)
            after = page[-1].id
        return found

    async def _run(self) -> None:
        self._after = self._acked = await self._start_after()
        kept = self._recovery.kept if self._recovery is not None else None
        if kept is not None:
            await self._send_first(self._resume(kept))
        link = self._link
        matches = self._start.matches
        encode = ENCODER.encode
        event_hubs = self._event_hubs
        bound = self._binding is not None
        # Read a page at a time whatever the credit (clients that top their credit up by a
        # few at a time would make as many reads), and send it as the credit comes; while
        # it is sent, the next page is read (one ahead at most, when the log has more).
        page: list[StoredEvent] = []
        index = 0
        read_up_to = self._after
        ahead: asyncio.Future[list[StoredEvent]] | None = None
        try:
            while True:
                self._wake.clear()
                if link.credit > 0 and self._conn.writable:
                    if index == len(page) and self._events.head > read_up_to:
                        if ahead is None:
                            ahead = self._read_page(read_up_to)
                        page, ahead = await ahead, None
                        index = 0
                        if page:
                            read_up_to = page[-1].id
                            if self._events.head > read_up_to:
                                ahead = self._read_page(read_up_to)
                    sent = self._send_page(page, index, matches, encode, event_hubs, bound)
                    if sent != index:
                        index = sent
                        continue
                caught_up = index == len(page) and self._events.head <= read_up_to
                if link.credit > 0 and link.drain and caught_up:
                    if await newer_committed([self._events], [read_up_to]):
                        continue
                    link.drained()
                    self._conn.wake()
                await self._wake.wait()
        finally:
            if ahead is not None:
                ahead.cancel()

    def _read_page(self, after: int) -> asyncio.Future[list[StoredEvent]]:
        """The page after ``after``, being read (a task of its own: it may be read ahead)."""
        page = asyncio.ensure_future(self._events.read_after(self._who, after, READ_BATCH))
        page.add_done_callback(retrieve_quietly)
        return page

    def _send_page(
        self,
        page: list[StoredEvent],
        index: int,
        matches: Callable[[StoredEvent], bool] | None,
        encode: Callable[[StoredEvent, bool], bytes],
        event_hubs: bool,
        bound: bool,
    ) -> int:
        """Send what the credit allows of ``page`` from ``index`` on; the index to go on
        from (``index``: nothing sent)."""
        link = self._link
        opened = self._open
        if index == len(page) or link.credit <= 0:
            return index
        if matches is None:  # one event per unit of credit
            end = min(len(page), index + link.credit)
            sending = page[index:end]
        else:  # the events the filter lets through take credit
            end = index
            sending = []
            while end < len(page) and len(sending) < link.credit:
                if matches(page[end]):
                    sending.append(page[end])
                end += 1
        messages = [(encode(event, event_hubs), b"%d" % event.id) for event in sending]
        if not link.send_many(messages):
            if bound:
                self._unsettled.extend(event.id for event in sending)
            if opened is not None:
                opened.update(event.id for event in sending)
        self._after = page[end - 1].id
        self._acknowledge()
        self._conn.wake()
        return end

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        opened = self._open
        if opened is not None:
            opened.difference_update(int(d.tag) for d in deliveries if d.settled)
        if self._binding is None:
            return
        done = [int(d.tag) for d in deliveries if isinstance(d.remote_state, Accepted | Rejected)]
        if done:
            self._done.update(done)
            self._acknowledge()

    def _acknowledge(self) -> None:
        """Move the bound consumer's position over what is settled or was skipped."""
        if self._binding is None:
            return
        unsettled = self._unsettled
        while unsettled and unsettled[0] in self._done:
            self._done.discard(unsettled.popleft())
        self._ack_wanted = unsettled[0] - 1 if unsettled else self._after
        if self._acking is None or self._acking.done():
            self._acking = asyncio.ensure_future(self._write_position())

    async def _write_position(self) -> None:
        # Not cancelled with the link: what the consumer accepted is stored even if it leaves.
        assert self._binding is not None
        _user_id, component = self._binding
        fence = self._fence
        consumers = self._events.consumers
        while self._ack_wanted > self._acked:
            wanted = self._ack_wanted
            try:
                if fence is None:
                    await consumers.acknowledge(self._who, component, wanted)
                elif (
                    await self._events.acknowledge_group(self._who, *fence, component, wanted)
                    is None
                ):
                    self._fenced()
                    return
            except PositionPastHead as exc:  # only ids sent move it: no client gets here
                logger.error("the position of %s was not stored: %s", component, exc)
                if not self._closed:
                    self._conn.detach(self._link, PRECONDITION_FAILED, str(exc))
                return
            except Exception:
                logger.exception("storing the position of %s failed", component)
                return
            self._acked = wanted

    def _fenced(self) -> None:
        """Another link took the group (or the consumer was dropped): the position is not
        this link's to move any more."""
        assert self._fence is not None
        logger.info(
            "consumer group %s taken over: its position stays", quote_input(self._fence[0], 80)
        )
        if not self._closed:
            self._conn.detach(
                self._link,
                LINK_STOLEN,
                "the consumer group was taken over (or its consumer dropped): this link's"
                " settlements no longer move its position",
            )


class Attaching:
    """A consumer link while what its attach waits for is on its way to the database (the
    claim of its consumer group, the terminus it resumes). The attach is answered once
    ``attach(self)`` is done: a :class:`ConsumerLink` (:attr:`inner`) then serves the link,
    or the link is refused (``failed``: the sentence when it raised). Credit that comes
    meanwhile waits on the link."""

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        attach: Callable[[Attaching], Coroutine[Any, Any, None]],
        failed: str,
    ) -> None:
        self.conn = conn
        self.link = link
        self.inner: ConsumerLink | None = None
        #: The link ended before it was answered.
        self.closed = False
        self._failed = failed
        self._task = asyncio.ensure_future(attach(self))
        self._task.add_done_callback(self._attached)

    def _attached(self, task: asyncio.Future[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not self.closed:
            logger.warning("%s: %s", self._failed, exc)
            self.conn.detach(self.link, INTERNAL_ERROR, self._failed)

    def on_flow(self) -> None:
        if self.inner is not None:
            self.inner.on_flow()

    def on_delivery(self, delivery: Delivery) -> None:
        pass  # the engine refuses transfers on a link the peer receives on

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        if self.inner is not None:
            self.inner.on_outcomes(deliveries)

    def on_writable(self) -> None:
        if self.inner is not None:
            self.inner.on_writable()

    def on_closed(self) -> asyncio.Future[None] | None:
        self.closed = True
        return self.inner.on_closed() if self.inner is not None else None


def _joined(*futures: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
    """Done once each of ``futures`` is (None: none is due)."""
    due = [future for future in futures if future is not None]
    if len(due) <= 1:
        return due[0] if due else None

    async def all_done() -> None:
        await asyncio.wait(due)

    return asyncio.ensure_future(all_done())


async def newer_committed(logs: Sequence[EventLog], afters: Sequence[int]) -> bool:
    """Before a drain is answered with nothing more: whether the database has events after
    ``afters`` that this process has not heard of yet (another worker or process committed
    them, and may have acknowledged them already); the heads learn of them."""
    for events in logs:
        await events.catch_up()
    return any(events.head > after for events, after in zip(logs, afters, strict=True))
