"""AMQP 1.0 as bytes on a socket, for tests that must not depend on the server's engine: a frame
builder, a frame reader, and a server process whose log and memory a test can read."""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from proton import Data, Described, symbol, uint, ulong

from .servers import USERS

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
PLAIN_ALICE = b"\0alice\0" + USERS["alice"].encode()

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44
SOURCE, TARGET = 0x28, 0x29
APPLICATION_PROPERTIES, AMQP_VALUE, PROPERTIES = 0x74, 0x77, 0x73


def encode(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def frame(
    descriptor: int, fields: list[Any], payload: bytes = b"", channel: int = 0, kind: int = 0
) -> bytes:
    """One frame: a performative (``kind`` 0) or a SASL frame (1), and the payload after it."""
    body = encode(Described(ulong(descriptor), fields)) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, kind, channel) + body


def frame_header(size: int, channel: int = 0) -> bytes:
    """The first 8 bytes of a frame that announces ``size`` bytes (none of which follow)."""
    return struct.pack(">IBBH", size, 2, 0, channel)


def sasl_init(mechanism: str, response: bytes | None) -> bytes:
    return frame(SASL_INIT, [symbol(mechanism), response], kind=1)


def login(response: bytes = PLAIN_ALICE, mechanism: str = "PLAIN") -> bytes:
    """The SASL exchange and the AMQP header behind it, pipelined as clients do."""
    return SASL_HEADER + sasl_init(mechanism, response) + AMQP_HEADER


def open_frame(max_frame_size: int | None = None) -> bytes:
    return frame(
        OPEN, ["wire-test", None, None if max_frame_size is None else uint(max_frame_size)]
    )


def begin(channel: int = 0) -> bytes:
    return frame(BEGIN, [None, uint(0), uint(5000), uint(5000)], channel=channel)


def attach(name: str, handle: int, address: str, *, receiver: bool, channel: int = 0) -> bytes:
    """A link to (``receiver``: we send, the server receives) or from ``address``."""
    source = Described(ulong(SOURCE), [] if receiver else [address])
    target = Described(ulong(TARGET), [address] if receiver else [])
    return frame(ATTACH, [name, uint(handle), not receiver, None, None, source, target, None,
                          None, uint(0)], channel=channel)  # fmt: skip


def detach(handle: int, channel: int = 0) -> bytes:
    return frame(DETACH, [uint(handle), True], channel=channel)


def flow(handle: int, credit: int, channel: int = 0) -> bytes:
    return frame(FLOW, [uint(0), uint(5000), uint(0), uint(5000), uint(handle), uint(0),
                        uint(credit)], channel=channel)  # fmt: skip


def transfer(handle: int, delivery_id: int, payload: bytes, *, more: bool = False) -> bytes:
    tag = str(delivery_id).encode()
    return frame(TRANSFER, [uint(handle), uint(delivery_id), tag, uint(0), False, more], payload)


def message(
    body: Any, properties: dict[str, Any] | None = None, *, msg_id: Any = None, reply_to: Any = None
) -> bytes:
    """A bare message: properties (id, reply-to), application-properties, an amqp-value body."""
    sections = encode(Described(ulong(PROPERTIES), [msg_id, None, None, None, reply_to]))
    if properties is not None:
        application: Any = properties
        sections += encode(Described(ulong(APPLICATION_PROPERTIES), application))
    return sections + encode(Described(ulong(AMQP_VALUE), body))


def decoded(data: Data) -> Any:
    """The value at ``data``'s cursor, binaries as bytes (proton's are views of a buffer it
    reuses, and cannot be map keys)."""
    kind = data.type()
    if kind == Data.BINARY:
        return bytes(data.get_binary())
    if kind in (Data.MAP, Data.LIST, Data.DESCRIBED):
        items = []
        data.enter()
        while data.next():
            items.append(decoded(data))
        data.exit()
        if kind == Data.MAP:
            return dict(zip(items[::2], items[1::2], strict=True))
        if kind == Data.DESCRIBED:
            return Described(items[0], items[1])
        return items
    return data.get_object()


@dataclass(frozen=True, slots=True)
class Frame:
    channel: int
    kind: int
    descriptor: int
    fields: list[Any]
    payload: bytes

    def condition(self) -> str | None:
        """The error condition of a close, detach, end or sasl-outcome code as text."""
        if self.descriptor == SASL_OUTCOME:
            return f"sasl-code {int(self.fields[0])}"
        index = {CLOSE: 0, END: 0, DETACH: 2}.get(self.descriptor)
        if index is None or len(self.fields) <= index or self.fields[index] is None:
            return None
        error = self.fields[index]
        assert isinstance(error, Described)
        fields: Any = error.value
        return str(fields[0])


class Peer:
    """One raw connection: write bytes, read the server's frames."""

    #: Every peer connected and not yet closed (a test's teardown closes them).
    open_peers: ClassVar[set[Peer]] = set()

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.headers: list[bytes] = []
        self.frames: list[Frame] = []
        self.eof = False

    @classmethod
    async def connect(cls, port: int) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        peer = cls(reader, writer)
        cls.open_peers.add(peer)
        return peer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def next_frame(self) -> Frame | None:
        """The server's next frame (protocol headers are noted on the way); None at EOF."""
        while True:
            try:
                head = await self.reader.readexactly(8)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.eof = True
                return None
            if head.startswith(b"AMQP"):
                self.headers.append(head)
                continue
            size, doff, kind, channel = struct.unpack(">IBBH", head)
            try:
                rest = await self.reader.readexactly(size - 8)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.eof = True
                return None
            if size == 8:
                continue  # an empty frame: a heartbeat
            body = rest[doff * 4 - 8 :]
            data = Data()
            used = data.decode(body)
            data.rewind()
            data.next()
            performative = decoded(data)
            assert isinstance(performative, Described)
            fields = list(performative.value) if isinstance(performative.value, list) else []
            descriptor: Any = performative.descriptor
            received = Frame(channel, kind, int(descriptor), fields, body[used:])
            self.frames.append(received)
            return received

    async def until(self, descriptor: int, seconds: float = 30) -> Frame:
        """Read up to the next frame with that performative (fails at EOF)."""
        async with asyncio.timeout(seconds):
            while (received := await self.next_frame()) is not None:
                if received.descriptor == descriptor:
                    return received
        raise AssertionError(f"EOF before a frame 0x{descriptor:x}; got {self.frames}")

    async def attached(self, name: str, seconds: float = 30) -> bool:
        """Whether the server takes the link of that name (its attach has a terminus)."""
        async with asyncio.timeout(seconds):
            while (received := await self.next_frame()) is not None:
                if received.descriptor == ATTACH and received.fields[0] == name:
                    termini: list[Any] = [t.value for t in received.fields[5:7] if t is not None]
                    return any(fields and fields[0] is not None for fields in termini)
        raise AssertionError(f"EOF before the attach of {name}; got {self.frames}")

    async def until_closed(self, seconds: float = 30) -> list[Frame]:
        """Read everything up to EOF; the frames received meanwhile."""
        async with asyncio.timeout(seconds):
            while await self.next_frame() is not None:
                pass
        return self.frames

    async def close(self) -> None:
        self.open_peers.discard(self)
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    @classmethod
    async def close_all(cls) -> None:
        for peer in list(cls.open_peers):
            await peer.close()


async def logged_in(port: int, response: bytes = PLAIN_ALICE, mechanism: str = "PLAIN") -> Peer:
    """A peer logged in, with the connection open and session 0 begun."""
    peer = await Peer.connect(port)
    await peer.send(login(response, mechanism) + open_frame() + begin())
    outcome = await peer.until(SASL_OUTCOME)
    assert outcome.fields[0] == 0, outcome
    await peer.until(BEGIN)
    return peer


class ServerProcess:
    """``futoin-evt serve`` with AMQP in its own process; its log goes to a file (nothing can
    block on a full pipe), its memory is read from /proc."""

    def __init__(self, db: Path, *extra: str) -> None:
        self.log_path = db.with_suffix(".log")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            # one process: the limits and the memory measured are a process's
            [sys.executable, "-m", "futoin_evt", "--log-level", "info", "serve", "--db", str(db),
             "--port", "0", "--amqp", "127.0.0.1:0", "--workers", "1", *extra],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        ws = re.search(r"ws://127.0.0.1:(\d+)", line)
        amqp = re.search(r"amqp://127.0.0.1:(\d+)", line)
        if ws is None or amqp is None:
            self.stop()
            raise AssertionError(f"no URLs in {line!r}: {self.log_path.read_text()}")
        self.port, self.amqp_port = int(ws.group(1)), int(amqp.group(1))
        self.http_url = f"http://127.0.0.1:{self.port}"

    def rss_kib(self) -> int:
        """The resident memory of the server process now."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        assert match is not None
        return int(match.group(1))

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def errors(self) -> list[str]:
        """Lines the server logged at ERROR or worse, and tracebacks."""
        return [
            line
            for line in self.log().splitlines()
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        ]

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()
        return self.proc.returncode
