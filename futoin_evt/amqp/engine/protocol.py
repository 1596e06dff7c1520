"""The server side of one AMQP 1.0 connection, sans I/O (part 2): bytes in, events out, bytes
to send back.

The owner feeds what the socket reads to :meth:`Engine.receive_data`, handles the
:meth:`Engine.events` that follow (a link to attach or refuse, a message, an outcome, a
detach...), calls the :class:`Link` and :class:`Delivery` methods it likes, and writes
:meth:`Engine.data_to_send` (everything of one batch in one write). :meth:`Engine.tick` keeps
the idle time-outs. Nothing here knows the server: a link is an address and a role, a message
its bytes.

The engine answers what needs no decision by itself: ``open``, ``begin``, ``end``, ``close``,
echoed flows, session windows, the settling of what the peer has decided. It begins no
session and attaches no link of its own: its sessions mirror the peer's on the same channel
numbers, and each link the peer attaches gets a handle of ours when it is answered. Frames
that break the protocol close the connection with the condition the spec names; frames about
links or deliveries that are gone are ignored.
"""

from __future__ import annotations

import heapq
import itertools
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from .framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAMING_ERROR,
    HEADER,
    FrameReader,
    FramingError,
    decode_body,
    encode_frame,
)
from .performatives import (
    ACCEPTED,
    RCV_FIRST,
    RECEIVER,
    SENDER,
    SND_MIXED,
    SND_SETTLED,
    Accepted,
    Attach,
    BadComposite,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Modified,
    Open,
    Rejected,
    Released,
    Source,
    Target,
    Transfer,
)
from .types import DecodeError, EncodeError, encode

DECODE_ERROR: Final = "amqp:decode-error"
INVALID_FIELD: Final = "amqp:invalid-field"
NOT_ALLOWED: Final = "amqp:not-allowed"
INTERNAL_ERROR: Final = "amqp:internal-error"
RESOURCE_LIMIT: Final = "amqp:resource-limit-exceeded"
WINDOW_VIOLATION: Final = "amqp:session:window-violation"
HANDLE_IN_USE: Final = "amqp:session:handle-in-use"
UNATTACHED_HANDLE: Final = "amqp:session:unattached-handle"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"
#: The largest serial number (delivery ids, transfer ids and delivery counts wrap).
_SERIAL: Final = 0xFFFF_FFFF
_TERMINAL: Final = (Accepted, Rejected, Released, Modified)
_TRANSFER_HEAD: Final = struct.Struct(">BBBBBB")  # 00 53 14 c0 size count


class ProtocolError(Exception):
    """The peer broke the protocol: the connection is closed with ``condition``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


# -- events -------------------------------------------------------------------------------------


class LinkAttached:
    """The peer attached ``link``: :meth:`Link.accept` or :meth:`Link.refuse` it."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link


class LinkFlow:
    """The peer changed the credit (or drain) of a link we send on."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link


class MessageReceived:
    """A whole message arrived on a link we receive on (``delivery.payload``)."""

    __slots__ = ("delivery", "link")

    def __init__(self, link: Link, delivery: Delivery) -> None:
        self.link = link
        self.delivery = delivery


class DeliveriesUpdated:
    """The peer gave outcomes to (or settled) deliveries we sent on ``link``."""

    __slots__ = ("deliveries", "link")

    def __init__(self, link: Link, deliveries: list[Delivery]) -> None:
        self.link = link
        self.deliveries = deliveries


class LinkDetached:
    """The link is detached: by the peer (answer with :meth:`Link.close` when ready) or by the
    engine itself (``by_peer`` False: a message too large, say; nothing to answer)."""

    __slots__ = ("by_peer", "closed", "error", "link")

    def __init__(self, link: Link, error: Error | None, closed: bool, by_peer: bool) -> None:
        self.link = link
        self.error = error
        self.closed = closed
        self.by_peer = by_peer


class SessionEnded:
    """The peer ended a session; its links are gone with it (answered already)."""

    __slots__ = ("error", "links", "session")

    def __init__(self, session: Session, links: list[Link], error: Error | None) -> None:
        self.session = session
        self.links = links
        self.error = error


class ConnectionClosed:
    """The connection is closed (by the peer, or by us for ``error``); write what is left and
    close the socket."""

    __slots__ = ("by_peer", "error")

    def __init__(self, error: Error | None, by_peer: bool) -> None:
        self.error = error
        self.by_peer = by_peer


Event = (
    LinkAttached
    | LinkFlow
    | MessageReceived
    | DeliveriesUpdated
    | LinkDetached
    | SessionEnded
    | ConnectionClosed
)


# -- deliveries and links -----------------------------------------------------------------------


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
            _fit_unsettled(attach, self.session.engine.remote_max_frame_size)
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
        self.credit = min(self.credit + credit, _SERIAL)
        self._request_flow()

    def _take_handle(self) -> None:
        self.attached = True
        self.handle = self.session.take_handle()

    def _request_flow(self) -> None:
        if not self._flow_due:
            self._flow_due = True
            self.session.flows_due.append(self)
            self.session.engine.pending_sessions.add(self.session)

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
        session.next_delivery_id = (session.next_delivery_id + 1) & _SERIAL
        self.delivery_count = (self.delivery_count + 1) & _SERIAL
        if self.credit > 0:
            self.credit -= 1
        if not settled:
            session.outgoing_unsettled[delivery.id] = delivery
            self.unsettled.add(delivery.id)
        if resume or state is not None:
            session.transfer(self, delivery, payload, _resumed_fields(resume, state))
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
        engine = session.engine
        room = 0
        if not session.blocked and not engine.closed:
            room = min(max(session.remote_incoming_window, 0), len(messages))
        next_id = session.next_delivery_id
        unsettled = session.outgoing_unsettled
        ids = self.unsettled
        out = engine._out
        largest = engine.remote_max_frame_size - _SHORT_TRANSFER
        channel, handle = session.channel, self.handle
        settled_code = 0x41 if settled else 0x42
        sent = 0
        for payload, tag in messages[:room]:
            if len(tag) > _SHORT_TAG or len(tag) + len(payload) > largest:
                break
            delivery = Delivery(self, next_id, tag, 0, settled)
            if not settled:
                unsettled[next_id] = delivery
                ids.add(next_id)
            out += (
                _SHORT_TRANSFERS[len(tag)](
                    _SHORT_TRANSFER + len(tag) + len(payload), channel, handle, next_id, tag, 0,
                    settled_code,
                ),
                payload,
            )  # fmt: skip
            next_id = (next_id + 1) & _SERIAL
            sent += 1
        if sent:
            session.next_delivery_id = next_id
            session.next_outgoing_id = (session.next_outgoing_id + sent) & _SERIAL
            session.remote_incoming_window -= sent
            self.delivery_count = (self.delivery_count + sent) & _SERIAL
            self.credit = max(self.credit - sent, 0)
        for payload, tag in messages[sent:]:
            self.send(payload, tag, settled=settled)
        return settled

    def drained(self) -> None:
        """Drain asked and nothing left to send: use up the credit and tell the peer."""
        if self.drain and self.active:
            self.delivery_count = (self.delivery_count + self.credit) & _SERIAL
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

    def __init__(self, engine: Engine, channel: int, remote: Begin) -> None:
        self.engine = engine
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
        self.incoming_window = engine.incoming_window
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
            self.engine.send(self.channel, performative, payload)

    def settle(self, role: bool, delivery_id: int, state: Any) -> None:
        self.settlements.append((role, delivery_id, state))
        self.engine.pending_sessions.add(self)

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
            self.engine._send_end(self)

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
        engine = self.engine
        tag = delivery.tag
        if (
            resumed is None
            and type(payload) is bytes
            and len(tag) <= _SHORT_TAG
            and self.remote_incoming_window > 0
            and not self.blocked
            and not engine.closed
        ):
            size = _SHORT_TRANSFER + len(tag) + len(payload)
            if size <= engine.remote_max_frame_size:
                # one frame from a template: the fields in fixed widths, the tag in place
                packer = _SHORT_TRANSFERS[len(tag)]
                engine._out += (
                    packer(size, self.channel, link.handle, delivery.id, tag,
                           delivery.message_format, 0x41 if delivery.settled else 0x42),
                    payload,
                )  # fmt: skip
                self.next_outgoing_id = (self.next_outgoing_id + 1) & _SERIAL
                self.remote_incoming_window -= 1
                return
        size = len(payload) if isinstance(payload, bytes) else sum(len(p) for p in payload)
        head = _transfer_fields(
            link.handle, delivery.id, delivery.tag, delivery.message_format, delivery.settled,
            tail=resumed,
        )  # fmt: skip
        room = engine.remote_max_frame_size - 8 - len(head)
        if size <= room:
            start = HEADER.pack(8 + len(head) + size, 2, AMQP_FRAME, self.channel) + head
            if self.remote_incoming_window > 0 and not self.blocked and not engine.closed:
                # the parts go out as they are: joined once, with the whole batch
                self._count_transfer()
                out = engine._out
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
                fields = _transfer_fields(
                    link.handle,
                    delivery.id,
                    delivery.tag,
                    delivery.message_format,
                    delivery.settled,
                    more=True,
                    tail=resumed,
                )
            else:
                fields = _continuation_fields(link.handle, more=True)
            room = max(engine.remote_max_frame_size - 8 - len(fields), 1)
            chunk = view[:room]
            view = view[room:]
            if not view:
                fields = head if first else _continuation_fields(link.handle, more=False)
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
        self.engine.write(frame)

    def _count_transfer(self) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + 1) & _SERIAL
        self.remote_incoming_window -= 1

    def unblock(self) -> None:
        """Send what the peer's window now lets through."""
        while self.blocked and self.remote_incoming_window > 0:
            self._count_transfer()
            self.engine.write(self.blocked.popleft())

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


#: Frame and transfer performative bytes of a one-frame delivery, besides its tag: header
#: (8), described list8 (6), handle, delivery id and message format as uint (5 each), the
#: tag's vbin8 head (2), settled (1), more, rcv-settle-mode, state, resume, aborted, batchable
#: (6).
_SHORT_TRANSFER: Final = 8 + 6 + 5 + 5 + 2 + 5 + 1 + 6
#: The longest tag a one-frame template takes (the list8 size is at most 255).
_SHORT_TAG: Final = 255 - 1 - (_SHORT_TRANSFER - 8 - 6)


def _short_transfer(tag_size: int) -> Callable[..., bytes]:
    """``pack(frame size, channel, handle, delivery id, tag, message format, settled code)``:
    a whole transfer frame (but its payload) with every field written, widths fixed."""
    layout = struct.Struct(f">IBBHBBBBBBBIBIBB{tag_size}sBIB6s")
    list_size = _SHORT_TRANSFER - 8 - 6 + tag_size + 1
    pack = layout.pack

    def transfer(
        size: int, channel: int, handle: int, delivery_id: int, tag: bytes, fmt: int, settled: int
    ) -> bytes:
        return pack(size, 2, AMQP_FRAME, channel, 0, 0x53, 0x14, 0xC0, list_size, 11,
                    0x70, handle, 0x70, delivery_id, 0xA0, tag_size, tag, 0x70, fmt, settled,
                    b"\x42\x40\x40\x42\x42\x42")  # fmt: skip

    return transfer


_SHORT_TRANSFERS: Final = tuple(_short_transfer(size) for size in range(_SHORT_TAG + 1))


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + value.to_bytes(4, "big")


def _transfer_fields(
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool,
    more: bool = False,
    tail: bytes | None = None,
) -> bytes:
    """A transfer performative with all eleven fields (some clients find the payload by
    counting them); ``tail``: its last four (state, resume, aborted, batchable) encoded."""
    items = b"".join(
        (
            _uint(handle),
            _uint(delivery_id),
            bytes((0xA0, len(tag))) if len(tag) < 256 else b"\xb0" + len(tag).to_bytes(4, "big"),
            tag,
            _uint(message_format),
            b"\x41" if settled else b"\x42",
            b"\x41" if more else b"\x42",
            b"\x40",
            tail if tail is not None else b"\x40\x42\x42\x42",
        )
    )
    if len(items) < 255:
        return b"\x00\x53\x14\xc0" + bytes((len(items) + 1, 11)) + items
    return b"\x00\x53\x14\xd0" + struct.pack(">II", len(items) + 4, 11) + items


def _resumed_fields(resume: bool, state: Any) -> bytes:
    """The state, resume, aborted and batchable fields of a resumed transfer."""
    value = state.described() if isinstance(state, Composite) else state
    return encode(value) + (b"\x41" if resume else b"\x42") + b"\x42\x42"


def _fit_unsettled(attach: Attach, max_frame_size: int) -> None:
    """Leave out of the attach's unsettled map what does not fit the peer's frame size (an
    attach is one frame), setting ``incomplete-unsettled`` then; the oldest entries stay."""
    unsettled = attach.unsettled
    assert unsettled is not None
    keep = len(unsettled)
    while keep and _frame_size(attach) > max_frame_size:
        keep //= 2
        attach.unsettled = dict(itertools.islice(unsettled.items(), keep))
        attach.incomplete_unsettled = True


def _frame_size(performative: Composite) -> int:
    out = bytearray()
    encode_frame(out, 0, performative, b"")
    return len(out)


def _continuation_fields(handle: int, more: bool) -> bytes:
    items = (
        _uint(handle)
        + b"\x40\x40\x40\x40"
        + (b"\x41" if more else b"\x42")
        + b"\x40\x40\x42\x42\x42"
    )
    return b"\x00\x53\x14\xc0" + bytes((len(items) + 1, 11)) + items


# -- the connection -----------------------------------------------------------------------------


class Engine:
    """One connection from the AMQP protocol header on (SASL is done before it)."""

    def __init__(
        self,
        container_id: str,
        *,
        max_frame_size: int = 64 * 1024,
        channel_max: int = 1023,
        idle_timeout: float | None = 60.0,
        incoming_window: int = 5000,
        max_links: int = 4096,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.container_id = container_id
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.idle_timeout = idle_timeout
        self.incoming_window = incoming_window
        #: Links held at once (attached, or refused and not yet detached by the peer); one
        #: more closes the connection. The owner's own limit, refusing links, is lower.
        self.max_links = max_links
        self.properties = properties
        self.offered_capabilities = offered_capabilities
        self._clock = clock
        self._reader = FrameReader(max_frame_size)
        self._header_seen = False
        self._header_buffer = b""
        self.remote_open: Open | None = None
        self.remote_max_frame_size = 512
        self.remote_idle_timeout: float | None = None
        self.sessions: dict[int, Session] = {}
        self.links_held = 0
        self._out: list[bytes | bytearray] = []  # joined by data_to_send
        self._events: list[Event] = []
        self.pending_sessions: set[Session] = set()
        self._opened = False
        #: Our close is sent: nothing more goes out, and what comes in is dropped.
        self.closed = False
        self.remote_closed = False
        now = clock()
        self._last_received = now
        self._last_sent = now

    # -- I/O side

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the peer; the events they make are in :meth:`events`."""
        if self.closed or not data:
            return
        self._last_received = self._clock()
        if not self._header_seen:
            data = self._header_buffer + data
            if len(data) < len(AMQP_HEADER):
                if not AMQP_HEADER.startswith(data):
                    self._bad_header()
                self._header_buffer = data
                return
            if data[: len(AMQP_HEADER)] != AMQP_HEADER:
                self._bad_header()
                return
            self._header_seen = True
            self._header_buffer = b""
            self.write(AMQP_HEADER)
            data = data[len(AMQP_HEADER) :]
        try:
            frames = self._reader.feed(data)
        except FramingError as exc:
            self._fail(FRAMING_ERROR, str(exc))
            return
        for kind, channel, body in frames:
            if self.closed:
                return
            if not body:
                continue  # an empty frame keeps the connection alive
            try:
                if kind != AMQP_FRAME:
                    raise ProtocolError(FRAMING_ERROR, f"a frame of type {kind} after SASL")
                self._frame(channel, body)
            except ProtocolError as exc:
                self._fail(exc.condition, str(exc))
            except BadComposite as exc:
                self._fail(exc.condition, str(exc))
            except DecodeError as exc:
                self._fail(DECODE_ERROR, str(exc))
            except (IndexError, struct.error):
                self._fail(DECODE_ERROR, "a frame cut short")

    def receive_eof(self) -> None:
        """The peer sends no more: close (without an error after its own close)."""
        if not self.closed:
            if self.remote_closed:
                self._close(None)
            else:
                self._fail(FRAMING_ERROR, "the connection ended without a close")

    def events(self) -> list[Event]:
        """The events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        """Everything to write now, in one piece (the batch's dispositions and flows last)."""
        if self.pending_sessions:
            sessions, self.pending_sessions = self.pending_sessions, set()
            for session in sessions:
                session.flush()
        if not self._out:
            return b""
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out = []
        self._last_sent = self._clock()
        return bytes(out)

    def tick(self) -> float | None:
        """Keep the idle time-outs: an empty frame when the peer would otherwise time us
        out, a close when the peer has been silent too long. Returns when to tick next
        (on the clock the engine was given), None for never."""
        if self.closed:
            return None
        now = self._clock()
        deadlines = []
        if self.idle_timeout and self._opened:
            expiry = self._last_received + self.idle_timeout
            if now >= expiry:
                self._fail(RESOURCE_LIMIT, "local-idle-timeout expired")
                return None
            deadlines.append(expiry)
        if self.remote_idle_timeout and self._opened:
            due = self._last_sent + self.remote_idle_timeout / 2
            if now >= due and not self._out:
                self._out.append(EMPTY_FRAME)
                self._last_sent = now
                due = now + self.remote_idle_timeout / 2
            deadlines.append(due)
        return min(deadlines) if deadlines else None

    @property
    def finished(self) -> bool:
        """Our close is sent: once :meth:`data_to_send` is written, the socket can go."""
        return self.closed

    def lost(self) -> None:
        """The transport is gone: the links still attached end suspended (not closed)."""
        for session in self.sessions.values():
            for link in session.links.values():
                if not link.detached:
                    link.suspended = True

    def close(self, condition: str | None = None, description: str | None = None) -> None:
        """Close the connection, with an error when ``condition`` is given."""
        if not self.closed:
            self._close(Error(condition, description) if condition is not None else None)

    # -- the owner's side (links and sessions call these)

    def send(self, channel: int, performative: Composite, payload: bytes = b"") -> None:
        if self.closed:
            return
        out = bytearray()
        try:
            encode_frame(out, channel, performative, payload)
        except EncodeError as exc:
            raise ValueError(f"cannot encode {type(performative).__name__}: {exc}") from exc
        self._out.append(out)

    def write(self, frame: bytes | bytearray) -> None:
        if not self.closed:
            self._out.append(frame)

    # -- frames

    def _frame(self, channel: int, body: memoryview) -> None:
        if len(body) > 5 and body[2] == 0x14 and body[1] == 0x53 and body[0] == 0:
            quick = _quick_transfer(body)
            if quick is not None:
                self._transfer(self._session(channel), *quick[:7], body[quick[7] :])
                return
        performative, payload = decode_body(body)
        if isinstance(performative, Transfer):
            t = performative
            self._transfer(
                self._session(channel), t.handle, t.delivery_id, t.delivery_tag,
                t.message_format, t.settled, t.more, t.aborted, payload,
            )  # fmt: skip
        elif isinstance(performative, Disposition):
            self._disposition(self._session(channel), performative)
        elif isinstance(performative, Flow):
            self._flow(self._session(channel), performative)
        elif isinstance(performative, Attach):
            self._attach(self._session(channel), performative)
        elif isinstance(performative, Detach):
            self._detach(self._session(channel), performative)
        elif isinstance(performative, Begin):
            self._begin(channel, performative)
        elif isinstance(performative, End):
            self._end(self._session(channel), performative)
        elif isinstance(performative, Open):
            self._open(performative)
        elif isinstance(performative, Close):
            self.remote_closed = True
            self._events.append(ConnectionClosed(performative.error, True))
            self._close(None, event=False)
        else:
            raise ProtocolError(NOT_ALLOWED, f"{type(performative).__name__} is a SASL frame")

    def _session(self, channel: int) -> Session:
        if not self._opened:
            raise ProtocolError(NOT_ALLOWED, "a frame before open")
        session = self.sessions.get(channel)
        if session is None or session.remote_end is not None:
            raise ProtocolError(NOT_ALLOWED, f"no session on channel {channel}")
        return session

    def _open(self, remote: Open) -> None:
        if self.remote_open is not None:
            raise ProtocolError(NOT_ALLOWED, "a second open")
        self.remote_open = remote
        self.remote_max_frame_size = max(min(remote.max_frame_size, 0xFFFF_FFFF), 512)
        if remote.idle_time_out:
            self.remote_idle_timeout = remote.idle_time_out / 1000
        self._send_open()

    def _send_open(self) -> None:
        if self._opened:
            return
        self._opened = True
        remote = self.remote_open
        channel_max = self.channel_max
        if remote is not None:
            channel_max = min(channel_max, remote.channel_max)
        self.channel_max = channel_max
        self.send(
            0,
            Open(
                self.container_id,
                None,
                self.max_frame_size,
                channel_max,
                int(self.idle_timeout * 1000) if self.idle_timeout else None,
                None,
                None,
                tuple(self.offered_capabilities) if self.offered_capabilities else None,
                None,
                self.properties,
            ),
        )

    def _begin(self, channel: int, remote: Begin) -> None:
        if not self._opened:
            raise ProtocolError(NOT_ALLOWED, "begin before open")
        if remote.remote_channel is not None:
            raise ProtocolError(NOT_ALLOWED, "a begin that answers a session we never began")
        if channel > self.channel_max:
            raise ProtocolError(FRAMING_ERROR, f"channel {channel} is above the channel-max")
        if channel in self.sessions:
            raise ProtocolError(NOT_ALLOWED, f"channel {channel} has a session already")
        session = self.sessions[channel] = Session(self, channel, remote)
        session.send(
            Begin(channel, 0, session.incoming_window, session.outgoing_window, self.max_links - 1)
        )

    def _end(self, session: Session, remote: End) -> None:
        """The links still attached end with the session (AMQP 2.5.4). The detaches the
        peer sent before its end are answered before ours, which waits for the owner."""
        links = list(session.links.values())
        for link in links:
            if not link.remote_detached:
                self.links_held -= 1
            if not link.detached:
                link.suspended = True
            link.remote_detached = link.detached = True
        session.remote_end = remote
        session.links.clear()
        session.outgoing_unsettled.clear()
        session.incoming_unsettled.clear()
        session.blocked.clear()
        self.pending_sessions.discard(session)
        self._events.append(SessionEnded(session, links, remote.error))
        if not session.unanswered:
            self._send_end(session)

    def _send_end(self, session: Session) -> None:
        session.send(End())
        session.ended = True
        del self.sessions[session.channel]
        self.pending_sessions.discard(session)

    def _attach(self, session: Session, remote: Attach) -> None:
        if remote.handle in session.links:
            raise ProtocolError(HANDLE_IN_USE, f"handle {remote.handle} is in use")
        if remote.handle >= self.max_links:
            raise ProtocolError(NOT_ALLOWED, f"handle {remote.handle} is above the handle-max")
        if self.links_held >= self.max_links:
            raise ProtocolError(RESOURCE_LIMIT, f"more than {self.max_links} links at once")
        link = session.links[remote.handle] = Link(session, remote)
        self.links_held += 1
        self._events.append(LinkAttached(link))

    def _detach(self, session: Session, remote: Detach) -> None:
        link = session.links.get(remote.handle)
        if link is None or link.remote_detached:
            return  # a detach of a link that never was, or was ended with its session
        link.remote_detached = True
        link.remote_closed = remote.closed
        link.suspended = not remote.closed and not link.detached
        self.links_held -= 1
        del session.links[remote.handle]  # the peer may use the handle again at once
        link._drop_incoming()
        if link.detached:
            session.link_done(link)
            return
        session.unanswered.add(link)
        self._events.append(LinkDetached(link, remote.error, remote.closed, True))

    def _flow(self, session: Session, flow: Flow) -> None:
        next_incoming = flow.next_incoming_id if flow.next_incoming_id is not None else 0
        session.remote_incoming_window = (
            next_incoming + flow.incoming_window - session.next_outgoing_id
        )
        session.remote_outgoing_window = flow.outgoing_window
        if session.blocked:
            session.unblock()
        link = session.links.get(flow.handle) if flow.handle is not None else None
        if link is not None and not link.detached:  # credit may come before our attach
            if link.is_sender:
                count = flow.delivery_count
                if count is None:
                    count = 0  # our initial delivery count
                credit = flow.link_credit if flow.link_credit is not None else 0
                link.credit = max((count + credit - link.delivery_count) & _SERIAL, 0)
                if link.credit > _SERIAL // 2:  # the peer counted ahead of us: no credit
                    link.credit = 0
                link.drain = flow.drain
                self._events.append(LinkFlow(link))
            elif flow.available is not None:
                link.available = flow.available
            if flow.echo:
                link._request_flow()
        elif flow.echo and flow.handle is None:
            session.window_due = True
            self.pending_sessions.add(session)

    def _transfer(
        self,
        session: Session,
        handle: int,
        delivery_id: int | None,
        tag: bytes | None,
        message_format: int | None,
        settled: bool | None,
        more: bool,
        aborted: bool,
        payload: memoryview,
    ) -> None:
        """A transfer's fields (those the engine reads) and its payload."""
        if session.incoming_window <= 0:
            raise ProtocolError(WINDOW_VIOLATION, "a transfer beyond the session window")
        session.next_incoming_id = (session.next_incoming_id + 1) & _SERIAL
        session.incoming_window -= 1
        if session.incoming_window <= self.incoming_window // 2:
            session.incoming_window = self.incoming_window
            session.window_due = True
            self.pending_sessions.add(session)
        link = session.links.get(handle)
        if link is None:
            raise ProtocolError(UNATTACHED_HANDLE, f"a transfer on handle {handle}")
        if link.detached or link.remote_detached:
            return  # sent before the peer read our detach
        if link.is_sender:
            raise ProtocolError(NOT_ALLOWED, "a transfer on a link the peer receives on")
        delivery = link._incoming
        if delivery is None:
            if delivery_id is None or tag is None:
                raise ProtocolError(INVALID_FIELD, "a delivery without its id or tag")
            if link.credit <= 0:
                link.close(TRANSFER_LIMIT_EXCEEDED, "a transfer without credit")
                self._events.append(LinkDetached(link, None, True, False))
                return
            delivery = Delivery(link, delivery_id, tag, message_format or 0, False)
            delivery.remote_settled = bool(settled)
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & _SERIAL
        elif delivery_id is not None and delivery_id != delivery.id:
            raise ProtocolError(NOT_ALLOWED, "a new delivery before the last one is complete")
        if settled:
            delivery.remote_settled = True
        if aborted:
            link._drop_incoming()
            return
        size = link._incoming_bytes + len(payload)
        limit = link.max_message_size
        if limit is not None and size > limit:
            link.close(MESSAGE_SIZE_EXCEEDED, f"message larger than {limit} bytes")
            self._events.append(LinkDetached(link, None, True, False))
            return
        if more:
            link._incoming = delivery
            link._incoming_parts.append(bytes(payload))
            link._incoming_bytes = size
            return
        if link._incoming_parts:
            link._incoming_parts.append(bytes(payload))
            delivery.payload = b"".join(link._incoming_parts)
            link._drop_incoming()
        else:
            delivery.payload = bytes(payload)
            link._incoming = None
        if delivery.remote_settled:
            delivery.settled = True
        else:
            session.incoming_unsettled[delivery.id] = delivery
        self._events.append(MessageReceived(link, delivery))

    def _disposition(self, session: Session, disposition: Disposition) -> None:
        first = disposition.first
        last = disposition.last if disposition.last is not None else first
        if last < first:
            return  # a range across the wrap of the serial numbers: not ours to have sent
        if disposition.role == RECEIVER:
            self._outcomes(session, first, last, disposition)
            return
        unsettled = session.incoming_unsettled
        if not disposition.settled:
            return
        for delivery_id in _ids(unsettled, first, last):
            delivery = unsettled.pop(delivery_id)
            delivery.remote_settled = True

    def _outcomes(self, session: Session, first: int, last: int, disposition: Disposition) -> None:
        """The peer's outcomes of deliveries we sent: settled here too (a terminal outcome
        leaves us nothing else to do), and told to the owner link by link."""
        unsettled = session.outgoing_unsettled
        state = disposition.state
        settled = disposition.settled
        by_link: dict[Link, list[Delivery]] = {}
        for delivery_id in _ids(unsettled, first, last):
            delivery = unsettled[delivery_id]
            delivery.remote_state = state
            delivery.remote_settled = settled
            if settled or isinstance(state, _TERMINAL):
                delivery.settle()
            by_link.setdefault(delivery.link, []).append(delivery)
        for link, deliveries in by_link.items():
            if link.active:
                self._events.append(DeliveriesUpdated(link, deliveries))

    # -- closing

    def _bad_header(self) -> None:
        self.write(AMQP_HEADER)
        self.closed = True
        self._events.append(ConnectionClosed(Error(FRAMING_ERROR, "not an AMQP 1.0 header"), False))

    def _fail(self, condition: str, description: str) -> None:
        self._close(Error(condition, description))

    def _close(self, error: Error | None, *, event: bool = True) -> None:
        if self.closed:
            return
        if not self._header_seen:
            self._header_seen = True
            self.write(AMQP_HEADER)
        self._send_open()
        for session in self.sessions.values():
            session.flush()
        self.send(0, Close(error))
        self.closed = True
        if event:
            self._events.append(ConnectionClosed(error, False))


def _quick_transfer(
    body: memoryview,
) -> tuple[int, int | None, bytes | None, int | None, bool, bool, bool, int] | None:
    """A transfer's handle, delivery id, tag, message format, settled, more and aborted, and
    where its payload starts, read straight from the bytes when they hold only what
    transfers usually do (None: the general decoder reads it)."""
    code = body[3]
    if code == 0xC0:
        count, position, end = body[5], 6, 5 + body[4]
    elif code == 0xD0:
        count = int.from_bytes(body[8:12], "big")
        position, end = 12, 8 + int.from_bytes(body[4:8], "big")
    else:
        return None
    if count > 11 or end > len(body):
        return None
    fields: list[Any] = [None] * 11
    try:
        for index in range(count):
            code = body[position]
            if code == 0x40:
                position += 1
            elif code == 0x43:
                fields[index] = 0
                position += 1
            elif code == 0x52 or code == 0x50:
                fields[index] = body[position + 1]
                position += 2
            elif code == 0x70:
                fields[index] = int.from_bytes(body[position + 1 : position + 5], "big")
                position += 5
            elif code == 0x41 or code == 0x42:
                fields[index] = code == 0x41
                position += 1
            elif code == 0xA0 and index == 2:
                start = position + 2
                position = start + body[position + 1]
                fields[index] = bytes(body[start:position])
            else:
                return None  # a state, a long tag...: the general decoder
    except IndexError:
        return None
    handle = fields[0]
    if (
        position != end
        or type(handle) is not int
        or any(type(fields[i]) is bool for i in (1, 3, 6))
        or any(type(fields[i]) is int for i in (4, 5, 8, 9, 10))
    ):
        return None  # a field of the wrong type: the general decoder words the error
    return (handle, fields[1], fields[2], fields[3], bool(fields[4]), bool(fields[5]),
            bool(fields[9]), end)  # fmt: skip


def _ids(unsettled: dict[int, Delivery], first: int, last: int) -> list[int]:
    """The ids in ``first..last`` that ``unsettled`` holds, in order (a huge range from the
    peer costs what the map holds, not what the range spans)."""
    if last - first + 1 <= len(unsettled):
        return [i for i in range(first, last + 1) if i in unsettled]
    return sorted(i for i in unsettled if first <= i <= last)
