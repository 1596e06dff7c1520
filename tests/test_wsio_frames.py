"""The server's own WebSocket framing, over a real socket: whatever way the bytes of frames are
cut into reads, with pings, fragmented messages, text and binary frames and every length
encoding among them, each request gets its reply (in any order, as FTN3 allows) and each
ping its pong, in order; the events are stored in the order of the frames."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from futoin_evt.server.app import EventServer

from .support.servers import USERS

pytestmark = pytest.mark.functional

ADD = "futoin.evt.gen:1.1:addEvent"


def request(rid: int, data: Any) -> bytes:
    msg = {
        "f": ADD,
        "p": {"type": "FRAMED", "data": data},
        "rid": f"C{rid}",
        "sec": f"alice:{USERS['alice']}",
    }
    return json.dumps(msg).encode()


class RawPeer:
    """A WebSocket client on websockets' Sans-I/O protocol that writes whatever bytes it is
    given, so a test chooses where reads are cut."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.ws = ClientProtocol(parse_uri("ws://127.0.0.1/"), max_size=None)
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, server: EventServer) -> RawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        peer = cls(reader, writer)
        peer.ws.send_request(peer.ws.connect())
        peer.writer.write(b"".join(peer.ws.data_to_send()))
        while not peer.ws.events_received():
            peer.ws.receive_data(await reader.read(65536))
        return peer

    def frames(self, *frames: Frame) -> bytes:
        for frame in frames:
            self.ws.send_frame(frame)
        return b"".join(self.ws.data_to_send())

    async def receive(self, count: int) -> list[Frame]:
        received: list[Frame] = []
        async with asyncio.timeout(10):
            while len(received) < count:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.ws.receive_data(data)
                received += [e for e in self.ws.events_received() if isinstance(e, Frame)]
        return received


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 130, 65536])
async def test_frames_cut_anywhere_are_all_answered_in_order(server: EventServer, cut: int) -> None:
    peer = await RawPeer.connect(server)
    long_text = "x" * 300  # a 16-bit length
    longer_text = "y" * 70_000  # a 64-bit length (over the request limit: refused)
    wire = peer.frames(
        Frame(Opcode.BINARY, request(1, "short")),
        Frame(Opcode.PING, b"ping-1"),
        Frame(Opcode.TEXT, request(2, long_text)),
        Frame(Opcode.TEXT, request(3, "frag")[:10], fin=False),
        Frame(Opcode.PING, b"ping-2"),  # a control frame inside a fragmented message
        Frame(Opcode.CONT, request(3, "frag")[10:20], fin=False),
        Frame(Opcode.CONT, request(3, "frag")[20:]),
        Frame(Opcode.BINARY, request(4, longer_text)),
    )
    for start in range(0, len(wire), cut):
        peer.writer.write(wire[start : start + cut])
        await peer.writer.drain()
    frames = await peer.receive(6)
    pongs = [f.data for f in frames if f.opcode is Opcode.PONG]
    frames = [f for f in frames if f.opcode is Opcode.BINARY]
    replies = {r["rid"]: r for r in (json.loads(bytes(f.data)) for f in frames) if "rid" in r}
    assert pongs == [b"ping-1", b"ping-2"]
    assert sorted(replies) == ["C1", "C2", "C3", "C4"]
    ids = [int(replies[rid]["r"]) for rid in ("C1", "C2", "C3")]
    assert ids == sorted(ids)
    assert replies["C4"]["edesc"] == "Request exceeds 65536 bytes"
    events = await server.store.read_events(ids[0] - 1, limit=10, max_bytes=1 << 20)
    assert [e["data"] for e in json.loads(events.json)] == ["short", long_text, "frag"]
    peer.writer.close()


async def test_a_close_is_echoed(server: EventServer) -> None:
    peer = await RawPeer.connect(server)
    peer.ws.send_close(1000, "bye")
    peer.writer.write(b"".join(peer.ws.data_to_send()))
    (close,) = await peer.receive(1)
    assert close.opcode is Opcode.CLOSE
    assert close.data == (1000).to_bytes(2, "big") + b"bye"
    peer.writer.close()


async def test_an_unmasked_frame_closes_with_a_protocol_error(server: EventServer) -> None:
    peer = await RawPeer.connect(server)
    peer.writer.write(Frame(Opcode.BINARY, request(1, "a")).serialize(mask=False))
    (close,) = await peer.receive(1)
    assert close.opcode is Opcode.CLOSE
    assert close.data[:2] == (1002).to_bytes(2, "big")
    peer.writer.close()
