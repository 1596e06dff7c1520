"""Hostile and broken AMQP peers, and a crash under load: nothing accepted is lost, and no
peer harms the server or another connection."""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import ConnectionException, Data, Delivery, Described, Message, symbol, uint, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig, AmqpLimits
from futoin_evt.amqp.sasl import AMQP_HEADER, SASL_HEADER, encode_sasl_frame
from futoin_evt.server.app import EventServer

from .support.servers import USERS, ServerProcess, add_user, free_port

pytestmark = pytest.mark.functional

PLAIN_ALICE = b"\0alice\0" + USERS["alice"].encode()


def amqp_frame(descriptor: int, fields: list[Any], payload: bytes = b"", channel: int = 0) -> bytes:
    body = Data()
    body.put_object(Described(ulong(descriptor), fields))
    encoded = bytes(body.encode()) + payload
    return struct.pack(">IBBH", 8 + len(encoded), 2, 0, channel) + encoded


OPEN = amqp_frame(0x10, ["fuzzer"])
BEGIN = amqp_frame(0x11, [None, uint(0), uint(100), uint(100)])
ATTACH_SENDER = amqp_frame(
    0x12, ["fuzz-in", uint(0), False, None, None, Described(ulong(0x28), []),
           Described(ulong(0x29), ["events"])],
)  # fmt: skip
ATTACH_RECEIVER = amqp_frame(
    0x12, ["fuzz-out", uint(1), True, None, None, Described(ulong(0x28), ["events"]),
           Described(ulong(0x29), [])],
)  # fmt: skip
CLOSE = amqp_frame(0x18, [])


def transfer(payload: bytes, delivery_id: int = 0) -> bytes:
    return amqp_frame(0x14, [uint(0), uint(delivery_id), b"t", uint(0), False, False], payload)


def login(response: bytes = PLAIN_ALICE) -> bytes:
    return SASL_HEADER + encode_sasl_frame(0x41, [symbol("PLAIN"), response]) + AMQP_HEADER


SYMBOL_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-:$", max_size=8)


def _value(depth: int) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.integers(min_value=0, max_value=2**32 - 1).map(uint),
        st.text(max_size=20),
        st.binary(max_size=20),
        st.sampled_from(["events", "events/$info", "$cbs", "nowhere"]).map(symbol),
    )
    if depth == 0:
        return scalars
    inner = _value(depth - 1)
    return st.one_of(
        scalars,
        st.lists(inner, max_size=6),
        st.dictionaries(SYMBOL_TEXT.map(symbol), inner, max_size=3),
        st.tuples(st.integers(0x00, 0x80), st.lists(inner, max_size=6)).map(
            lambda t: Described(ulong(t[0]), t[1])
        ),
    )


RANDOM_FRAMES = st.builds(
    amqp_frame,
    st.integers(0x10, 0x18),
    st.lists(_value(2), max_size=12),
    st.binary(max_size=64),
    st.integers(0, 2),
)
MESSAGES = st.builds(
    lambda subject, body: Message(subject=subject, body=body).encode(),
    st.sampled_from([None, "T", "lower", "X" * 40]),
    _value(2),
)
PIECES = st.one_of(
    st.sampled_from([OPEN, BEGIN, ATTACH_SENDER, ATTACH_RECEIVER]),
    RANDOM_FRAMES,
    MESSAGES.map(transfer),
    st.binary(min_size=1, max_size=64).map(transfer),
    st.binary(min_size=1, max_size=40),
)
OPENINGS = st.one_of(
    st.just(login()),
    st.binary(max_size=40),
    st.binary(max_size=40).map(login),
    st.just(SASL_HEADER + encode_sasl_frame(0x41, [symbol("ANONYMOUS"), None]) + AMQP_HEADER),
)


async def handshake_works(port: int) -> bool:
    """A well-behaved peer logs in, opens and gets an event accepted."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(login() + OPEN + BEGIN + ATTACH_SENDER)
        received = b""
        async with asyncio.timeout(30):
            while b"\x00\x53\x13" not in received:  # a flow frame: the server gave credit
                chunk = await reader.read(65536)
                if not chunk:
                    return False
                received += chunk
            writer.write(transfer(Message(subject="OK", body=1).encode()))
            while b"\x00\x53\x24" not in received:  # "accepted" in a disposition
                chunk = await reader.read(65536)
                if not chunk:
                    return False
                received += chunk
        return True
    finally:
        writer.close()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(opening=OPENINGS, pieces=st.lists(PIECES, max_size=8))
def test_fuzzed_peers_never_hurt_the_server(
    fuzz_amqp: tuple[asyncio.AbstractEventLoop, EventServer, ErrorLog],
    opening: bytes,
    pieces: list[bytes],
) -> None:
    loop, server, errors = fuzz_amqp
    assert server.amqp is not None
    port = server.amqp.port

    async def attack() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(opening + b"".join(pieces) + CLOSE)
        # The server answers the close, or ends the connection over an error or when the
        # peer falls silent mid-frame (its idle time-out).
        async with asyncio.timeout(30):
            while await reader.read(65536):
                pass
        writer.close()
        assert await handshake_works(port)

    loop.run_until_complete(attack())
    assert errors.records == []  # nothing failed inside the server (logged as an error)


SESSION = (
    login()
    + OPEN
    + BEGIN
    + ATTACH_SENDER
    + transfer(Message(subject="CUT", body={"a": [1, "x"]}).encode())
    + transfer(Message(subject="CUT", body=2).encode(), delivery_id=1)
    + ATTACH_RECEIVER
    + amqp_frame(0x13, [uint(0), uint(100), uint(0), uint(100), uint(1), uint(0), uint(10)])
    + amqp_frame(0x16, [uint(0), True])
    + CLOSE
)
#: A change to a well-formed session: bytes overwritten, cut out, repeated, or the end cut off.
MUTATIONS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, len(SESSION) - 1), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("cut"), st.integers(0, len(SESSION) - 1), st.integers(1, 64)),
    st.tuples(st.just("repeat"), st.integers(0, len(SESSION) - 1), st.integers(1, 64)),
    st.tuples(st.just("end"), st.integers(0, len(SESSION) - 1), st.just(0)),
)


def mutate(data: bytes, mutations: list[tuple[str, int, Any]]) -> bytes:
    out = bytearray(data)
    for kind, at, arg in mutations:
        at = min(at, len(out))
        if kind == "set":
            out[at : at + len(arg)] = arg
        elif kind == "cut":
            del out[at : at + arg]
        elif kind == "repeat":
            out[at:at] = out[at : at + arg]
        else:
            del out[at:]
    return bytes(out)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations=st.lists(MUTATIONS, min_size=1, max_size=4))
def test_sessions_cut_and_corrupted_at_random_never_hurt_the_server(
    fuzz_amqp: tuple[asyncio.AbstractEventLoop, EventServer, ErrorLog],
    mutations: list[tuple[str, int, Any]],
) -> None:
    loop, server, errors = fuzz_amqp
    assert server.amqp is not None
    port = server.amqp.port

    async def attack() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(mutate(SESSION, mutations))
        writer.write_eof()  # so that a frame cut short is not waited for until the time-out
        async with asyncio.timeout(30):
            while await reader.read(65536):
                pass
        writer.close()
        assert await handshake_works(port)

    loop.run_until_complete(attack())
    assert errors.records == []  # nothing failed inside the server (logged as an error)


@pytest.fixture(scope="module")
def fuzz_amqp(tmp_path_factory: pytest.TempPathFactory, password_hashes: dict[str, str]) -> Any:
    """One server for all fuzzed examples (hypothesis runs the test many times)."""
    from futoin_evt.log.retention import RetentionConfig
    from futoin_evt.server.app import ServerConfig
    from futoin_evt.server.websocket import TransportConfig

    loop = asyncio.new_event_loop()

    async def start() -> EventServer:
        config = ServerConfig(
            db=tmp_path_factory.mktemp("fuzz") / "fuzz.sqlite",
            transport=TransportConfig(port=0),
            retention=RetentionConfig(interval=3600),
            amqp=AmqpConfig(port=0, limits=AmqpLimits(idle_timeout=1.0)),
        )
        server = await EventServer.start(config)
        await add_user(server.store, "alice", password_hashes["alice"])
        await server.access.changed_here()
        return server

    server = loop.run_until_complete(start())
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    yield loop, server, errors
    logging.getLogger().removeHandler(errors)
    loop.run_until_complete(server.close())
    loop.close()


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


# -- a crash under load ----------------------------------------------------------------------


def produce_until_killed(url: str, accepted: list[int], progress: threading.Semaphore) -> None:
    """Keep 1000 messages unsettled at all times; note every one the server accepts."""
    outstanding: dict[Any, int] = {}
    try:
        conn = BlockingConnection(
            url, user="alice", password=USERS["alice"], allowed_mechs="PLAIN", timeout=30
        )
        link: Any = conn.create_sender("events").link
        number = 0
        while True:
            while link.credit > 0 and len(outstanding) < 1000:
                number += 1
                outstanding[link.send(Message(subject="K", body=number))] = number
            conn.wait(lambda: any(d.remote_state for d in outstanding))
            for delivery in [d for d in outstanding if d.remote_state]:
                if delivery.remote_state == Delivery.ACCEPTED:
                    accepted.append(outstanding[delivery])
                    progress.release()
                del outstanding[delivery]
    except ConnectionException:
        return  # the server died


async def test_sigkill_loses_no_accepted_message(
    tmp_path: Path, password_hashes: dict[str, str], serve_workers: int
) -> None:
    from futoin_evt.storage.sqlite import SqliteStore

    db = tmp_path / "crash.sqlite"
    async with await SqliteStore.open(db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    amqp_port = free_port()
    server = ServerProcess(db, 0, "--amqp", f"127.0.0.1:{amqp_port}", workers=serve_workers)
    assert server.amqp_url is not None
    accepted: list[int] = []
    progress = threading.Semaphore(0)
    producer = asyncio.ensure_future(
        asyncio.to_thread(produce_until_killed, server.amqp_url, accepted, progress)
    )
    for _ in range(3000):  # wait for 3000 acceptances, with the window still full
        assert await asyncio.to_thread(progress.acquire, True, 60)
    server.kill()
    await producer
    server = ServerProcess(db, 0, "--amqp", f"127.0.0.1:{amqp_port}", workers=serve_workers)
    try:
        stored = await asyncio.to_thread(read_all, server.amqp_url or "")
    finally:
        server.stop()
    assert len(accepted) >= 3000
    assert set(accepted) <= set(stored), "a message the server accepted was lost"
    assert stored == sorted(stored)  # in the order they were sent, each once


def read_all(url: str) -> list[int]:
    """Every event in the log, read over AMQP from the earliest."""
    conn = BlockingConnection(
        url, user="alice", password=USERS["alice"], allowed_mechs="PLAIN", timeout=30
    )
    try:
        info: Any = conn.create_receiver("events/$info", credit=1).receive().body
        latest = int(info[symbol("partitions")][0][symbol("latest-offset")])
        earliest: Any = {symbol("event-streams-offset"): symbol("@earliest")}
        options = Filter({symbol("f"): Described(ulong(0x200), earliest)})
        receiver = conn.create_receiver("events", credit=1000, options=options)
        bodies: list[int] = []
        for _ in range(latest):
            body = receiver.receive().body
            assert isinstance(body, int)
            bodies.append(body)
            receiver.accept()
        return bodies
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("frame", "condition"),
    [
        (struct.pack(">IBBH", 10, 2, 0, 0) + b"\xff\xff", b"amqp:decode-error"),
        (struct.pack(">IBBH", 200_000, 2, 0, 0), b"amqp:connection:framing-error"),
        (amqp_frame(0x99, []), b"amqp:"),
    ],
)
async def test_malformed_frames_close_the_connection_with_a_condition(
    start_server: Any, frame: bytes, condition: bytes
) -> None:
    server = await start_server(amqp=AmqpConfig(port=0))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.amqp.port)
    writer.write(login() + OPEN + frame)
    received = b""
    async with asyncio.timeout(30):
        while chunk := await reader.read(65536):
            received += chunk
    writer.close()
    close = received.rfind(b"\x00\x53\x18")  # the close performative
    assert close > 0
    assert condition in received[close:]
    assert await handshake_works(server.amqp.port)  # the server goes on


async def test_a_peer_silent_after_open_is_closed_for_idleness(start_server: Any) -> None:
    server = await start_server(amqp=AmqpConfig(port=0, limits=AmqpLimits(idle_timeout=0.3)))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.amqp.port)
    writer.write(login() + OPEN)  # and then silence
    received = b""
    async with asyncio.timeout(30):
        while chunk := await reader.read(65536):
            received += chunk
    writer.close()
    assert b"amqp:resource-limit-exceeded" in received
