"""Generated hostile input against the server's WebSocket/FTN3 layer, one connection per example.

Each example opens a :class:`ServerIO` of a running server (real SQLite file) over an in-memory
transport, sends generated units (whole messages, fragmented or not, with hostile values in
every envelope field and in params; random bytes; a truncated frame and EOF) and checks what a
peer relies on: every message with a valid ``rid`` is answered at most once, and each sent
before any garbage (which may begin a frame that swallows what follows) exactly once unless
the server closes the connection, nothing escapes to the error log, and a closed connection
leaves no socket and no FTN3 connection behind. ``--hypothesis-profile=long`` runs many more
examples.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import SEND_EOF, State
from websockets.uri import parse_uri

from futoin_evt.auth.users import hash_password
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig, WebSocketTransport
from futoin_evt.wsio import ServerIO

from .support.servers import USERS, add_user

pytestmark = pytest.mark.functional

#: A bound for one example to finish; reaching it is a failure, never a synchronisation.
EXAMPLE_SECONDS = 15.0  # above the server's 10 s closing-handshake timer
_ports = itertools.count(20000)


# -- the server, once per module, on a loop of our own -------------------------------------------


@dataclass
class Running:
    loop: asyncio.AbstractEventLoop
    server: EventServer

    @property
    def transport(self) -> WebSocketTransport:
        return self.server._transport


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db_path: Path = tmp_path_factory.mktemp("fuzz") / "events.sqlite"
    loop = asyncio.new_event_loop()

    async def start() -> EventServer:
        config = ServerConfig(db=db_path, transport=TransportConfig(port=0))
        server = await EventServer.start(config)
        for name, password in USERS.items():
            await add_user(server.store, name, hash_password(password))
        await server.access.changed_here()
        return server

    server = loop.run_until_complete(start())
    try:
        yield Running(loop, server)
    finally:
        loop.run_until_complete(server.close())
        loop.close()


class ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# -- an in-memory transport between the server's protocol and a sans-I/O client ----------------


@dataclass
class Wire(asyncio.Transport):
    """What the server writes goes to ``client``; what the client sends reaches the server
    as asyncio would deliver it (not while paused, nothing after close)."""

    protocol: ServerIO
    client: ClientProtocol
    port: int
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    replies: Counter[str] = field(default_factory=Counter)
    server_closed: bool = False
    lost: bool = False
    _closing: bool = False
    _reading: bool = True
    _held: list[bytes] = field(default_factory=list)
    _held_eof: bool = False

    def __post_init__(self) -> None:
        super().__init__()

    # the server's side

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.port) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self._closing, "a write after close"
        self.client.receive_data(bytes(data))
        self._read_client_events()

    def write_eof(self) -> None:
        self.client.receive_eof()
        self._read_client_events()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._end()

    def abort(self) -> None:
        self._end()

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        self._reading = True
        held, self._held = self._held, []
        for data in held:
            asyncio.get_running_loop().call_soon(self.feed, data)
        if self._held_eof:
            asyncio.get_running_loop().call_soon(self.feed_eof)

    def _end(self) -> None:
        if not self._closing:
            self._closing = True
            self.server_closed = True
            asyncio.get_running_loop().call_soon(self._lose)

    def _lose(self) -> None:
        self.lost = True
        self.protocol.connection_lost(None)
        self.changed.set()

    async def next_change(self) -> None:
        self.changed.clear()
        await self.changed.wait()

    def _read_client_events(self) -> None:
        for event in self.client.events_received():
            if not isinstance(event, Frame):
                continue  # the handshake response
            if event.opcode is Opcode.CLOSE:
                self.server_closed = True
            elif event.opcode in (Opcode.TEXT, Opcode.BINARY):
                rid = json.loads(bytes(event.data)).get("rid")
                assert isinstance(rid, str), event.data[:200]
                self.replies[rid] += 1
        self.send_client_data()
        self.changed.set()

    def send_client_data(self) -> None:
        """Deliver what the client protocol has to send (a close reply, a pong) after what is
        already on its way, and its EOF: it ends the stream once the server's has ended."""
        loop = asyncio.get_running_loop()
        chunks = self.client.data_to_send()
        data = b"".join(chunks)
        if data:
            loop.call_soon(self.feed, data)
        if SEND_EOF in chunks:
            loop.call_soon(self.feed_eof)

    # the client's side

    def feed(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._reading:
            self._held.append(data)
            return
        self.protocol.data_received(data)

    def feed_eof(self) -> None:
        if self._closing:
            return
        if not self._reading:
            self._held_eof = True
            return
        protocol: asyncio.Protocol = self.protocol
        if not protocol.eof_received():
            self.close()  # as asyncio does when the protocol does not keep a half-open socket


# -- generated input ----------------------------------------------------------------------------

HUGE = "1" + "0" * 5000
HOSTILE_LEAVES = [
    HUGE,
    "-" + "9" * 5000,
    "1e999",
    "-1e999",
    "1e-999",
    "1" + "0" * 5000 + ".5",
    '"\\ud800"',
    '"\\udfff:pw"',
    '"a\\ud800\\u0000b"',
    '"\\ud800:pw"',
    '"' + "x" * 70_000 + '"',
    "null",
    "true",
    "[]",
    "{}",
    '""',
    "-0",
    "4294967296",
]


def _short(data: bytes) -> str:
    """A repr with long runs folded, so that a failing example stays readable."""
    return re.sub(r"(.)\1{15,}", lambda m: f"<{m[1]}*{len(m[0])}>", repr(data))


def deep(depth: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    inner = '{"a":' if opener == "{" else "["
    if opener == "{":
        return inner * depth + "0" + closer * depth
    return inner * depth + closer * depth


leaf = st.one_of(
    st.sampled_from(HOSTILE_LEAVES),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=40).map(lambda s: json.dumps(s)),
    st.builds(deep, st.integers(1, 5000), st.sampled_from("[{")),
)
json_text = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.dictionaries(st.text(max_size=8), inner, max_size=4).map(
            lambda d: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=8,
)

FUNCTIONS = [
    "futoin.ping:1.0:ping",
    "futoin.evt.gen:1.1:addEvent",
    "futoin.evt.gen:1.0:addEvent",
    "futoin.evt.poll:1.0:pollEvents",
    "futoinevt.ops:1.0:streamInfo",
    "futoin.ping:1" + "0" * 5000 + ":ping",
    "futoin.ping:1.0:nope",
    "futoin.ping:1.0",
]
f_value = st.one_of(st.sampled_from(FUNCTIONS).map(json.dumps), json_text)
p_value = st.one_of(
    st.builds(lambda v: '{"echo":' + v + "}", json_text),
    st.builds(lambda t, d: '{"type":' + t + ',"data":' + d + "}", json_text, json_text),
    st.builds(lambda d: '{"type":"T","data":' + d + "}", json_text),
    json_text,
)
sec_value = st.one_of(
    st.sampled_from(['"alice:alice-pw"', '"alice:wrong"', '"\\ud800:pw"', '"bob:bob-pw"']),
    json_text,
)
BAD_RIDS = ["C", "C12345678901", "c1", "C-1", "C1\\n", "C\\u0661", "X1", "S1", "C1.0"]
bad_rid = st.one_of(st.sampled_from(BAD_RIDS).map(lambda r: f'"{r}"'), json_text)


class ShortRepr:
    """Hypothesis prints examples with its own printer; this makes it use our short repr."""

    def _repr_pretty_(self, printer: Any, _cycle: bool) -> None:
        printer.text(repr(self))


@dataclass(repr=False)
class Message(ShortRepr):
    text: bytes
    rid: str | None  # the valid call id that must be answered, if any
    binary: bool
    cuts: list[int]  # where the message is split into continuation frames

    def __repr__(self) -> str:
        kind = "binary" if self.binary else "text"
        return f"Message({_short(self.text)}, rid={self.rid!r}, {kind}, cuts={self.cuts})"

    def frames(self) -> bytes:
        bounds = [0, *sorted(set(self.cuts)), len(self.text)]
        parts = [self.text[a:b] for a, b in itertools.pairwise(bounds)]
        first = Opcode.BINARY if self.binary else Opcode.TEXT
        out = b""
        for i, part in enumerate(parts):
            frame = Frame(first if i == 0 else Opcode.CONT, part, fin=i == len(parts) - 1)
            out += frame.serialize(mask=True)
        return out


@dataclass(repr=False)
class Raw(ShortRepr):
    data: bytes

    def __repr__(self) -> str:
        return f"Raw({_short(self.data)})"


@dataclass(repr=False)
class TruncatedThenEof(ShortRepr):
    data: bytes

    def __repr__(self) -> str:
        return f"TruncatedThenEof({_short(self.data)})"


Unit = Message | Raw | TruncatedThenEof


@st.composite
def messages(draw: st.DrawFn, number: int) -> Message:
    fields: dict[str, str] = {}
    for key, value in (("f", f_value), ("p", p_value), ("sec", sec_value)):
        if draw(st.booleans()):
            fields[key] = draw(value)
    for key in ("forcersp", "obf"):
        if draw(st.integers(0, 3)) == 0:
            fields[key] = draw(json_text)
    for key in draw(st.lists(st.text(max_size=6), max_size=2)):
        fields.setdefault(key, draw(json_text))
    rid: str | None = None
    rid_kind = draw(st.sampled_from(["valid", "valid", "valid", "bad", "none"]))
    if rid_kind == "valid":
        rid = f"C{number}"
        fields["rid"] = json.dumps(rid)
    elif rid_kind == "bad":
        fields["rid"] = draw(bad_rid)
    order = draw(st.permutations(list(fields)))
    text = ("{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in order) + "}").encode()
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=3))
    return Message(text, rid, draw(st.booleans()), cuts)


@st.composite
def conversations(draw: st.DrawFn) -> list[Unit]:
    units: list[Unit] = []
    for number in range(1, draw(st.integers(1, 6)) + 1):
        if draw(st.integers(0, 5)) == 0:
            units.append(Raw(draw(st.binary(min_size=1, max_size=64))))
        else:
            units.append(draw(messages(number)))
    if draw(st.integers(0, 3)) == 0:
        whole = draw(messages(0)).frames()
        units.append(TruncatedThenEof(whole[: draw(st.integers(0, len(whole) - 1))]))
    return units


# -- the property -------------------------------------------------------------------------------


def delivered_rids(units: list[Unit]) -> set[str]:
    """The valid call ids the server surely receives as messages: those before any garbage
    (which may begin a frame that swallows what follows)."""
    rids: set[str] = set()
    for unit in units:
        if not isinstance(unit, Message):
            break
        if unit.rid is not None:
            rids.add(unit.rid)
    return rids


async def converse(running: Running, units: list[Unit]) -> Wire:
    """One connection: handshake, the units, then a clean close unless the server closed."""
    transport = running.transport
    assert transport._server is not None
    protocol = transport._server._protocol_factory()  # type: ignore[attr-defined]
    assert isinstance(protocol, ServerIO)
    client = ClientProtocol(parse_uri("ws://127.0.0.1/"), max_size=None)
    wire = Wire(protocol, client, next(_ports))
    protocol.connection_made(wire)
    client.send_request(client.connect())
    wire.feed(b"".join(client.data_to_send()))
    waiting_for = "end of the opening handshake"
    try:
        async with asyncio.timeout(EXAMPLE_SECONDS):
            while client.state is State.CONNECTING:
                await wire.next_change()
            assert client.state is State.OPEN, "the handshake failed"

            for unit in units:
                if isinstance(unit, Message):
                    wire.feed(unit.frames())
                elif isinstance(unit, Raw):
                    wire.feed(unit.data)
                else:
                    wire.feed(unit.data)
                    wire.feed_eof()
            expected = delivered_rids(units)
            waiting_for = f"reply to each of {sorted(expected)} and no close"
            while not wire.server_closed and not expected <= set(wire.replies):
                await wire.next_change()
            if not wire.server_closed:
                assert client.state is State.OPEN, "the client could not read what it got"
                client.send_close(1000)
                wire.send_client_data()
            if any(isinstance(unit, Raw) for unit in units):
                # Its close may end up inside a frame that garbage began, so the peer ends the
                # stream instead of waiting for the server to (as a client does, up to a timeout).
                asyncio.get_running_loop().call_soon(wire.feed_eof)
            waiting_for = "end of the connection"
            while not wire.lost:
                await wire.next_change()
            waiting_for = "end of the connection's calls"
            await asyncio.gather(*transport._watchers)
    except TimeoutError:
        raise AssertionError(f"no {waiting_for} in {EXAMPLE_SECONDS} s: {wire.replies}") from None
    return wire


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(units=conversations())
def test_no_input_escapes_leaves_a_call_unanswered_or_leaks_a_connection(
    running: Running, units: list[Unit]
) -> None:
    errors = ErrorRecords()
    logging.getLogger().addHandler(errors)
    try:
        wire = running.loop.run_until_complete(converse(running, units))
    finally:
        logging.getLogger().removeHandler(errors)

    assert not errors.records, [r.getMessage() for r in errors.records]
    valid_rids = {u.rid for u in units if isinstance(u, Message) and u.rid is not None}
    assert set(wire.replies) <= valid_rids, wire.replies
    assert all(count == 1 for count in wire.replies.values()), wire.replies
    assert running.transport.open_sockets == 0  # each example's connection is the only one
    assert not running.transport._connections
    assert not running.transport._watchers
