"""The sessions, links and deliveries of an :class:`~.protocol.AmqpProtocol`: what its owner
calls (:meth:`Link.accept`, :meth:`Link.send`, :meth:`Delivery.settle`...), and how each turns
into frames (the transfers of the fast paths written straight into the output)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, Protocol

from .conditions import INTERNAL_ERROR
from .framing import AMQP_FRAME, HEADER
from .performatives import (
    ACCEPTED,
    RCV_FIRST,
    RECEIVER,
    SENDER,
    SND_MIXED,
    SND_SETTLED,
    Accepted,
    Attach,
    Begin,
    Composite,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Rejected,
    Released,
    Source,
    Target,
)
from .transfers import (
    SHORT_TAG,
    SHORT_TRANSFER,
    SHORT_TRANSFERS,
    continuation_fields,
    fit_unsettled,
    resumed_fields,
    transfer_fields,
)

#: The largest serial number (delivery ids, transfer ids and delivery counts wrap).
SERIAL: Final = 0xFFFF_FFFF


class Delivery:
    """One message on a link, either way."""

    __slots__ = (
        "aborted",
        "id",
        "link",
        "message_format",
        "payload",
        "remote_settled",
        "remote_state",
        "settled",
        "tag",
    )

    def __init__(
        self, link: Link, delivery_id: int, tag: bytes, message_format: int, settled: bool
    ) -> None:
        self.link = link
        self.id = delivery_id
        self.tag = tag
        self.message_format = message_format
        #: Settled on our side.
        self.settled = settled
        self.remote_settled = False
        #: The peer's outcome (an :data:`~.performatives.Outcome`), None before it gives one.
        self.remote_state: Any = None
        #: A received message's bytes.
        self.payload: bytes = b""
        self.aborted = False

    def settle(self, state: Any = None) -> None:
        """Settle with ``state`` (an outcome; for a delivery we sent, none is needed)."""
        if self.settled:
            return
        self.settled = True
        link = self.link
        session = link.session
        if link.is_sender:
            session.outgoing_unsettled.pop(self.id, None)
            link.unsettled.discard(self.id)
            if not self.remote_settled:
                session.settle(SENDER, self.id, state)
        else:
            session.incoming_unsettled.pop(self.id, None)
            if not self.remote_settled:
                session.settle(RECEIVER, self.id, state)

    def accept(self) -> None:
        self.settle(ACCEPTED)

    def reject(self, condition: str, description: str) -> None:
        self.settle(Rejected(Error(condition, description)))

    def __repr__(self) -> str:
        return f"<Delivery {self.id} tag={self.tag!r}>"


class Link:
    """One link, as the peer attached it. ``is_sender``: we send on it (the peer receives)."""

    def __init__(self, session: Session, remote: Attach) -> None:
        self.session = session
        self.remote = remote
        self.name = remote.name
        #: Ours, given when the attach is answered (the peer's is ``remote.handle``).
        self.handle = -1
        self.remote_closed = True
        #: Ended without being closed: the peer detached it with closed=false, or its session
        #: or connection ended first (its terminus may be kept, AMQP 2.6.13, 3.5.5).
        self.suspended = False
        self.is_sender = remote.role == RECEIVER
        self.attached = False
        self.detached = False
        self.remote_detached = False
        #: The peer's settlement modes, and ours once attached.
        self.snd_settle_mode = remote.snd_settle_mode
        self.rcv_settle_mode = remote.rcv_settle_mode
        #: Received messages larger than this detach the link (None: no limit).
        self.max_message_size: int | None = None
        self.delivery_count = 0 if self.is_sender else (remote.initial_delivery_count or 0)
        #: Sender: what the peer lets us send; receiver: what we let the peer send.
        self.credit = 0
        self.drain = False
        self.available = 0
        #: Ids of deliveries we sent and have not settled.
        self.unsettled: set[int] = set()
        self._incoming: Delivery | None = None
        self._incoming_parts: list[bytes] = []
        self._incoming_bytes = 0
        self._flow_due = False
        #: The owner's object for this link.
        self.handler: Any = None

    # -- what the peer asked for

    @property
    def remote_source(self) -> Source | None:
        source = self.remote.source
        return source if isinstance(source, Source) else None

    @property
    def remote_target(self) -> Target | None:
        target = self.remote.target
        return target if isinstance(target, Target) else None

    @property
    def address(self) -> str | None:
        """The node the link is to (a receiving link's target, a sending link's source)."""
        terminus = self.remote_source if self.is_sender else self.remote_target
        return terminus.address if terminus is not None else None

    @property
    def remote_properties(self) -> dict[Any, Any] | None:
        return self.remote.properties

    @property
    def active(self) -> bool:
        return self.attached and not self.detached and not self.remote_detached

    # -- answering the attach

    def accept(
        self,
        *,
        source: Any = None,
        target: Any = None,
        properties: dict[Any, Any] | None = None,
        max_message_size: int | None = None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        offered_capabilities: Sequence[str] | None = None,
        unsettled: dict[bytes, Any] | None = None,
        incomplete_unsettled: bool = False,
    ) -> None:
        """Attach our end: the termini default to the peer's. ``unsettled`` (tag -> state) is
        our unsettled map (AMQP 2.6.13); entries the peer's frame size leaves no room for are
        left out and ``incomplete-unsettled`` set."""
        remote = self.remote
        self.snd_settle_mode = (
            snd_settle_mode if snd_settle_mode is not None else remote.snd_settle_mode
        )
        self.rcv_settle_mode = (
            rcv_settle_mode if rcv_settle_mode is not None else remote.rcv_settle_mode
        )
        self.max_message_size = max_message_size
        self._take_handle()
        attach = Attach(
            remote.name,
            self.handle,
            SENDER if self.is_sender else RECEIVER,
            self.snd_settle_mode,
            self.rcv_settle_mode,
            source if source is not None else remote.source,
            target if target is not None else remote.target,
            unsettled,
            incomplete_unsettled,
            0 if self.is_sender else None,
            max_message_size,
            tuple(offered_capabilities) if offered_capabilities else None,
            None,
            properties,
        )
        if unsettled:
            fit_unsettled(attach, self.session.protocol.remote_max_frame_size)
        self.session.send(attach)

    def refuse(self, condition: str, description: str) -> None:
        """Attach with no terminus and detach at once with the error (AMQP 2.6.3)."""
        remote = self.remote
        self._take_handle()
        self.session.send(
            Attach(remote.name, self.handle, SENDER if self.is_sender else RECEIVER, SND_MIXED,
                   RCV_FIRST, None, None, None, False, 0 if self.is_sender else None)
        )  # fmt: skip
        self.close(condition, description)

    def close(self, condition: str | None = None, description: str | None = None) -> None:
        """Detach (closing the link), with an error when ``condition`` is given."""
        if self.detached or self.session.ended:
            return
        if not self.attached:  # the answer to an attach we never took
            self.refuse(condition or INTERNAL_ERROR, description or "the link was not taken")
            return
        self.detached = True
        self._flow_due = False
        self._drop_incoming()
        error = Error(condition, description) if condition is not None else None
        closed = self.remote_closed if self.remote_detached else True
        session = self.session
        session.send(Detach(self.handle, closed, error))
        session.link_done(self)
        session.answered(self)

    # -- receiving

    def flow(self, credit: int) -> None:
        """Let the peer send ``credit`` more messages (sent with this batch's frames)."""
        if credit <= 0 or not self.active:
            return
        self.credit = min(self.credit + credit, SERIAL)
        self._request_flow()

    def _take_handle(self) -> None:
        self.attached = True
        self.handle = self.session.take_handle()

    def _request_flow(self) -> None:
        if not self._flow_due:
            self._flow_due = True
            self.session.flows_due.append(self)
            self.session.protocol.pending_sessions.add(self.session)

    # -- sending

    def send(
        self,
        payload: bytes | Sequence[bytes],
        tag: bytes,
        *,
        settled: bool | None = None,
        message_format: int = 0,
        resume: bool = False,
        state: Any = None,
    ) -> Delivery:
        """Send one message (its bytes, or the parts they join into). Unsettled unless the
        link's sender settle mode is ``settled`` or ``settled`` says so. The caller checks
        :attr:`credit` first. ``resume``: a delivery of the unsettled map the link was
        attached with (AMQP 2.6.13), with our ``state`` of it (a settled one may have no
        payload)."""
        if settled is None:
            settled = self.snd_settle_mode == SND_SETTLED
        session = self.session
        delivery = Delivery(self, session.next_delivery_id, tag, message_format, settled)
        session.next_delivery_id = (session.next_delivery_id + 1) & SERIAL
        self.delivery_count = (self.delivery_count + 1) & SERIAL
        if self.credit > 0:
            self.credit -= 1
        if not settled:
            session.outgoing_unsettled[delivery.id] = delivery
            self.unsettled.add(delivery.id)
        if resume or state is not None:
            session.transfer(self, delivery, payload, resumed_fields(resume, state))
        else:
            session.transfer(self, delivery, payload)
        return delivery

    def send_many(self, messages: Sequence[tuple[bytes, bytes]]) -> bool:
        """Send messages (payload, tag) one after the other as :meth:`send` does, settled as
        the link's sender settle mode says (returned: True when they are settled already).
        The caller checks :attr:`credit` first. The deliveries that fit one frame each while
        the peer's window is open are written from a template in one pass."""
        settled = self.snd_settle_mode == SND_SETTLED
        session = self.session
        protocol = session.protocol
        room = 0
        if not session.blocked and not protocol.closed:
            room = min(max(session.remote_incoming_window, 0), len(messages))
        next_id = session.next_delivery_id
        unsettled = session.outgoing_unsettled
        ids = self.unsettled
        out = protocol.out
        largest = protocol.remote_max_frame_size - SHORT_TRANSFER
        channel, handle = session.channel, self.handle
        settled_code = 0x41 if settled else 0x42
        sent = 0
        for payload, tag in messages[:room]:
            if len(tag) > SHORT_TAG or len(tag) + len(payload) > largest:
                break
            delivery = Delivery(self, next_id, tag, 0, settled)
            if not settled:
                unsettled[next_id] = delivery
                ids.add(next_id)
            out += (
                SHORT_TRANSFERS[len(tag)](
                    SHORT_TRANSFER + len(tag) + len(payload), channel, handle, next_id, tag, 0,
                    settled_code,
                ),
                payload,
            )  # fmt: skip
            next_id = (next_id + 1) & SERIAL
            sent += 1
        if sent:
            session.next_delivery_id = next_id
            session.next_outgoing_id = (session.next_outgoing_id + sent) & SERIAL
            session.remote_incoming_window -= sent
            self.delivery_count = (self.delivery_count + sent) & SERIAL
            self.credit = max(self.credit - sent, 0)
        for payload, tag in messages[sent:]:
            self.send(payload, tag, settled=settled)
        return settled

    def drained(self) -> None:
        """Drain asked and nothing left to send: use up the credit and tell the peer."""
        if self.drain and self.active:
            self.delivery_count = (self.delivery_count + self.credit) & SERIAL
            self.credit = 0
            self._request_flow()

    # -- the engine's side

    def _flow_frame(self) -> Flow:
        session = self.session
        return Flow(
            session.next_incoming_id,
            session.incoming_window,
            session.next_outgoing_id,
            session.outgoing_window,
            self.handle,
            self.delivery_count,
            self.credit,
            self.available if self.is_sender else None,
            self.drain if self.is_sender else False,
            False,
            None,
        )

    def _drop_incoming(self) -> None:
        self._incoming = None
        self._incoming_parts = []
        self._incoming_bytes = 0

    def __repr__(self) -> str:
        return f"<Link {self.name!r} handle={self.handle} {'out' if self.is_sender else 'in'}>"


class Session:
    """One session, on the channel the peer began it on."""

    def __init__(self, protocol: SessionHost, channel: int, remote: Begin) -> None:
        self.protocol = protocol
        self.channel = channel
        #: Our end is sent.
        self.ended = False
        #: The peer's end, once it came: ours follows the answers to the peer's detaches.
        self.remote_end: End | None = None
        #: Links the peer detached whose detach the owner has not answered yet.
        self.unanswered: set[Link] = set()
        #: Links by the peer's handle, until the peer detaches them.
        self.links: dict[int, Link] = {}
        #: Our handles in use, and the lowest never used.
        self._handles: set[int] = set()
        self._free_handles: list[int] = []
        self._next_handle = 0
        self.next_outgoing_id = 0
        self.next_delivery_id = 0
        self.incoming_window = protocol.incoming_window
        self.outgoing_window = 0x7FFF_FFFF
        self.next_incoming_id = remote.next_outgoing_id
        #: Transfers the peer takes before it must widen its window.
        self.remote_incoming_window = remote.incoming_window
        self.remote_outgoing_window = remote.outgoing_window
        self.outgoing_unsettled: dict[int, Delivery] = {}
        self.incoming_unsettled: dict[int, Delivery] = {}
        self.flows_due: list[Link] = []
        self.window_due = False
        #: (role, id, state) to send in dispositions, ranges made when the batch is written.
        self.settlements: list[tuple[bool, int, Any]] = []
        #: Transfer frames held back while the peer's incoming window is shut.
        self.blocked: deque[bytes | bytearray] = deque()

    def send(self, performative: Composite, payload: bytes = b"") -> None:
        if not self.ended:
            self.protocol.send(self.channel, performative, payload)

    def settle(self, role: bool, delivery_id: int, state: Any) -> None:
        self.settlements.append((role, delivery_id, state))
        self.protocol.pending_sessions.add(self)

    def take_handle(self) -> int:
        if self._free_handles:
            handle = heapq.heappop(self._free_handles)
        else:
            handle = self._next_handle
            self._next_handle += 1
        self._handles.add(handle)
        return handle

    def answered(self, link: Link) -> None:
        """``link``'s detach is sent: after the peer's end, ours once none is left."""
        self.unanswered.discard(link)
        if self.remote_end is not None and not self.unanswered and not self.ended:
            self.protocol.send_end(self)

    def link_done(self, link: Link) -> None:
        """Both ends detached: forget the link and its unsettled deliveries."""
        if link.detached and link.remote_detached:
            if self.links.get(link.remote.handle) is link:
                del self.links[link.remote.handle]
            if link.handle in self._handles:
                self._handles.discard(link.handle)
                heapq.heappush(self._free_handles, link.handle)
            for delivery_id in link.unsettled:
                self.outgoing_unsettled.pop(delivery_id, None)
            link.unsettled.clear()
            for delivery_id in [i for i, d in self.incoming_unsettled.items() if d.link is link]:
                del self.incoming_unsettled[delivery_id]

    def transfer(
        self,
        link: Link,
        delivery: Delivery,
        payload: bytes | Sequence[bytes],
        resumed: bytes | None = None,
    ) -> None:
        """The transfer frames of one delivery, split to the peer's frame size; ``resumed``:
        the state, resume, aborted and batchable fields of a resumed delivery."""
        protocol = self.protocol
        tag = delivery.tag
        if (
            resumed is None
            and type(payload) is bytes
            and len(tag) <= SHORT_TAG
            and self.remote_incoming_window > 0
            and not self.blocked
            and not protocol.closed
        ):
            size = SHORT_TRANSFER + len(tag) + len(payload)
            if size <= protocol.remote_max_frame_size:
                # one frame from a template: the fields in fixed widths, the tag in place
                packer = SHORT_TRANSFERS[len(tag)]
                protocol.out += (
                    packer(size, self.channel, link.handle, delivery.id, tag,
                           delivery.message_format, 0x41 if delivery.settled else 0x42),
                    payload,
                )  # fmt: skip
                self.next_outgoing_id = (self.next_outgoing_id + 1) & SERIAL
                self.remote_incoming_window -= 1
                return
        size = len(payload) if isinstance(payload, bytes) else sum(len(p) for p in payload)
        head = transfer_fields(
            link.handle, delivery.id, delivery.tag, delivery.message_format, delivery.settled,
            tail=resumed,
        )  # fmt: skip
        room = protocol.remote_max_frame_size - 8 - len(head)
        if size <= room:
            start = HEADER.pack(8 + len(head) + size, 2, AMQP_FRAME, self.channel) + head
            if self.remote_incoming_window > 0 and not self.blocked and not protocol.closed:
                # the parts go out as they are: joined once, with the whole batch
                self._count_transfer()
                out = protocol.out
                out.append(start)
                if isinstance(payload, bytes):
                    out.append(payload)
                else:
                    out.extend(payload)
            else:
                joined = payload if isinstance(payload, bytes) else b"".join(payload)
                self._queue_transfer(start + joined)
            return
        joined = payload if isinstance(payload, bytes) else b"".join(payload)
        view = memoryview(joined)
        first = True
        while view:
            if first:
                fields = transfer_fields(
                    link.handle,
                    delivery.id,
                    delivery.tag,
                    delivery.message_format,
                    delivery.settled,
                    more=True,
                    tail=resumed,
                )
            else:
                fields = continuation_fields(link.handle, more=True)
            room = max(protocol.remote_max_frame_size - 8 - len(fields), 1)
            chunk = view[:room]
            view = view[room:]
            if not view:
                fields = head if first else continuation_fields(link.handle, more=False)
            frame = bytearray(HEADER.pack(8 + len(fields) + len(chunk), 2, 0, self.channel))
            frame += fields
            frame += chunk
            self._queue_transfer(frame)
            first = False

    def _queue_transfer(self, frame: bytes | bytearray) -> None:
        if self.remote_incoming_window <= 0 or self.blocked:
            self.blocked.append(frame)
            return
        self._count_transfer()
        self.protocol.write(frame)

    def _count_transfer(self) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + 1) & SERIAL
        self.remote_incoming_window -= 1

    def unblock(self) -> None:
        """Send what the peer's window now lets through."""
        while self.blocked and self.remote_incoming_window > 0:
            self._count_transfer()
            self.protocol.write(self.blocked.popleft())

    def flush(self) -> None:
        """The dispositions and flows of this batch, as few frames as they fit in (none
        after the peer's end)."""
        if self.ended or self.remote_end is not None:
            self.settlements.clear()
            self.flows_due.clear()
            return
        if self.settlements:
            self._send_dispositions()
        if self.flows_due:
            links, self.flows_due = self.flows_due, []
            for link in links:
                if link._flow_due and link.active:
                    link._flow_due = False
                    self.send(link._flow_frame())
            self.window_due = False
        if self.window_due:
            self.window_due = False
            self.send(self._flow_frame())

    def _send_dispositions(self) -> None:
        settlements, self.settlements = self.settlements, []
        settlements.sort(key=lambda item: (item[0], item[1]))
        run_role, first, run_state = settlements[0]
        last = first
        for role, delivery_id, state in settlements[1:]:
            if role == run_role and delivery_id == last + 1 and _same_state(state, run_state):
                last = delivery_id
                continue
            self._disposition(run_role, first, last, run_state)
            run_role, first, last, run_state = role, delivery_id, delivery_id, state
        self._disposition(run_role, first, last, run_state)

    def _disposition(self, role: bool, first: int, last: int, state: Any) -> None:
        self.send(Disposition(role, first, last if last != first else None, True, state, False))

    def _flow_frame(self) -> Flow:
        return Flow(
            self.next_incoming_id,
            self.incoming_window,
            self.next_outgoing_id,
            self.outgoing_window,
            None,
            None,
            None,
            None,
            False,
            False,
            None,
        )


def _same_state(one: Any, other: Any) -> bool:
    return one is other or (
        type(one) is type(other) and isinstance(one, Accepted | Released | type(None))
    )


class SessionHost(Protocol):
    """What a session and its links need of the :class:`~.protocol.AmqpProtocol` they belong
    to."""

    incoming_window: int
    remote_max_frame_size: int
    #: Our close is sent: nothing more goes out.
    closed: bool
    #: Frames to send, joined by :meth:`~.protocol.AmqpProtocol.data_to_send` (the fast
    #: transfer paths append to it themselves).
    out: list[bytes | bytearray]
    #: Sessions with settlements or flows to send.
    pending_sessions: set[Session]

    def send(self, channel: int, performative: Composite, payload: bytes = b"") -> None: ...

    def write(self, frame: bytes | bytearray) -> None: ...

    def send_end(self, session: Session) -> None: ...
