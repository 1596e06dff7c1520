"""Hostile input on real sockets: each case gets a reply, a 400 or a clean close, and after it
another client is served, every slot is free, nothing acknowledged is lost and SIGTERM stops
the server."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proton import symbol
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from futoin_evt.amqp import AmqpConfig, AmqpLimits
from futoin_evt.amqp.sasl import AMQP_HEADER, SASL_HEADER, encode_sasl_frame
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.ftn3.messages import MAX_INT_DIGITS
from futoin_evt.server.app import EventServer
from futoin_evt.server.websocket import Limits
from futoin_evt.slots import Slots
from futoin_evt.storage.sqlite import SqliteStore

from .support.amqp import in_thread, produce
from .support.servers import USERS, ServerFactory, ServerProcess

pytestmark = pytest.mark.functional

SEC = "alice:alice-pw"
GEN = "futoin.evt.gen:1.1"
MAX_CONNECTIONS = 3
#: A second loopback address: password checks are limited per peer address.
OTHER_LOOPBACK = "127.0.0.2"


def call_frame(rid: int, f: str, params: dict[str, Any] | str, sec: str = SEC) -> str:
    """A request as text; ``params`` given as text is spliced in as it is."""
    p = params if isinstance(params, str) else json.dumps(params)
    return f'{{"rid":"C{rid}","f":"{f}","p":{p},"sec":{json.dumps(sec)}}}'


async def exchange(ws: ClientConnection, frame: str | bytes) -> dict[str, Any]:
    await ws.send(frame)
    async with asyncio.timeout(30):
        reply: dict[str, Any] = json.loads(await ws.recv())
    return reply


async def still_served(ws: ClientConnection, rid: int = 99) -> None:
    """The same connection answers a good call afterwards."""
    reply = await exchange(ws, call_frame(rid, f"{GEN}:ping", {"echo": rid}))
    assert reply == {"r": {"echo": rid}, "rid": f"C{rid}"}


# -- in one process: replies, slots, log lines -------------------------------------------------


@pytest.fixture
async def small_server(start_server: ServerFactory) -> EventServer:
    return await start_server(limits=Limits(max_connections=MAX_CONNECTIONS))


async def assert_slots_free(server: EventServer) -> None:
    """Every slot can be taken again, and the one after them is refused."""
    clients = [
        await EventStreamClient.connect(server.url, credentials=SEC) for _ in range(MAX_CONNECTIONS)
    ]
    try:
        assert [await c.ping(i) for i, c in enumerate(clients)] == list(range(MAX_CONNECTIONS))
        await assert_login_refused(server)
    finally:
        for client in clients:
            await client.close()


async def read_until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    """The messages a connection gets until it is closed, and the close code it got."""
    replies: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(30):
            while True:
                replies.append(json.loads(await ws.recv()))
    except ConnectionClosed as closed:
        return replies, closed.rcvd.code if closed.rcvd else None


async def assert_login_refused(server: EventServer) -> None:
    """With every established slot taken, a new WebSocket is accepted (it might be a client
    that is about to log in), but its first call is refused and the connection closed with
    1013 (try again later); a feed request gets 503."""
    async with connect(server.url) as ws:
        await ws.send(call_frame(1, f"{GEN}:ping", {"echo": 1}))
        replies, code = await read_until_closed(ws)
    assert [reply.get("e") for reply in replies] in ([], ["DefenseRejected"])
    assert code == 1013
    base = server.url.replace("ws", "http", 1)
    async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
        refused = await http.get(base + "feed")
    assert refused.status_code == 503, refused.text


HOSTILE_FRAMES = {
    "version of 5000 digits": (
        f'{{"rid":"C1","f":"futoin.ping:1{"0" * 5000}:ping","p":{{"echo":1}},"sec":"{SEC}"}}',
        "Invalid req.f",
    ),
    "lone surrogate in sec": (call_frame(1, f"{GEN}:ping", {"echo": 1}, "\ud800:pw"), "surrogate"),
    "lone surrogate in params": (
        call_frame(1, f"{GEN}:addEvent", '{"type":"A","data":"\\udc00"}'),
        "surrogate",
    ),
    "event data with a 5000-digit integer": (
        call_frame(1, f"{GEN}:addEvent", '{"type":"A","data":' + "7" * 5000 + "}"),
        f"more than {MAX_INT_DIGITS} digits",
    ),
    "event data out of float range": (
        call_frame(1, f"{GEN}:addEvent", '{"type":"A","data":[1e999]}'),
        "out of range",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_FRAMES))
async def test_hostile_values_get_invalid_request_and_the_connection_stays(
    small_server: EventServer, case: str
) -> None:
    frame, reason = HOSTILE_FRAMES[case]
    for _ in range(MAX_CONNECTIONS):  # more times than there are slots
        async with connect(small_server.url) as ws:
            reply = await exchange(ws, frame)
            assert (reply["rid"], reply["e"]) == ("C1", "InvalidRequest")
            assert reason in reply["edesc"]
            await still_served(ws)
    await assert_slots_free(small_server)
    bounds = await small_server.store.stream_bounds()
    assert bounds.events == 0  # nothing of the refused events was stored


async def test_a_lone_surrogate_in_a_frame_without_rid_closes_with_1008(
    small_server: EventServer,
) -> None:
    async with connect(small_server.url) as ws:
        await ws.send('{"f":"\\ud800","rid":"nope"}')
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(30):
                await ws.recv()
        assert ws.close_code == 1008
    await assert_slots_free(small_server)


async def test_connections_ended_in_every_way_free_their_slots(
    small_server: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = small_server.port
    raw_requests = [
        b"GARBAGE\r\n\r\n",  # not HTTP
        b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n",  # 431
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",  # line too long
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # no upgrade: 426
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",  # not a GET: 405
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgr",  # cut off mid-header
    ]
    with caplog.at_level(logging.DEBUG):
        for raw in raw_requests * 2:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            writer.write_eof()
            async with asyncio.timeout(30):
                answer = await reader.read()
            writer.close()
            await writer.wait_closed()
            if raw.startswith(b"POST"):
                assert answer.startswith(b"HTTP/1.1 405 ")
                assert b"\r\nAllow: GET\r\n" in answer
        # a peer reset in the middle of a WebSocket connection
        async with connect(small_server.url) as ws:
            await still_served(ws)
            transport = ws.transport
            transport.abort()
        await assert_slots_free(small_server)
        gc.collect()  # a future nobody retrieved would be reported now
    problems = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert problems == []
    assert "never retrieved" not in caplog.text


async def test_unknown_methods_get_405_on_every_path(small_server: EventServer) -> None:
    base = small_server.url.replace("ws", "http", 1)
    async with httpx.AsyncClient() as http:
        for path in ("", "feed", "anything"):
            response = await http.post(base + path, content=b'{"x": 1}')
            assert (response.status_code, response.headers["allow"]) == (405, "GET")
    await assert_slots_free(small_server)


@pytest.mark.parametrize(
    "query",
    [
        "pagesizehint=%C2%B2",  # superscript two: isdigit() says yes, int() says no
        "pagesizehint=%D9%A3",  # Arabic-Indic three
        "pagesizehint=0",
        "wait=%D9%A3",
        "wait=nan",
        "wait=1e1",
        "wait=-1",
        "cursor=%D9%A3",
        "cursor=" + "1" * 5000,
    ],
)
async def test_feed_parameters_are_parsed_strictly(small_server: EventServer, query: str) -> None:
    base = small_server.url.replace("ws", "http", 1) + "feed"
    async with httpx.AsyncClient(auth=("alice", USERS["alice"])) as http:
        token = (await http.get(base)).json()["token"]
        params = f"token={token}&partition=0&cursor=_first"
        response = await http.get(f"{base}/events?{params}&{query}")
        assert response.status_code == 400
        assert len(response.text.strip().splitlines()) == 1
        zeh = await http.get(f"{base}?n=1&cursor0=_first&{query.replace('cursor=', 'cursor0=')}")
        assert zeh.status_code == 400
    await assert_slots_free(small_server)


async def test_a_wrong_password_flood_slows_only_its_sender(small_server: EventServer) -> None:
    """200 different wrong passwords pipelined on one connection: a few are checked one at a
    time, the rest refused at once; a user on another address logs in meanwhile."""
    flood = 200
    async with connect(small_server.url, local_addr=(OTHER_LOOPBACK, 0)) as attacker:
        for i in range(flood):
            await attacker.send(call_frame(i, f"{GEN}:ping", {"echo": i}, f"alice:wrong-{i}"))
        # the flood is queued: a first answer is in
        async with asyncio.timeout(30):
            replies = [json.loads(await attacker.recv())]
        bob = await EventStreamClient.connect(small_server.url, credentials="bob:bob-pw")
        try:
            assert await bob.ping(7) == 7
        finally:
            await bob.close()
        async with asyncio.timeout(60):
            while len(replies) < flood:
                replies.append(json.loads(await attacker.recv()))
        assert {r["e"] for r in replies} == {"SecurityError"}
        refused = [r for r in replies if "Too many" in r["edesc"]]
        assert len(refused) >= flood - 20
        await still_served(attacker)  # right credentials on the same connection still work


async def test_recent_ring_is_bounded_in_bytes(small_server: EventServer) -> None:
    async with await EventStreamClient.connect(small_server.url, credentials=SEC) as alice:
        big = "x" * 60_000
        await asyncio.gather(*(alice.add_event("BIG", big) for _ in range(1000)))
        assert isinstance(small_server.store, SqliteStore)
        ring = small_server.store.recent
        assert ring.size_bytes <= 32 * 1024 * 1024
        assert ring.last_id == 1000
        events = await alice.poll_events("LIVE", 990)
        assert [e.id for e in events] == list(range(991, 1001))


# -- as its own process: SIGTERM, stalled readers, nothing lost -----------------------------------


@pytest.fixture
def db_with_users(tmp_path: Path) -> Path:
    db = tmp_path / "hostile.sqlite"
    for name, password in USERS.items():
        subprocess.run(
            [sys.executable, "-m", "futoin_evt", "user", "add", name, "--password-stdin",
             "--db", str(db)],
            input=password + "\n", text=True, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "futoin_evt", "grant", name, "read,write", "*", "--db", str(db)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    return db


@pytest.fixture
def process(db_with_users: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        db_with_users, 0, "--max-connections", str(MAX_CONNECTIONS), "--max-frame-bytes", "8388608"
    )
    yield server
    if server.proc.poll() is None:
        server.kill()


def stored_ids(db: str | Path) -> set[int]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM events")}


def stop_cleanly(server: ServerProcess) -> str:
    """SIGTERM: the process ends by itself with status 0; returns what it logged."""
    code, logged = server.stop_and_read_log(timeout=60)
    assert code == 0, logged
    return logged


async def test_after_every_hostile_frame_sigterm_stops_and_nothing_is_lost(
    process: ServerProcess,
) -> None:
    async with await EventStreamClient.connect(process.url, credentials=SEC) as alice:
        acknowledged = {await alice.add_event("BEFORE", i) for i in range(5)}
        for frame, _reason in HOSTILE_FRAMES.values():
            async with connect(process.url) as ws:
                assert (await exchange(ws, frame))["e"] == "InvalidRequest"
        acknowledged.add(await alice.add_event("AFTER", None))
    stop_cleanly(process)
    assert acknowledged <= stored_ids(process.db)


async def _stalled_feed_reader(url: str) -> asyncio.StreamWriter:
    """A feed client that asks for a response far larger than socket buffers and reads none."""
    host, port = url.removeprefix("ws://").rstrip("/").rsplit(":", 1)
    credentials = base64.b64encode(f"alice:{USERS['alice']}".encode()).decode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /feed?n=1&cursor0=_first HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Basic {credentials}\r\n\r\n".encode()
    )
    await writer.drain()
    async with asyncio.timeout(30):
        await reader.readuntil(b"\r\n\r\n")  # the response has started; nothing more is read
    return writer


@pytest.fixture
async def stalled_push(process: ServerProcess) -> AsyncIterator[ClientConnection]:
    async with connect(process.url, max_size=None) as ws:
        push = "futoin.evt.push:1.1"
        assert (await exchange(ws, call_frame(1, f"{push}:registerConsumer", {"component": "S"})))[
            "r"
        ] is True
        reply = await exchange(ws, call_frame(2, f"{push}:readyToReceive", {"component": "S"}))
        assert reply["r"] is True
        # from here on, the pushes that follow are not read
        yield ws


async def test_sigterm_with_stalled_readers_stops_the_server(
    process: ServerProcess, stalled_push: ClientConnection
) -> None:
    async with await EventStreamClient.connect(process.url, credentials=SEC) as alice:
        big = "y" * 60_000
        ids = await asyncio.gather(*(alice.add_event("BIG", big) for _ in range(600)))
    feed = await _stalled_feed_reader(process.url)
    try:
        logged = stop_cleanly(process)
    finally:
        feed.close()
    assert "Traceback" not in logged
    assert set(ids) <= stored_ids(process.db)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 411),
        (b"POST /x HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"POST /x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST /x HTTP/1.1\r\nBad Header Line\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"POST /x SMTP/1.0\r\n\r\n", 400),
        (b"PUT /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nab", 405),
    ],
)
async def test_requests_with_bodies_are_read_strictly(
    small_server: EventServer, raw: bytes, status: int
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", small_server.port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(30):
        answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    assert answer.count(b"\r\n\r\n") == 1  # one response, then the connection closed
    await assert_slots_free(small_server)


# -- sockets that never finish their handshake ---------------------------------------------------

#: Never finished: a request line or headers cut short, a body short of its Content-Length.
HALF_HTTP = [
    b"GE",
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgr",
    b"GET /feed HTTP/1.1\r\nHost: x\r\n",
    b"POST /dcb/v1/read HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",
]
#: Never finished: a protocol header cut short, SASL without an init, ANONYMOUS with no token.
HALF_AMQP = [
    b"AMQP\x03",
    SASL_HEADER,
    SASL_HEADER + encode_sasl_frame(0x41, [symbol("ANONYMOUS"), None]) + AMQP_HEADER,
]
#: The sources of the hostile sockets (all of them loopback on Linux).
HOSTILE_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 8)]


class Changes:
    """Wakes a waiter whenever the server's slots change or a hostile socket is cut."""

    def __init__(self, *slots: Slots[Any]) -> None:
        self.event = asyncio.Event()
        self._stops = [s.watch(self.event.set) for s in slots]

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait (at most 30 s) until ``condition`` holds."""
        try:
            async with asyncio.timeout(30):
                while not condition():
                    await self.event.wait()
                    self.event.clear()
        except TimeoutError:
            raise AssertionError(f"still not {what}") from None

    def close(self) -> None:
        for stop in self._stops:
            stop()


class HalfOpen:
    """Sockets that start a handshake and never finish it; ``gone`` lists (in the order they
    were opened) those the server closed."""

    def __init__(self, changes: Changes) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._changes = changes
        self.gone: list[int] = []

    @property
    def cut(self) -> int:
        return len(self.gone)

    async def open(self, port: int, starts: list[bytes], count: int, sources: list[str]) -> None:
        for i in range(count):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(sources[i % len(sources)], 0)
            )
            writer.write(starts[i % len(starts)])
            self._watchers.append(asyncio.create_task(self._watch(len(self.writers), reader)))
            self.writers.append(writer)

    async def _watch(self, index: int, reader: asyncio.StreamReader) -> None:
        try:
            while await reader.read(4096):
                pass  # what the server answers to a header, if anything
        except ConnectionError:
            pass
        self.gone.append(index)
        self._changes.event.set()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*self._watchers)


@pytest.fixture
async def small_servers(start_server: ServerFactory) -> EventServer:
    return await start_server(
        limits=Limits(max_connections=MAX_CONNECTIONS),
        amqp=AmqpConfig(port=0, limits=AmqpLimits(max_connections=MAX_CONNECTIONS)),
    )


async def test_unfinished_handshakes_cannot_lock_out_clients(small_servers: EventServer) -> None:
    """Far more never-finishing sockets than slots, on both ports, from several addresses:
    a WebSocket login and call, a feed GET, a DCB read and an AMQP login still succeed, and
    every slot is free once they all close."""
    server = small_servers
    assert server.amqp is not None
    ws_slots, amqp_slots = server.transport.slots, server.amqp.slots
    ws_count = 3 * (ws_slots.max_handshakes + MAX_CONNECTIONS)
    amqp_count = 3 * (amqp_slots.max_handshakes + MAX_CONNECTIONS)
    changes = Changes(ws_slots, amqp_slots)
    hostile = HalfOpen(changes)
    await hostile.open(server.port, HALF_HTTP, ws_count, HOSTILE_ADDRESSES)
    await hostile.open(server.amqp.port, HALF_AMQP, amqp_count, HOSTILE_ADDRESSES)
    # every socket was accepted, and is either in a handshake slot or was cut (and knows it)
    await changes.until(
        lambda: hostile.cut + len(ws_slots) + len(amqp_slots) == ws_count + amqp_count,
        "every hostile socket settled",
    )
    assert ws_slots.handshakes == ws_slots.max_handshakes
    assert amqp_slots.handshakes == amqp_slots.max_handshakes

    base = server.url.replace("ws", "http", 1)
    async with await EventStreamClient.connect(server.url, credentials=SEC) as alice:
        assert await alice.ping(1) == 1
        event_id = await alice.add_event("UNDER_SIEGE", 1)
        async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
            feed = await http.get(base + "feed")
            assert feed.status_code == 200
            assert "token" in feed.json()
        async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
            read = await http.post(base + "dcb/v1/read", json={})
            assert read.status_code == 200, read.text
        await in_thread(produce, server.amqp_url or "", ["through"])
        assert await alice.ping(2) == 2
        assert (await server.store.stream_bounds()).events == event_id + 1
    await hostile.close()
    await changes.until(lambda: not len(ws_slots) and not len(amqp_slots), "every slot free")
    changes.close()
    await assert_slots_free(server)


async def test_connections_that_never_log_in_cannot_lock_out_clients(
    small_servers: EventServer,
) -> None:
    """Finished WebSocket handshakes that never call, and feed requests without credentials
    on kept-alive connections, from several addresses and far more than there are slots:
    they stay in the handshake budget, so a user who logs in still gets through."""
    server = small_servers
    slots = server.transport.slots
    changes = Changes(slots)
    count = 3 * (slots.max_handshakes + MAX_CONNECTIONS)
    idle: list[ClientConnection] = []
    for i in range(count // 2):
        address = HOSTILE_ADDRESSES[i % len(HOSTILE_ADDRESSES)]
        idle.append(await connect(server.url, local_addr=(address, 0)))
    hostile = HalfOpen(changes)
    no_credentials = b"GET /feed HTTP/1.1\r\nHost: x\r\n\r\n"  # 401, kept alive
    await hostile.open(server.port, [no_credentials], count - count // 2, HOSTILE_ADDRESSES)
    await changes.until(
        lambda: hostile.cut + sum(ws.state.name == "CLOSED" for ws in idle) + len(slots) == count,
        "every hostile socket settled",
    )
    assert slots.established == 0
    async with await EventStreamClient.connect(server.url, credentials=SEC) as alice:
        assert await alice.ping(1) == 1
        assert slots.established == 1
        base = server.url.replace("ws", "http", 1)
        async with httpx.AsyncClient(auth=("alice", USERS["alice"]), timeout=30) as http:
            assert (await http.get(base + "feed")).status_code == 200
        assert await alice.ping(2) == 2
    for ws in idle:
        await ws.close()
    await hostile.close()
    await changes.until(lambda: not len(slots), "every slot free")
    changes.close()
    await assert_slots_free(server)


async def test_one_address_cuts_only_its_own_handshakes(small_servers: EventServer) -> None:
    """A client that is slow to finish its handshake keeps its slot while one address opens
    many times the budget of never-finishing sockets."""
    server = small_servers
    slots = server.transport.slots
    changes = Changes(slots)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /feed HTTP/1.1\r\nHost: x\r\n")  # ... the rest of it comes later
    await changes.until(lambda: slots.handshakes == 1, "the slow client accepted")
    hostile = HalfOpen(changes)
    count = 3 * slots.max_handshakes
    await hostile.open(server.port, HALF_HTTP, count, [OTHER_LOOPBACK])
    await changes.until(lambda: hostile.cut + len(slots) == count + 1, "every socket settled")
    assert hostile.cut == count - slots.per_address
    credentials = base64.b64encode(f"alice:{USERS['alice']}".encode())
    writer.write(b"Authorization: Basic " + credentials + b"\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(30):
        answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 200 ")
    writer.close()
    await hostile.close()
    await changes.until(lambda: not len(slots), "every slot free")
    changes.close()


async def test_evictions_and_refusals_are_logged_rarely_and_never_as_errors(
    small_servers: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = small_servers
    slots = server.transport.slots
    changes = Changes(slots)
    hostile = HalfOpen(changes)
    count = 4 * slots.max_handshakes
    with caplog.at_level(logging.DEBUG):
        await hostile.open(server.port, HALF_HTTP, count, HOSTILE_ADDRESSES)
        await changes.until(lambda: hostile.cut + len(slots) == count, "every socket settled")
        await assert_slots_free(server)
        await hostile.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sum("unfinished handshake" in w for w in warnings) <= 1
    assert sum("refused" in w for w in warnings) <= 1


async def cut_by_three(port: int, starts: list[bytes]) -> list[int]:
    """Which of three never-finishing sockets the server closes (once it closed one)."""
    changes = Changes()
    hostile = HalfOpen(changes)
    await hostile.open(port, starts, 3, HOSTILE_ADDRESSES)
    await changes.until(lambda: hostile.cut > 0, "a handshake cut")
    gone = list(hostile.gone)
    await hostile.close()
    return gone


async def test_max_handshakes_on_the_command_line_applies_to_both_ports(
    db_with_users: Path,
) -> None:
    # one worker: with two, each holds one of the two handshake slots, and which socket is cut
    # depends on where the kernel puts each (tests/test_workers.py checks the group)
    limits = ("--max-connections", "1", "--max-handshakes", "2")
    server = ServerProcess(db_with_users, 0, *limits, "--amqp", "127.0.0.1:0", workers=1)
    try:
        assert server.amqp_url is not None
        amqp_port = int(server.amqp_url.rsplit(":", 1)[1])
        for port, starts in ((server.port, HALF_HTTP), (amqp_port, HALF_AMQP)):
            assert await cut_by_three(port, starts) == [0]  # the oldest made room for the third
        async with await EventStreamClient.connect(server.url, credentials=SEC) as alice:
            assert await alice.ping(1) == 1
    finally:
        stop_cleanly(server)
