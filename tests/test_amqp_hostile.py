"""Hostile peers at the AMQP listener, as bytes on a socket against a server process: each gets the
protocol's error or close, an honest connection open meanwhile keeps working, the server logs
no ERROR, every connection slot comes back and its memory stays within a stated bound."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from proton import Message, symbol, uint
from proton.utils import BlockingConnection

from futoin_evt.auth.users import hash_password
from futoin_evt.storage.sqlite import SqliteStore

from .support.amqp_wire import (
    AMQP_HEADER,
    ATTACH,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_HEADER,
    SASL_OUTCOME,
    TRANSFER,
    Peer,
    ServerProcess,
    attach,
    begin,
    detach,
    flow,
    frame,
    frame_header,
    logged_in,
    login,
    message,
    open_frame,
    sasl_init,
    transfer,
)
from .support.servers import USERS, add_user

pytestmark = pytest.mark.functional

MAX_CONNECTIONS = 6
MIB = 1024 * 1024
SECRET = "a test secret of more than thirty-two characters"


@pytest.fixture(scope="module")
def amqp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server process for the module."""
    server = start_process(tmp_path_factory)
    yield server
    assert server.stop() == 0
    assert server.errors() == []


def start_process(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """A server process (alice exists) with few connection slots."""
    folder = tmp_path_factory.mktemp("amqp-hostile")
    db = folder / "events.sqlite"

    async def add_alice() -> None:
        async with await SqliteStore.open(db) as store:
            await add_user(store, "alice", hash_password(USERS["alice"]))

    asyncio.run(add_alice())
    (folder / "sas-secret").write_text(SECRET)
    return ServerProcess(
        db, "--max-connections", str(MAX_CONNECTIONS), "--sas-secret", str(folder / "sas-secret")
    )


class Honest:
    """A proton client with a sending link, open across an attack."""

    def __init__(self, port: int) -> None:
        self.conn = BlockingConnection(
            f"amqp://127.0.0.1:{port}",
            user="alice",
            password=USERS["alice"],
            allowed_mechs="PLAIN",
            timeout=30,
        )
        self.sender = self.conn.create_sender("events")
        self.sent = 0

    def send(self) -> None:
        """One event, accepted (BlockingSender.send raises unless it is)."""
        self.sent += 1
        self.sender.send(Message(subject="HONEST", body=self.sent))


@pytest.fixture
async def honest(amqp_server: ServerProcess) -> AsyncIterator[Honest]:
    """An honest connection open before the attack; it still works after, and the server logged
    no error meanwhile and has every slot free again."""
    mark = len(amqp_server.log())
    client = await asyncio.to_thread(Honest, amqp_server.amqp_port)
    await asyncio.to_thread(client.send)
    yield client
    await Peer.close_all()
    await asyncio.to_thread(client.send)
    await asyncio.to_thread(client.conn.close)
    await assert_slots_free(amqp_server.amqp_port)
    new_lines = amqp_server.log()[mark:]
    assert " ERROR " not in new_lines, new_lines
    assert "Traceback" not in new_lines, new_lines


async def assert_slots_free(port: int) -> None:
    """Every connection slot can be taken again (the connections of an attack are gone), and
    the one beyond them is refused with sys-temp."""
    peers: list[Peer] = []
    try:
        async with asyncio.timeout(30):
            while True:  # a closed socket's slot comes back once the server has seen the close
                for peer in peers:
                    await peer.close()
                peers = []
                for _ in range(MAX_CONNECTIONS):
                    peer = await Peer.connect(port)
                    peers.append(peer)
                    await peer.send(SASL_HEADER + sasl_init("PLAIN", b"\0alice\0alice-pw"))
                    outcome = await peer.until(SASL_OUTCOME)
                    if outcome.fields[0] != 0:
                        break
                else:
                    break
                await asyncio.sleep(0.05)  # a poll of the server's state, with a bound above
        one_more = await Peer.connect(port)
        peers.append(one_more)
        await one_more.send(SASL_HEADER + sasl_init("PLAIN", b"\0alice\0alice-pw"))
        assert (await one_more.until(SASL_OUTCOME)).fields[0] == 4  # sys-temp
    finally:
        for peer in peers:
            await peer.close()


def conditions(frames: list[Any]) -> list[str | None]:
    return [f.condition() for f in frames if f.descriptor in (CLOSE, DETACH, SASL_OUTCOME)]


# -- before and during the login ------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        AMQP_HEADER,  # AMQP without SASL
        b"AMQP\x02\x01\x00\x00",  # TLS
        b"AMQP\x03\x01\x00\x01",  # a SASL version we do not speak
        b"AMQQ\x03\x01\x00\x00",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00" * 8,
    ],
)
async def test_a_wrong_protocol_header_gets_ours_and_a_close(
    amqp_server: ServerProcess, honest: Honest, header: bytes
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    await peer.send(header)
    frames = await peer.until_closed()
    assert peer.headers == [SASL_HEADER]  # the header we speak, as the spec asks, then EOF
    assert frames == []


async def test_a_wrong_amqp_header_after_sasl_closes(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    await peer.send(SASL_HEADER + sasl_init("PLAIN", b"\0alice\0alice-pw") + SASL_HEADER)
    frames = await peer.until_closed()
    assert conditions(frames) == ["sasl-code 0"]  # the login was right; what follows is not
    assert not any(f.descriptor == OPEN for f in frames)


@pytest.mark.parametrize(
    ("response", "outcome"),
    [
        (b"\0alice\0" + b"p" * 4000, ["sasl-code 1"]),  # long, but within a SASL frame
        (b"\0alice\0" + "\ud800".encode("utf-8", "surrogatepass"), ["sasl-code 1"]),
        (b"\0\xed\xb0\x80\0alice-pw", ["sasl-code 1"]),  # a lone low surrogate as the user
        (b"\0alice\0alice-pw\0", ["sasl-code 1"]),  # a NUL too many
        (b"\0ali\0ce\0alice-pw", ["sasl-code 1"]),
        (b"\0alice\0alice\0pw", ["sasl-code 1"]),
        (b"alice\0alice\0alice-pw\0\0", ["sasl-code 1"]),
        (b"\0\0", ["sasl-code 1"]),
        (b"", ["sasl-code 1"]),
        (b"\xff\xfe\0alice\0alice-pw", ["sasl-code 1"]),
    ],
    ids=["4000 bytes", "surrogate password", "surrogate user", "trailing NUL", "NUL in user",
         "NUL in password", "NULs", "empty parts", "empty", "bad UTF-8 authzid"],
)  # fmt: skip
async def test_malformed_plain_gets_the_auth_outcome(
    amqp_server: ServerProcess, honest: Honest, response: bytes, outcome: list[str]
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    await peer.send(login(response) + open_frame())
    frames = await peer.until_closed()
    assert conditions(frames) == outcome
    assert not any(f.descriptor == OPEN for f in frames)


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return start_process(tmp_path_factory)


async def test_a_peer_gone_during_its_password_check_leaves_no_error(
    own_server: ServerProcess,
) -> None:
    server = own_server
    try:
        for _ in range(3):
            gone = await Peer.connect(server.amqp_port)
            await gone.send(login(b"\0alice\0wrong password"))
            await gone.close()  # before the (slow, by design) check of the password is done
        # Checks from one address run one at a time: this outcome comes after those checks.
        peer = await Peer.connect(server.amqp_port)
        await peer.send(login(b"\0alice\0another wrong one"))
        assert conditions(await peer.until_closed()) == ["sasl-code 1"]
        await peer.close()
    finally:
        assert server.stop() == 0
    # Their failures were looked at (asyncio logs one nobody retrieves, when it is collected).
    assert server.errors() == []


@pytest.mark.parametrize("size", [MIB, 2**32 - 1])
async def test_a_huge_sasl_frame_is_refused_before_it_is_read(
    amqp_server: ServerProcess, honest: Honest, size: int
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    response = b"\0alice\0" + b"p" * 60_000  # the start of it; the server does not wait for more
    init = sasl_init("PLAIN", response)
    await peer.send(SASL_HEADER + struct.pack(">I", size) + init[4:])
    frames = await peer.until_closed()
    assert conditions(frames) == []  # no outcome at all: closed at the frame header


async def test_a_plain_of_one_mib_in_pieces_is_cut_off(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    init = sasl_init("PLAIN", b"\0alice\0" + b"p" * MIB)
    try:
        for start in range(0, len(init), 64 * 1024):
            await peer.send((SASL_HEADER if start == 0 else b"") + init[start : start + 64 * 1024])
    except ConnectionError:
        pass  # closed while we were still sending: what we want
    assert conditions(await peer.until_closed()) == []


# -- after the login: frames ----------------------------------------------------------------


async def test_an_open_announcing_4_gib_frames_is_served_within_ours(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    peer = await Peer.connect(amqp_server.amqp_port)
    await peer.send(login() + open_frame(2**32 - 1) + begin())
    opened = await peer.until(OPEN)
    assert opened.fields[2] == uint(64 * 1024)  # the server's own maximum is what binds us
    await peer.send(attach("in", 0, "events", receiver=True))
    await peer.until(FLOW)
    # a frame larger than the negotiated maximum closes the connection with framing-error
    await peer.send(transfer(0, 0, b"\x00" * (64 * 1024)))
    frames = await peer.until_closed()
    assert conditions(frames) == ["sasl-code 0", "amqp:connection:framing-error"]


@pytest.mark.parametrize("size", [64 * 1024 + 1, MIB, 2**31, 2**32 - 1])
async def test_a_frame_above_the_maximum_is_a_framing_error(
    amqp_server: ServerProcess, honest: Honest, size: int
) -> None:
    peer = await logged_in(amqp_server.amqp_port)
    await peer.send(frame_header(size) + b"\x00" * 1000)
    frames = await peer.until_closed()
    assert conditions(frames)[-1] == "amqp:connection:framing-error"


@pytest.mark.parametrize(
    "data",
    [
        frame_header(7),  # smaller than a header
        struct.pack(">IBBH", 16, 1, 0, 0) + b"\x00" * 8,  # data offset inside the header
        struct.pack(">IBBH", 16, 200, 0, 0) + b"\x00" * 8,  # data offset beyond the frame
        struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00\x80\xff\xff",  # a truncated descriptor
        frame(0x12, ["x"], channel=7),  # an attach on a channel no session has
        frame(0x77, ["not a performative"]),
        struct.pack(">IBBH", 14, 2, 0, 0) + b"\x00\x53\x12\xd0\xff\xff",  # a list cut short
    ],
    ids=["size 7", "doff 1", "doff 200", "cut descriptor", "no session", "not a performative",
         "cut list"],
)  # fmt: skip
async def test_broken_frames_close_with_a_condition(
    amqp_server: ServerProcess, honest: Honest, data: bytes
) -> None:
    peer = await logged_in(amqp_server.amqp_port)
    await peer.send(data)
    frames = await peer.until_closed()
    condition = conditions(frames)[-1]
    assert condition is not None, conditions(frames)
    assert condition.startswith("amqp:"), conditions(frames)


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00\x53\x10\x45",  # open with no fields
        frame(0x12, ["x"]),  # an attach without its mandatory fields
        frame(0x10, ["again"]),  # a second open
        frame(0x13, [None, None, None, None, uint(0), None, uint(2**32 - 1)]),  # credit, no link
        frame(0x15, [True, uint(10**6)]),  # a disposition of deliveries that never were
        frame(0x16, [uint(999), True]),  # a detach of a link that never was
    ],
    ids=["open as list0", "attach of a name only", "second open", "flow of no link",
         "disposition of nothing", "detach of nothing"],
)  # fmt: skip
async def test_frames_out_of_place_close_or_are_ignored(
    amqp_server: ServerProcess, honest: Honest, data: bytes
) -> None:
    """What the engine tolerates it may ignore; the connection then still serves."""
    peer = await logged_in(amqp_server.amqp_port)
    await peer.send(data + attach("after", 5, "events", receiver=True))
    try:
        assert await peer.attached("after")  # still serving
    except AssertionError:
        if not peer.eof:
            raise
        condition = conditions(peer.frames)[-1]
        assert condition is not None, conditions(peer.frames)
        assert condition.startswith("amqp:"), conditions(peer.frames)


# -- links ----------------------------------------------------------------------------------


async def test_ten_thousand_links_attached_and_detached_hold_nothing(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    peer = await logged_in(amqp_server.amqp_port)
    addresses = ["events", "$management", "$cbs", "events/$info", "nowhere"]

    async def cycle(rounds: int) -> None:
        for start in range(0, rounds, 250):
            batch = b"".join(
                attach(f"l{n}", n % 200, addresses[n % len(addresses)], receiver=n % 2 == 0)
                + detach(n % 200)
                for n in range(start, start + 250)
            )
            await peer.send(batch)
            detached = 0
            async with asyncio.timeout(60):
                while detached < 250:
                    received = await peer.next_frame()
                    assert received is not None, peer.frames[-5:]
                    if received.descriptor == DETACH and received.fields[1]:
                        detached += 1
            peer.frames.clear()

    await cycle(1_000)  # warm up: the first allocations of every kind
    before = amqp_server.rss_kib()
    await cycle(10_000)
    grown = amqp_server.rss_kib() - before
    print(f"\n10,000 links: RSS +{grown} KiB")
    assert grown < 8 * 1024, f"RSS grew by {grown} KiB over 10,000 links"
    await peer.send(attach("after", 0, "events", receiver=True))
    assert await peer.attached("after")  # the connection still serves links
    await peer.close()


async def test_sessions_begun_and_ended_with_their_links_hold_nothing(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    """Ending a session ends its links: they no longer count toward the link limit, and 5,000
    sessions leave no memory behind (15 MB before proton was let drop them)."""
    peer = await logged_in(amqp_server.amqp_port)

    async def cycle(rounds: int) -> None:
        for _ in range(rounds // 250):
            await peer.send(
                b"".join(
                    begin(channel)
                    + attach(f"s{channel}", 0, "events", receiver=True, channel=channel)
                    + frame(END, [], channel=channel)
                    for channel in range(1, 251)
                )
            )
            ended = 0
            async with asyncio.timeout(60):
                while ended < 250:
                    received = await peer.next_frame()
                    assert received is not None, conditions(peer.frames)
                    ended += received.descriptor == END
            peer.frames.clear()

    await cycle(1_000)  # warm up: the first allocations of every kind
    before = amqp_server.rss_kib()
    await cycle(2_500)
    grown = amqp_server.rss_kib() - before
    print(f"\n2,500 sessions: RSS +{grown} KiB")
    assert grown < 8 * 1024, f"RSS grew by {grown} KiB over 2,500 sessions"
    await peer.send(attach("after", 0, "events", receiver=True))
    assert await peer.attached("after")  # not refused: the ended links no longer count
    await peer.close()


async def test_the_link_limit_refuses_the_257th(amqp_server: ServerProcess, honest: Honest) -> None:
    peer = await logged_in(amqp_server.amqp_port)
    await peer.send(b"".join(attach(f"l{n}", n, "events", receiver=True) for n in range(257)))
    assert not await peer.attached("l256")
    refused = await peer.until(DETACH)
    assert refused.condition() == "amqp:resource-limit-exceeded"
    await peer.close()


# -- transfers that never end ---------------------------------------------------------------


@pytest.mark.parametrize("address", ["events", "$cbs", "$management"])
async def test_a_multi_frame_message_beyond_the_limit_detaches_its_link(
    amqp_server: ServerProcess, honest: Honest, address: str
) -> None:
    mechanism = "ANONYMOUS" if address == "$cbs" else "PLAIN"
    peer = await logged_in(
        amqp_server.amqp_port, b"" if address == "$cbs" else b"\0alice\0alice-pw", mechanism
    )
    await peer.send(attach("big", 0, address, receiver=True))
    await peer.until(FLOW)
    chunk = b"\x00" * 60_000
    detached = None
    async with asyncio.timeout(60):
        for _ in range(40):  # 2.4 MB, more than any message may be
            await peer.send(transfer(0, 0, chunk, more=True))
        detached = await peer.until(DETACH)
    assert detached.condition() == "amqp:link:message-size-exceeded"
    # the connection goes on: a new link on it works
    await peer.send(attach("next", 1, "events" if mechanism == "PLAIN" else "$cbs", receiver=True))
    assert await peer.attached("next")
    await peer.close()


async def test_unfinished_messages_on_every_link_hold_a_bounded_amount(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    """The most one connection can make the server hold: a message just under the limit left
    unfinished on each of its 256 links."""
    peer = await logged_in(amqp_server.amqp_port)
    links = 256
    await peer.send(b"".join(attach(f"l{n}", n, "events", receiver=True) for n in range(links)))
    for _ in range(links):
        await peer.until(FLOW)
    before = amqp_server.rss_kib()
    chunk = b"\x00" * 60_000
    per_link = MIB - 2 * len(chunk)  # just under the message limit
    for handle in range(links):
        frames = b"".join(
            frame(TRANSFER, [uint(handle), uint(handle), b"t", uint(0), False, True], chunk)
            if n == 0
            else frame(TRANSFER, [uint(handle), None, None, None, None, True], chunk)
            for n in range(per_link // len(chunk))
        )
        await peer.send(frames)
    await peer.send(attach("probe", links, "events", receiver=True))  # all of it was read
    probe = await peer.until(DETACH)
    assert probe.condition() == "amqp:resource-limit-exceeded"
    held = amqp_server.rss_kib() - before
    assert held < (links * MIB + 64 * MIB) // 1024, f"{held} KiB held"
    print(f"\n256 unfinished messages of {per_link} bytes: RSS +{held} KiB")
    await peer.close()


# -- $cbs and $management -------------------------------------------------------------------


async def request_reply(
    port: int, address: str, requests: list[bytes], mechanism: str = "PLAIN"
) -> tuple[Peer, list[tuple[Any, bytes]]]:
    """Send each request on a link to ``address``; the disposition and reply of each."""
    response = b"" if mechanism == "ANONYMOUS" else b"\0alice\0alice-pw"
    peer = await logged_in(port, response, mechanism)
    reply_link = frame(ATTACH, ["replies", uint(1), True, None, None,
                                 _terminus(0x28, address), _terminus(0x29, "me")])  # fmt: skip
    await peer.send(attach("requests", 0, address, receiver=True) + reply_link + flow(1, 1000))
    await peer.until(FLOW)
    results: list[tuple[Any, bytes]] = []
    for number, request in enumerate(requests):
        await peer.send(transfer(0, number, request))
        state = None
        reply = b""
        async with asyncio.timeout(30):
            while state is None or (_accepted(state) and not reply):
                received = await peer.next_frame()
                assert received is not None, f"closed: {conditions(peer.frames)}"
                if received.descriptor == DISPOSITION and received.fields[0] is True:
                    state = received.fields[4]
                elif received.descriptor == TRANSFER:
                    reply = received.payload
                elif received.descriptor == DETACH:
                    raise AssertionError(f"detached: {received.condition()}")
        results.append((state, reply))
    return peer, results


def _terminus(descriptor: int, address: str) -> Any:
    from proton import Described, ulong

    return Described(ulong(descriptor), [address])


def _accepted(state: Any) -> bool:
    return getattr(state, "descriptor", None) == 0x24


def _status(reply: bytes) -> int:
    decoded = Message()
    decoded.decode(reply)
    assert decoded.properties is not None
    return int(decoded.properties["status-code"])


WRONG_TYPES: list[Any] = [
    None,
    7,
    -1,
    3.5,
    True,
    b"\xff",
    ["READ"],
    {"a": 1},
    symbol("READ"),
    "\ud800x",
]


async def test_management_requests_with_fields_of_every_wrong_type(
    amqp_server: ServerProcess, honest: Honest
) -> None:
    requests: list[bytes] = []
    fields = ["operation", "type", "name", "partition", "eventType"]
    good = {"operation": "READ", "type": "com.microsoft:partition", "name": "events",
            "partition": "0"}  # fmt: skip
    for field in fields:
        for wrong in WRONG_TYPES:
            if isinstance(wrong, str) and "\ud800" in wrong:
                continue  # not encodable as a string here; see the raw cases below
            properties = {**good, field: wrong}
            if field == "eventType":
                properties["operation"] = "GET-EVENTS"
            requests.append(message(None, properties, msg_id=f"{field}-{wrong!r:.10}"))
    for odd_id in [7, b"\x00", ["x"], {"k": 1}, 1.5, True]:
        requests.append(message(None, good, msg_id=odd_id))
    for reply_to in [7, b"me", ["me"], True]:
        requests.append(message(None, good, reply_to=reply_to))
    requests.append(message({"body": ["of", "any", "kind"]}, good))
    peer, results = await request_reply(amqp_server.amqp_port, "$management", requests)
    for (state, reply), request in zip(results, requests, strict=True):
        if _accepted(state):
            assert _status(reply) in (200, 400, 404), request
        else:  # refused as undecodable: rejected, with the reason
            assert getattr(state, "descriptor", None) == 0x25, (state, request)
    await peer.close()


CBS_GOOD = {"operation": "put-token", "type": "servicebus.windows.net:sastoken",
            "name": "sb://127.0.0.1/events"}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "properties", "status"),
    [
        ("SharedAccessSignature " + "a" * 60_000, CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=" + "%00" * 1000 + "&se=1&skn=alice", CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=abc&se=99999999999&skn=nobody", CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=abc&se=99999999999&skn=alice", CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=abc&se=-1&skn=alice", CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=abc&se=1e9&skn=alice", CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=abc&se=99999999999&skn=" + "%ff" * 100, CBS_GOOD, 401),
        ("SharedAccessSignature " + "&" * 3000, CBS_GOOD, 401),
        (b"SharedAccessSignature sr=x", CBS_GOOD, 401),
        (["SharedAccessSignature"], CBS_GOOD, 401),
        (None, CBS_GOOD, 401),
        (12, CBS_GOOD, 401),
        ("SharedAccessSignature sr=x&sig=a&se=1&skn=alice", {**CBS_GOOD, "name": 7}, 400),
        ("SharedAccessSignature sr=x&sig=a&se=1&skn=alice", {**CBS_GOOD, "type": b"x"}, 400),
        ("SharedAccessSignature sr=x&sig=a&se=1&skn=alice", {**CBS_GOOD, "operation": None}, 400),
    ],
    ids=["60 kB", "NULs", "no such user", "wrong signature", "negative se", "float se",
         "bad UTF-8 skn", "ampersands", "binary", "list", "null", "int", "name int",
         "type binary", "operation null"],
)  # fmt: skip
async def test_bad_cbs_tokens_are_refused_with_a_status(
    amqp_server: ServerProcess, honest: Honest, body: Any, properties: dict[str, Any], status: int
) -> None:
    peer, [(state, reply)] = await request_reply(
        amqp_server.amqp_port, "$cbs", [message(body, properties, msg_id="t")], "ANONYMOUS"
    )
    assert _accepted(state)
    assert _status(reply) == status
    # still anonymous: a link to the event log is refused
    await peer.send(attach("after", 2, "events", receiver=True))
    assert not await peer.attached("after")
    assert (await peer.until(DETACH)).condition() == "amqp:unauthorized-access"
    await peer.close()
