"""The server side of one AMQP 1.0 connection, sans I/O (part 2): bytes in, events out, bytes
to send back.

The owner feeds what the socket reads to :meth:`AmqpProtocol.receive_data`, handles the
:meth:`AmqpProtocol.events` that follow (a link to attach or refuse, a message, an outcome, a
detach...), calls the :class:`~.session.Link` and :class:`~.session.Delivery` methods it
likes, and writes :meth:`AmqpProtocol.data_to_send` (everything of one batch in one write).
:meth:`AmqpProtocol.tick` keeps the idle time-outs. Nothing here knows the server: a link is
an address and a role, a message its bytes.

The engine answers what needs no decision by itself: ``open``, ``begin``, ``end``, ``close``,
echoed flows, session windows, the settling of what the peer has decided. It begins no
session and attaches no link of its own: its sessions mirror the peer's on the same channel
numbers, and each link the peer attaches gets a handle of ours when it is answered. Frames
that break the protocol close the connection with the condition the spec names; frames about
links or deliveries that are gone are ignored.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from .conditions import (
    DECODE_ERROR,
    FRAMING_ERROR,
    HANDLE_IN_USE,
    INVALID_FIELD,
    MESSAGE_SIZE_EXCEEDED,
    NOT_ALLOWED,
    RESOURCE_LIMIT,
    TRANSFER_LIMIT_EXCEEDED,
    UNATTACHED_HANDLE,
    WINDOW_VIOLATION,
)
from .events import (
    ConnectionClosed,
    DeliveriesUpdated,
    Event,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    SessionEnded,
)
from .framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    EMPTY_FRAME,
    FrameReader,
    FramingError,
    decode_body,
    encode_frame,
)
from .performatives import (
    RECEIVER,
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
    Transfer,
)
from .session import SERIAL, Delivery, Link, Session
from .transfers import quick_transfer
from .types import DecodeError, EncodeError

_TERMINAL: Final = (Accepted, Rejected, Released, Modified)


class ProtocolError(Exception):
    """The peer broke the protocol: the connection is closed with ``condition``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


class AmqpProtocol:
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
        self.out: list[bytes | bytearray] = []  # joined by data_to_send
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
        if not self.out:
            return b""
        out = self.out[0] if len(self.out) == 1 else b"".join(self.out)
        self.out = []
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
            if now >= due and not self.out:
                self.out.append(EMPTY_FRAME)
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
        self.out.append(out)

    def write(self, frame: bytes | bytearray) -> None:
        if not self.closed:
            self.out.append(frame)

    # -- frames

    def _frame(self, channel: int, body: memoryview) -> None:
        if len(body) > 5 and body[2] == 0x14 and body[1] == 0x53 and body[0] == 0:
            quick = quick_transfer(body)
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
            self.send_end(session)

    def send_end(self, session: Session) -> None:
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
                link.credit = max((count + credit - link.delivery_count) & SERIAL, 0)
                if link.credit > SERIAL // 2:  # the peer counted ahead of us: no credit
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
        session.next_incoming_id = (session.next_incoming_id + 1) & SERIAL
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
            link.delivery_count = (link.delivery_count + 1) & SERIAL
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


def _ids(unsettled: dict[int, Delivery], first: int, last: int) -> list[int]:
    """The ids in ``first..last`` that ``unsettled`` holds, in order (a huge range from the
    peer costs what the map holds, not what the range spans)."""
    if last - first + 1 <= len(unsettled):
        return [i for i in range(first, last + 1) if i in unsettled]
    return sorted(i for i in unsettled if first <= i <= last)
