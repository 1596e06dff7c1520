"""The sans-I/O AMQP engine against proton's engine as the client, bytes passed in memory: every
performative, credit, windows, settlement both ways, multi-frame transfers, negotiation,
idle time-outs, errors; and frame streams cut and corrupted at random."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from proton import Collector, Connection, Delivery, Endpoint, Link, Message, Transport

from futoin_evt.amqp.engine.events import (
    ConnectionClosed,
    DeliveriesUpdated,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    SessionEnded,
)
from futoin_evt.amqp.engine.framing import AMQP_HEADER, FrameReader, decode_body
from futoin_evt.amqp.engine.performatives import (
    Accepted,
    Attach,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    Rejected,
    Transfer,
)
from futoin_evt.amqp.engine.protocol import AmqpProtocol


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Pair:
    """Our engine as the server, proton's as the client, wired back to back."""

    def __init__(self, client_frame_size: int | None = None, **options: Any) -> None:
        self.clock = Clock()
        self.engine = AmqpProtocol("server", clock=self.clock, **options)
        self.transport = Transport()
        if client_frame_size is not None:
            self.transport.max_frame_size = client_frame_size
        self.connection = Connection()
        self.connection.container = "client"
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.events: list[Any] = []
        self.received: list[Any] = []
        self.sent_bytes = bytearray()
        self.client_bytes = bytearray()
        self.eof = False
        self.on_attach: Callable[[Any], object] = lambda link: link.accept()
        self.on_message: Callable[[Any, Any], object] = lambda _link, delivery: delivery.accept()

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                data = self.transport.peek(pending) or b""
                self.transport.pop(pending)
                self.client_bytes += data
                self.engine.receive_data(data)
                moved = True
            for event in self.engine.events():
                self.events.append(event)
                self.handle(event)
            out = self.engine.data_to_send()
            if out:
                self.sent_bytes += out
                view = memoryview(out)
                while view and self.transport.capacity() > 0:
                    used = min(self.transport.capacity(), len(view))
                    self.transport.push(bytes(view[:used]))
                    view = view[used:]
                moved = True
            if self.engine.finished and not self.eof and not out:
                self.eof = True
                self.transport.close_tail()
                moved = True
            if not moved:
                return
        raise AssertionError("the two engines never settle down")

    def handle(self, event: Any) -> None:
        if isinstance(event, LinkAttached):
            self.on_attach(event.link)
        elif isinstance(event, MessageReceived):
            self.received.append(event.delivery)
            self.on_message(event.link, event.delivery)
        elif isinstance(event, LinkDetached) and event.by_peer:
            event.link.close()

    def open(self) -> Any:
        self.connection.open()
        session = self.connection.session()
        session.open()
        self.pump()
        return session

    def server_frames(self) -> list[tuple[int, Composite, bytes]]:
        return _frames(bytes(self.sent_bytes))

    def client_frames(self) -> list[tuple[int, Composite, bytes]]:
        return _frames(bytes(self.client_bytes))


def _frames(raw: bytes) -> list[tuple[int, Composite, bytes]]:
    assert raw.startswith(AMQP_HEADER)
    frames = []
    for _kind, channel, body in FrameReader(1 << 30).feed(raw[8:]):
        if body:
            performative, payload = decode_body(body)
            frames.append((channel, performative, bytes(payload)))
    return frames


def _performatives(frames: list[tuple[int, Composite, bytes]], kind: type) -> list[Any]:
    return [p for _c, p, _b in frames if isinstance(p, kind)]


def _condition(endpoint: Any) -> str:
    condition = getattr(endpoint, "remote_condition", None) or endpoint.condition
    assert condition is not None
    return str(condition.name)


def _sender(session: Any, address: str, name: str = "out") -> Any:
    link = session.sender(name)
    link.target.address = address
    link.open()
    return link


def _receiver(session: Any, address: str, name: str = "in") -> Any:
    link = session.receiver(name)
    link.source.address = address
    link.open()
    return link


def _send(link: Link, body: bytes, tag: str) -> Delivery:
    delivery = link.delivery(tag)
    link.send(body)
    link.advance()
    return delivery


def test_open_and_begin_are_answered_with_every_field() -> None:
    pair = Pair(properties={"product": "test"}, offered_capabilities=["CAP"])
    pair.open()
    assert pair.connection.remote_container == "server"
    assert pair.connection.state & Endpoint.REMOTE_ACTIVE
    assert pair.connection.remote_offered_capabilities == ["CAP"]
    raw = bytes(pair.sent_bytes)
    # the open's field list holds all ten fields
    assert raw[8 + 8 : 8 + 8 + 3] == b"\x00\x53\x10"
    assert raw[8 + 8 + 5] == 10
    opened = _performatives(pair.server_frames(), Open)[0]
    assert opened.max_frame_size == 64 * 1024
    assert opened.idle_time_out == 60_000


def test_messages_in_are_received_and_settled_in_one_disposition() -> None:
    pair = Pair()
    session = pair.open()
    sender = _sender(session, "events")
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    assert link.address == "events"
    assert not link.is_sender
    pair.on_message = lambda _l, _d: None
    link.flow(100)
    pair.pump()
    assert sender.credit == 100
    deliveries = [_send(sender, f"message {n}".encode(), str(n)) for n in range(10)]
    pair.pump()
    assert [d.payload for d in pair.received] == [f"message {n}".encode() for n in range(10)]
    assert [d.tag for d in pair.received] == [str(n).encode() for n in range(10)]
    for delivery in pair.received:
        delivery.accept()
    pair.pump()
    assert all(d.remote_state == Delivery.ACCEPTED and d.settled for d in deliveries)
    dispositions = _performatives(pair.server_frames(), Disposition)
    assert len(dispositions) == 1
    assert (dispositions[0].first, dispositions[0].last, dispositions[0].settled) == (0, 9, True)
    assert isinstance(dispositions[0].state, Accepted)
    assert link.credit == 90


def test_rejections_carry_their_error() -> None:
    pair = Pair()
    pair.on_attach = lambda link: (link.accept(), link.flow(10))
    pair.on_message = lambda _l, d: d.reject("amqp:invalid-field", "no good")
    session = pair.open()
    sender = _sender(session, "events")
    pair.pump()
    delivery = _send(sender, b"x", "1")
    pair.pump()
    assert delivery.remote_state == Delivery.REJECTED
    assert _condition(delivery.remote) == "amqp:invalid-field"
    assert isinstance(_performatives(pair.server_frames(), Disposition)[0].state, Rejected)


def test_presettled_messages_need_no_disposition() -> None:
    pair = Pair()
    pair.on_attach = lambda link: (link.accept(), link.flow(10))
    session = pair.open()
    sender = _sender(session, "events")
    sender.snd_settle_mode = Link.SND_SETTLED
    pair.pump()
    delivery = _send(sender, b"x", "1")
    delivery.settle()
    pair.pump()
    assert pair.received[0].remote_settled
    assert _performatives(pair.server_frames(), Disposition) == []


def test_messages_out_follow_credit_and_outcomes_come_back() -> None:
    pair = Pair()
    session = pair.open()
    receiver = _receiver(session, "events")
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    assert link.is_sender
    assert link.address == "events"
    receiver.flow(5)
    pair.pump()
    assert any(isinstance(e, LinkFlow) for e in pair.events)
    assert link.credit == 5
    sent: list[Any] = []
    while link.credit > 0:
        sent.append(link.send([b"part one,", b" part two"], str(len(sent)).encode()))
    pair.pump()
    got = []
    while (delivery := receiver.current) is not None and not delivery.partial:
        got.append(receiver.recv(delivery.pending))
        receiver.advance()
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
    pair.pump()
    assert got == [b"part one, part two"] * 5
    updated = [d for e in pair.events if isinstance(e, DeliveriesUpdated) for d in e.deliveries]
    assert updated == sent
    assert all(isinstance(d.remote_state, Accepted) and d.settled for d in sent)
    assert pair.engine.sessions[0].outgoing_unsettled == {}
    transfers = _performatives(pair.server_frames(), Transfer)
    assert all(t.settled is False for t in transfers)
    # every field of a transfer is written: some clients count them to find the payload
    raw = bytes(pair.sent_bytes)
    at = raw.index(b"\x00\x53\x14")
    assert raw[at + 5] == 11


def test_presettled_sends_on_a_settled_link() -> None:
    pair = Pair()
    session = pair.open()
    receiver = session.receiver("in")
    receiver.source.address = "events"
    receiver.snd_settle_mode = Link.SND_SETTLED
    receiver.open()
    receiver.flow(1)
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    delivery = link.send(b"x", b"1")
    assert delivery.settled
    pair.pump()
    assert receiver.current.settled
    assert pair.engine.sessions[0].outgoing_unsettled == {}


def test_drain_uses_up_the_credit() -> None:
    pair = Pair()
    session = pair.open()
    receiver = _receiver(session, "events")
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    receiver.drain(10)
    pair.pump()
    assert link.drain
    assert link.credit == 10
    link.send(b"x", b"1")
    link.drained()
    pair.pump()
    assert not receiver.draining()
    flows = _performatives(pair.server_frames(), Flow)
    assert flows[-1].delivery_count == 10
    assert flows[-1].link_credit == 0


def test_large_messages_go_in_many_frames_both_ways() -> None:
    pair = Pair(client_frame_size=1024, max_frame_size=2048)
    pair.on_attach = lambda link: (link.accept(max_message_size=100_000), link.flow(10))
    session = pair.open()
    assert pair.engine.remote_max_frame_size == 1024
    assert pair.transport.remote_max_frame_size == 2048
    sender = _sender(session, "events")
    receiver = _receiver(session, "events", "in")
    receiver.flow(1)
    pair.pump()
    body = bytes(random.Random(1).randbytes(20_000))
    _send(sender, body, "big")
    pair.pump()
    assert pair.received[0].payload == body
    incoming = [t for _c, t, _b in pair.client_frames() if isinstance(t, Transfer)]
    assert len(incoming) > 9
    assert incoming[0].more
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached) and e.link.is_sender)
    link.send(body, b"big")
    pair.pump()
    delivery: Any = receiver.current
    assert not delivery.partial
    assert receiver.recv(delivery.pending) == body
    outgoing = [t for _c, t, _b in pair.server_frames() if isinstance(t, Transfer)]
    assert len(outgoing) > 19
    assert outgoing[0].more
    assert not outgoing[-1].more
    assert all(len(f) <= 1024 for f in _frame_sizes(bytes(pair.sent_bytes)))


def _frame_sizes(raw: bytes) -> list[bytes]:
    sizes, position = [], 8
    while position < len(raw):
        size = int.from_bytes(raw[position : position + 4], "big")
        sizes.append(raw[position : position + size])
        position += size
    return sizes


def test_a_message_above_the_link_maximum_detaches_the_link() -> None:
    pair = Pair(client_frame_size=1024)
    pair.on_attach = lambda link: (link.accept(max_message_size=5000), link.flow(10))
    session = pair.open()
    sender = _sender(session, "events")
    pair.pump()
    _send(sender, b"x" * 6000, "big")
    pair.pump()
    assert _condition(sender) == "amqp:link:message-size-exceeded"
    detached = [e for e in pair.events if isinstance(e, LinkDetached)]
    assert len(detached) == 1
    assert not detached[0].by_peer
    assert pair.received == []
    sender.close()
    pair.pump()
    assert pair.engine.sessions[0].links == {}
    assert pair.engine.links_held == 0


def test_a_refused_link_is_attached_without_terminus_and_detached() -> None:
    pair = Pair()
    pair.on_attach = lambda link: link.refuse("amqp:not-found", "no such node")
    session = pair.open()
    sender = _sender(session, "nowhere")
    pair.pump()
    assert _condition(sender) == "amqp:not-found"
    assert sender.state & Endpoint.REMOTE_CLOSED
    sender.close()
    pair.pump()
    assert pair.engine.links_held == 0


def test_a_detach_is_answered_when_the_owner_says() -> None:
    pair = Pair()
    session = pair.open()
    sender = _sender(session, "events")
    pair.pump()
    pair.handle = lambda event: (  # type: ignore[method-assign]
        event.link.accept() if isinstance(event, LinkAttached) else None
    )
    sender.close()
    pair.pump()
    detached = [e for e in pair.events if isinstance(e, LinkDetached)]
    assert detached[0].by_peer
    assert detached[0].closed
    assert not sender.state & Endpoint.REMOTE_CLOSED
    detached[0].link.close()
    pair.pump()
    assert sender.state & Endpoint.REMOTE_CLOSED
    assert pair.engine.sessions[0].links == {}


def test_ending_a_session_ends_its_links() -> None:
    pair = Pair()
    session = pair.open()
    _sender(session, "events", "a")
    _receiver(session, "events", "b")
    pair.pump()
    session.close()
    pair.pump()
    ended = [e for e in pair.events if isinstance(e, SessionEnded)]
    assert sorted(link.name for link in ended[0].links) == ["a", "b"]
    assert session.state & Endpoint.REMOTE_CLOSED
    assert pair.engine.sessions == {}
    assert pair.engine.links_held == 0


def test_a_detach_sent_with_the_end_is_answered_before_our_end() -> None:
    pair = Pair()
    session = pair.open()
    receiver = _receiver(session, "events")
    pair.pump()
    receiver.close()
    session.close()  # detach and end arrive in one read, as rhea sends them
    pair.pump()
    assert receiver.state & Endpoint.REMOTE_CLOSED
    assert session.state & Endpoint.REMOTE_CLOSED
    last: list[Any] = [p for _c, p, _b in pair.server_frames() if isinstance(p, Detach | End)]
    assert [type(p) for p in last[-2:]] == [Detach, End]
    assert last[-2].closed
    assert pair.engine.sessions == {}


def test_the_end_waits_for_the_detaches_the_owner_answers_late() -> None:
    pair = Pair()
    session = pair.open()
    receiver = _receiver(session, "events", "late")
    sender = _sender(session, "events", "attached")
    pair.pump()
    incoming = next(
        e.link for e in pair.events if isinstance(e, LinkAttached) and e.link.name == "attached"
    )
    incoming.flow(10)
    pair.on_message = lambda _l, _d: None
    pair.pump()
    pair.handle = lambda event: (  # type: ignore[method-assign]
        pair.received.append(event.delivery) if isinstance(event, MessageReceived) else None
    )
    _send(sender, b"unsettled", "1")
    receiver.close()
    session.close()
    pair.pump()
    # the peer's end is in and our detach is not: no end yet, and nothing else on the session
    assert not receiver.state & Endpoint.REMOTE_CLOSED
    assert not session.state & Endpoint.REMOTE_CLOSED
    ended = [e for e in pair.events if isinstance(e, SessionEnded)]
    assert [link.name for link in ended[0].links] == ["attached"]
    sent = len(pair.sent_bytes)
    pair.received[0].accept()
    pair.pump()
    assert len(pair.sent_bytes) == sent
    late = next(e.link for e in pair.events if isinstance(e, LinkDetached))
    late.close()
    pair.pump()
    assert receiver.state & Endpoint.REMOTE_CLOSED
    assert session.state & Endpoint.REMOTE_CLOSED
    assert not _performatives(pair.server_frames(), Disposition)
    assert pair.engine.sessions == {}
    assert pair.engine.links_held == 0
    # the channel is free for a new session
    again = pair.connection.session()
    again.open()
    _sender(again, "events", "next")
    pair.pump()
    assert again.state & Endpoint.REMOTE_ACTIVE


def test_closing_both_ways() -> None:
    pair = Pair()
    pair.open()
    pair.connection.close()
    pair.pump()
    assert [e.by_peer for e in pair.events if isinstance(e, ConnectionClosed)] == [True]
    assert pair.connection.state & Endpoint.REMOTE_CLOSED
    assert pair.engine.finished

    pair = Pair()
    pair.open()
    pair.engine.close("amqp:connection:forced", "shutting down")
    pair.pump()
    assert _condition(pair.connection) == "amqp:connection:forced"


def test_channel_max_and_frame_size_are_negotiated() -> None:
    pair = Pair(channel_max=100)
    pair.transport.channel_max = 10
    pair.open()
    assert pair.engine.channel_max == 10
    assert pair.transport.remote_channel_max == 10
    assert _performatives(pair.server_frames(), Open)[0].channel_max == 10


def test_a_begin_beyond_channel_max_closes_with_a_framing_error() -> None:
    pair = Pair(channel_max=3)
    pair.connection.open()
    sessions = [pair.connection.session() for _ in range(5)]
    for session in sessions:
        session.open()
    pair.pump()
    assert pair.connection.remote_condition is not None


def test_a_shut_session_window_holds_transfers_back() -> None:
    pair = Pair(client_frame_size=512)
    pair.connection.open()
    session = pair.connection.session()
    session.incoming_capacity = 2048  # a window of four frames
    session.open()
    receiver = _receiver(session, "events")
    receiver.flow(20)
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    for n in range(20):
        link.send(b"y" * 300, str(n).encode())
    pair.pump()
    server = pair.engine.sessions[0]
    assert server.blocked  # the peer's window is shut
    got = []
    for _ in range(100):
        while (delivery := receiver.current) is not None and not delivery.partial:
            got.append(receiver.recv(delivery.pending))
            receiver.advance()
            delivery.settle()
        pair.pump()
        if len(got) == 20:
            break
    assert got == [b"y" * 300] * 20
    assert not server.blocked


def test_idle_peers_are_closed_and_we_keep_alive() -> None:
    pair = Pair(idle_timeout=10.0)
    pair.transport.idle_timeout = 4.0
    pair.open()
    before = len(pair.sent_bytes)
    pair.clock.now += 2.5  # past half the peer's time-out: an empty frame
    deadline = pair.engine.tick()
    pair.pump()
    assert bytes(pair.sent_bytes[before:]) == b"\x00\x00\x00\x08\x02\x00\x00\x00"
    assert deadline is not None
    pair.clock.now += 11  # nothing from the peer for longer than ours
    assert pair.engine.tick() is None
    pair.pump()
    assert _condition(pair.connection) == "amqp:resource-limit-exceeded"


def test_messages_round_trip_through_proton_message() -> None:
    pair = Pair()
    pair.on_attach = lambda link: (link.accept(), link.flow(10))
    session = pair.open()
    sender = _sender(session, "events")
    pair.pump()
    message = Message(subject="TYPE", body={"a": 1}, properties={"k": "v"})
    _send(sender, message.encode(), "1")
    pair.pump()
    decoded = Message()
    decoded.decode(pair.received[0].payload)
    assert decoded.subject == "TYPE"
    assert decoded.body == {"a": 1}


def test_a_wrong_header_gets_ours_and_the_end() -> None:
    engine = AmqpProtocol("server")
    engine.receive_data(b"HTTP/1.1 200 OK\r\n")
    assert engine.data_to_send() == AMQP_HEADER
    assert engine.finished


@pytest.mark.parametrize(
    ("frame", "condition"),
    [
        (b"\x00\x00\x00\x07\x02\x00\x00\x00", "amqp:connection:framing-error"),
        (b"\x00\x10\x00\x00\x02\x00\x00\x00" + b"\x00" * 8, "amqp:connection:framing-error"),
        (b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x77\x45", "amqp:decode-error"),
        (b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x10\x45", "amqp:invalid-field"),
        (b"\x00\x00\x00\x0e\x02\x00\x00\x00\x00\x53\x12\xd0\xff\xff", "amqp:decode-error"),
    ],
)
def test_broken_frames_close_with_the_condition(frame: bytes, condition: str) -> None:
    pair = Pair(max_frame_size=4096)
    pair.open()
    pair.engine.receive_data(frame)
    closes = _performatives(_frames(bytes(pair.sent_bytes) + pair.engine.data_to_send()), Close)
    assert closes[-1].error.condition == condition
    assert pair.engine.finished


def _client_stream() -> bytes:
    """What a proton client sends in a busy session: links, credit, messages, outcomes."""
    pair = Pair(client_frame_size=1024)
    pair.on_attach = lambda link: (link.accept(), link.flow(50))
    session = pair.open()
    sender = _sender(session, "events")
    receiver = _receiver(session, "events", "in")
    receiver.flow(10)
    pair.pump()
    for n in range(20):
        _send(sender, bytes([n]) * (n * 150), str(n))
    pair.pump()
    out = next(e.link for e in pair.events if isinstance(e, LinkAttached) and e.link.is_sender)
    for n in range(10):
        out.send(b"z" * 100, str(n).encode())
    pair.pump()
    while (delivery := receiver.current) is not None:
        receiver.recv(delivery.pending)
        receiver.advance()
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
    sender.close()
    pair.connection.close()
    pair.pump()
    return bytes(pair.client_bytes)


def _serve(engine: AmqpProtocol) -> None:
    for event in engine.events():
        if isinstance(event, LinkAttached):
            event.link.accept()
            event.link.flow(50)
        elif isinstance(event, MessageReceived):
            event.delivery.accept()
        elif isinstance(event, LinkDetached) and event.by_peer:
            event.link.close()
        elif isinstance(event, LinkFlow):
            while event.link.credit > 0:
                event.link.send(b"q", b"t")
    engine.data_to_send()


def test_cut_and_corrupted_streams_never_raise() -> None:
    stream = _client_stream()
    rng = random.Random(25)
    for _ in range(400):
        data = bytearray(stream)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[at] = rng.randrange(256)
            elif choice < 0.75:
                del data[at : at + rng.randint(1, 40)]
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 40))
        engine = AmqpProtocol("server", max_frame_size=4096)
        position = 0
        while position < len(data) and not engine.finished:
            step = rng.randint(1, 700)
            engine.receive_data(bytes(data[position : position + step]))
            _serve(engine)
            position += step
        engine.receive_eof()
        _serve(engine)
        assert engine.finished


def test_a_peer_that_answers_an_error_with_more_frames_is_ignored() -> None:
    pair = Pair(max_frame_size=4096)
    pair.open()
    pair.engine.receive_data(b"\x00\x00\x00\x07\x02\x00\x00\x00")
    pair.engine.data_to_send()
    pair.engine.receive_data(b"\x00" * 100)
    assert pair.engine.data_to_send() == b""


def test_unknown_links_and_deliveries_are_ignored() -> None:
    pair = Pair()
    session = pair.open()
    pair.engine.receive_data(
        _encode_frame(0, Disposition(True, 0, 10**6, True, Accepted()))
        + _encode_frame(0, Flow(0, 100, 0, 100, 999, 0, 10))
    )
    _sender(session, "events")
    pair.pump()
    assert not pair.engine.finished
    assert any(isinstance(e, LinkAttached) for e in pair.events)


def _encode_frame(channel: int, performative: Composite) -> bytes:
    from futoin_evt.amqp.engine.framing import frame_bytes

    return frame_bytes(channel, performative)


def test_transfers_read_quickly_match_the_general_decoder() -> None:
    from futoin_evt.amqp.engine.transfers import quick_transfer
    from futoin_evt.amqp.engine.types import encode

    cases = [
        Transfer(0, 0, b"t", 0, False),
        Transfer(7, 70000, b"tag" * 10, 0x80013700, True, True),
        Transfer(3),
        Transfer(1, 2, b"x", 0, None, False, 1, None, False, True, True),
    ]
    for transfer in cases:
        body = memoryview(encode(transfer.described()) + b"payload")
        quick = quick_transfer(body)
        assert quick is not None
        t = decode_body(body)[0]
        assert isinstance(t, Transfer)
        fields = (t.handle, t.delivery_id, t.delivery_tag, t.message_format)
        assert quick[:7] == (*fields, bool(t.settled), t.more, t.aborted)
        assert bytes(body[quick[7] :]) == b"payload"
    bool_handle = memoryview(b"\x00\x53\x14\xc0\x02\x01\x41")
    assert quick_transfer(bool_handle) is None


@pytest.mark.parametrize("size", range(9, 17))
def test_frames_of_every_short_size_close_with_a_decode_error(size: int) -> None:
    pair = Pair(max_frame_size=4096)
    pair.open()
    pair.engine.receive_data(
        b"\x00\x00\x00"
        + bytes([size])
        + b"\x02\x00\x00\x00"
        + b"\x00\x53\x14\xc0\xff\x0b\x52\x01"[: size - 8]
    )
    closes = _performatives(_frames(bytes(pair.sent_bytes) + pair.engine.data_to_send()), Close)
    assert closes[-1].error.condition.startswith("amqp:")


def test_links_ended_without_closing_are_suspended() -> None:
    pair = Pair()
    session = pair.open()
    kept = _receiver(session, "events", "kept")
    closed = _receiver(session, "events", "closed")
    _receiver(session, "events", "with-session")
    pair.pump()
    links = {e.link.name: e.link for e in pair.events if isinstance(e, LinkAttached)}
    kept.detach()  # closed=false
    closed.close()
    pair.pump()
    assert links["kept"].suspended
    assert not links["closed"].suspended
    session.close()
    pair.pump()
    assert links["with-session"].suspended
    # a connection that drops suspends what is still attached
    pair = Pair()
    _receiver(pair.open(), "events", "dropped")
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    pair.engine.lost()
    assert link.suspended


def test_an_unsettled_map_is_cut_to_the_peer_frame_size() -> None:
    pair = Pair(client_frame_size=512)
    unsettled = {b"%d" % i: None for i in range(1000)}
    pair.on_attach = lambda link: link.accept(unsettled=unsettled)
    _receiver(pair.open(), "events")
    pair.pump()
    (attach,) = _performatives(pair.server_frames(), Attach)
    assert attach.incomplete_unsettled
    assert 0 < len(attach.unsettled) < 1000
    assert list(attach.unsettled) == list(unsettled)[: len(attach.unsettled)]  # the oldest


def test_resumed_transfers_carry_resume_and_the_state() -> None:
    pair = Pair()
    receiver = _receiver(pair.open(), "events")
    pair.pump()
    link = next(e.link for e in pair.events if isinstance(e, LinkAttached))
    receiver.flow(2)
    pair.pump()
    link.send(b"", b"7", settled=True, resume=True, state=Accepted())
    link.send(b"body", b"8", resume=True)
    pair.pump()
    settled, whole = _performatives(pair.server_frames(), Transfer)
    assert (settled.delivery_tag, settled.resume, settled.settled) == (b"7", True, True)
    assert isinstance(settled.state, Accepted)
    assert (whole.delivery_tag, whole.resume, whole.settled, whole.state) == (
        b"8",
        True,
        False,
        None,
    )
    assert [d.tag for d in pair.engine.sessions[0].outgoing_unsettled.values()] == [b"8"]
