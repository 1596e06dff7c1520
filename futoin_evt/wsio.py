"""WebSocket connections on websockets' Sans-I/O protocol, shared by the server and the client.

The asyncio layer of websockets writes every message with its own system call and wakes a
future per received message. Here the FTN3 layer gets whole messages straight from
``data_received`` and queues replies with :meth:`FrameIO.send`; everything queued during one
turn of the event loop leaves in one write. That is what lets many calls in flight on one
connection share system calls, as group commit lets them share an fsync.

On the server side, complete unfragmented data frames are read and replies framed here
(:meth:`FrameIO._take_frames`, :meth:`FrameIO.send`): the bytes of a frame, its mask and its
length are all a call needs, and websockets' parser costs more than the call's own work.
Every other frame (control frames, fragments, anything malformed or too large) goes to
websockets whole, as do all bytes once the connection is no longer open, so websockets keeps
the protocol (pings, the closing handshake, refusals and close codes) and its parser always
starts at a frame boundary.

Flow control: :meth:`FrameIO.drain` waits while the transport's write buffer is over its high
mark (a slow reader), and :meth:`FrameIO.pause_reading` stops reading a peer that sends more
than it should.

Every callback from the transport goes through one guard: whatever a handler raises is logged
once with its traceback and ends that connection the ordinary way (``connection_lost``, the
``closed`` future and everything hanging on it), never the event loop's "fatal error" path
that would skip it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Callable
from http import HTTPStatus
from typing import Final, cast

from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import InvalidHandshake, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import SEND_EOF, Protocol, Side, State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from .closed import ConnectionClosedError
from .slots import LINGER_BYTES, Slots, half_close

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask

logger = logging.getLogger(__name__)

#: How long a peer may take to finish the opening or the closing handshake.
HANDSHAKE_SECONDS: Final = 10.0

MessageHandler = Callable[[bytes], None]
#: Takes a plain HTTP request (with its body; empty for a GET) and returns True when it
#: serves it; the connection then carries that response until ``http_done``.
HttpHandler = Callable[["ServerIO", Request, bytes], bool]

#: What a peer may send while its HTTP response is being written, before reading pauses.
HTTP_HELD_BYTES: Final = 64 * 1024
#: The longest HTTP request line read before the method is known.
REQUEST_LINE_BYTES: Final = 8 * 1024
#: The most a request's line and headers may take (a body is bounded by ``max_size``).
REQUEST_HEAD_BYTES: Final = 16 * 1024
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
CLOSE_INTERNAL_ERROR: Final = 1011


class FrameIO(asyncio.Protocol):
    """One WebSocket connection: whole messages in, binary messages out, batched per loop turn."""

    def __init__(self, ws: Protocol) -> None:
        self.ws = ws
        self.transport: asyncio.Transport | None = None
        self.on_message: MessageHandler = _drop
        #: Called with True when the write buffer goes over its high mark, False when it drains.
        self.on_write_pressure: Callable[[bool], None] = _ignore
        #: Asking for the running loop costs a system call (its process check).
        self._loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._fragments: list[bytes] | None = None
        #: Server side: frames are read and written here (see the module's docstring).
        self._own_frames = ws.side is Side.SERVER
        #: The start of a frame that has not arrived whole yet (server side).
        self._partial = b""
        #: websockets' message size limit (its attribute's name changed across versions).
        self._max_message_bytes: int | None = getattr(
            ws, "max_message_size", getattr(ws, "max_size", None)
        )
        #: Frames queued by :meth:`send` on the server side; they leave before websockets' own.
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._timer: asyncio.TimerHandle | None = None
        #: True while the connection carries something other than WebSocket (an HTTP response).
        self._detached = False
        self.peer = "?"

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not subclasses of asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_SECONDS, self.abort)

    def data_received(self, data: bytes) -> None:
        try:
            self._receive(data)
        except Exception:
            self._fail_unexpectedly()

    def _receive(self, data: bytes) -> None:
        if self._own_frames and self.ws.state is State.OPEN:
            data = self._take_frames(data)
            if not data:
                return
        elif self._partial:  # closed since a frame began: websockets reads it whole
            data, self._partial = self._partial + data, b""
        self.ws.receive_data(data)
        self._process()

    def _take_frames(self, data: bytes) -> bytes:
        """Deliver the complete unfragmented data frames in ``data`` (after what was held
        back) and hand every other complete frame to websockets alone; keep an incomplete
        frame for later. Returns the bytes that are websockets' from here on: all of them
        once a frame is malformed or too large, or the connection is no longer open."""
        buffer = self._partial + data if self._partial else data
        self._partial = b""
        max_size = self._max_message_bytes
        end_of_data = len(buffer)
        offset = 0
        while end_of_data - offset >= 2:
            head1 = buffer[offset]
            head2 = buffer[offset + 1]
            length = head2 & 0x7F
            start = offset + 2
            if length >= 126:
                width = 2 if length == 126 else 8
                if end_of_data - start < width:
                    break
                length = int.from_bytes(buffer[start : start + width], "big")
                start += width
            if not head2 & 0x80 or (max_size is not None and length > max_size):
                self._own_frames = False  # unmasked or too large: websockets refuses it
                return buffer[offset:]
            end = start + 4 + length
            if end > end_of_data:
                break
            if head1 & 0xF0 == 0x80 and head1 & 0x0F in (1, 2) and self._fragments is None:
                # FIN, no RSV bits, text or binary: a whole message
                message = apply_mask(buffer[start + 4 : end], buffer[start : start + 4])
                offset = end
                self.on_message(message)
            else:
                frame, offset = buffer[offset:end], end
                self.ws.receive_data(frame)
                self._process()
            if self.ws.state is not State.OPEN or self._detached:
                return buffer[offset:]
        self._partial = buffer[offset:]
        return b""

    def eof_received(self) -> None:
        try:
            if self._partial:  # websockets judges a frame cut short
                partial, self._partial = self._partial, b""
                self.ws.receive_data(partial)
            self.ws.receive_eof()
            self._process()
        except Exception:
            self._fail_unexpectedly()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._writable.set()  # wake writers; they find the connection closed
        if not self.opened.done():
            self.opened.set_exception(ConnectionClosedError("closed during the handshake"))
            # Only a client waits for it; on the server side, nobody is there to retrieve it.
            self.opened.exception()
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail_unexpectedly(self) -> None:
        """The boundary guard: a bug met this connection's input. Log it, close with 1011."""
        logger.exception("closing the connection from %s after an unexpected error", self.peer)
        if self.ws.state is State.OPEN:
            self.ws.send_close(CLOSE_INTERNAL_ERROR, "internal error")
            self._flush()
        if self.transport is not None:
            self.transport.close()  # connection_lost follows, and with it the cleanup
            self._expect_close()

    def pause_writing(self) -> None:
        self._writable.clear()
        self.on_write_pressure(True)

    def resume_writing(self) -> None:
        self._writable.set()
        self.on_write_pressure(False)

    # -- sending ------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.ws.state is State.OPEN and not self.closed.done()

    def send(self, message: bytes) -> None:
        """Queue one binary message; it leaves with the others at the end of this loop turn."""
        if not self.is_open:
            raise ConnectionClosedError("the connection is closed")
        if self._own_frames:  # a server's frames are not masked; no extensions are agreed
            length = len(message)
            if length < 126:
                self._out.append(bytes((0x82, length)))
            elif length < 0x10000:
                self._out.append(b"\x82\x7e" + length.to_bytes(2, "big"))
            else:
                self._out.append(b"\x82\x7f" + length.to_bytes(8, "big"))
            self._out.append(message)
        else:
            self.ws.send_binary(message)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write what is queued now, not at the end of this loop turn."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()

    @property
    def writable(self) -> bool:
        """False while the write buffer is over its high mark (see :meth:`drain`)."""
        return self._writable.is_set()

    async def drain(self) -> None:
        """Wait until the peer has read enough that the write buffer is below its high mark."""
        await self._writable.wait()
        if self.closed.done():
            raise ConnectionClosedError("the connection is closed")

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the transport closes when it ends or times out.
        Reading resumes, if paused, to see the peer's close."""
        if self.ws.state is State.OPEN:
            self.ws.send_close(code, reason)
            self._flush()
            self._expect_close()
            self.resume_reading()
        elif self.ws.state is State.CONNECTING:
            self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and self.transport.is_reading():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_reading():
            self.transport.resume_reading()

    # -- internals ----------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_handle = None
        writes = self.ws.data_to_send()
        if self._out:
            writes, self._out = self._out + writes, []
        if not writes or self.transport is None or self.transport.is_closing():
            return
        data = [chunk for chunk in writes if chunk]
        if data:
            self.transport.write(b"".join(data) if len(data) > 1 else data[0])
        if writes[-1] == SEND_EOF and self.transport.can_write_eof():
            try:
                self.transport.write_eof()
            except OSError:  # the peer is gone already
                self.transport.abort()

    def _process(self) -> None:
        for event in self.ws.events_received():
            if isinstance(event, Frame):
                self._on_frame(event)
            else:
                self._on_handshake(event)
            if self._detached:
                return  # anything after an HTTP request is not WebSocket's to answer
        self._flush()
        if self.ws.close_expected():
            self._expect_close()
        if self.ws.state is State.CLOSED and self.transport is not None:
            self.transport.close()

    def _on_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.TEXT or frame.opcode is Opcode.BINARY:
            if frame.fin:
                self.on_message(bytes(frame.data))
            else:
                self._fragments = [bytes(frame.data)]
        elif frame.opcode is Opcode.CONT and self._fragments is not None:
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                message = b"".join(self._fragments)
                self._fragments = None
                self.on_message(message)

    def _on_handshake(self, event: Request | Response) -> None:
        raise NotImplementedError

    def _handshake_done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.opened.done():
            self.opened.set_result(None)

    def _expect_close(self) -> None:
        if self._timer is None and self.transport is not None:
            self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_SECONDS, self.abort)


def _drop(_message: bytes) -> None:
    pass


def _ignore(_pressed: bool) -> None:
    pass


class ServerIO(FrameIO):
    """The server side: accepts the opening handshake, then calls ``on_open``.

    ``check_path`` (when given) tells why an upgrade to a path is refused, or None: a refused
    one gets HTTP 404 with that sentence. The accepted path is :attr:`path`.

    A plain HTTP GET (no WebSocket upgrade) goes to ``on_http`` when given; if that takes
    it, the connection carries HTTP/1.1 until :meth:`http_done`: bytes that arrive meanwhile
    wait, and the next request on a kept-alive connection starts a fresh handshake parser.
    """

    def __init__(
        self,
        max_size: int,
        on_open: Callable[[ServerIO], None],
        slots: Slots[ServerIO],
        on_http: HttpHandler | None = None,
        check_path: Callable[[str], str | None] | None = None,
    ) -> None:
        super().__init__(ServerProtocol(max_size=max_size))
        self._max_size = max_size
        self._on_open = on_open
        self._on_http = on_http
        self._check_path = check_path
        #: The request target of the WebSocket upgrade (path and query), once accepted.
        self.path = "/"
        self._held = bytearray()
        #: The server's slots: this socket holds one from connection_made to connection_lost,
        #: a handshake slot until a user logs in on it (:meth:`log_in`), then an established
        #: one. A peer that never logs in only ever competes with other such peers.
        self._slots = slots
        #: The start of a request until websockets takes it, or the whole of one with a body.
        self._head: bytearray | None = bytearray()
        #: After a refusal: how much more of the peer's input is dropped before cutting it.
        self._linger_left: int | None = None
        #: The door the connection serves, for the metrics: an HTTP endpoint that takes a
        #: request sets its own.
        self.door = "websocket"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._slots.open(self, self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._slots.close(self)
        super().connection_lost(exc)

    def _receive(self, data: bytes) -> None:
        if self._linger_left is not None:
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.abort()
            return
        if self._detached:
            self._held += data
            if len(self._held) > HTTP_HELD_BYTES:
                self.pause_reading()
            return
        if self._head is not None:
            data = self._read_head(data)
            if not data:
                return
        super()._receive(data)

    def _read_head(self, data: bytes) -> bytes:
        """Hold bytes until the request's method is known. A GET goes on to websockets (a
        WebSocket handshake or a feed request); any other method is read here, body and all,
        since websockets takes no request body. Returns what to pass on to websockets."""
        assert self._head is not None
        self._head += data
        line, crlf, _rest = self._head.partition(b"\r\n")
        if not crlf and len(self._head) <= REQUEST_LINE_BYTES:
            return b""
        method, _, target_and_version = bytes(line).partition(b" ")
        if not crlf or method == b"GET":
            held, self._head = bytes(self._head), None
            return held  # websockets answers an overlong line itself
        target, _, version = target_and_version.partition(b" ")
        if not method.isalpha() or not target or version not in (b"HTTP/1.1", b"HTTP/1.0"):
            self._refuse(400, "Not an HTTP request.")
            return b""
        head_end = self._head.find(b"\r\n\r\n", 0, REQUEST_HEAD_BYTES)
        if head_end < 0:
            if len(self._head) >= REQUEST_HEAD_BYTES:
                self._refuse(431, "Request headers too large.")
            return b""
        try:
            headers = _parse_headers(bytes(self._head[len(line) + 2 : head_end + 2]))
            length = _content_length(headers)
        except ValueError as exc:
            self._refuse(400, f"{exc}.")
            return b""
        if "Transfer-Encoding" in headers:
            self._refuse(411, "Send the body with a Content-Length.")
            return b""
        if length > self._max_size:
            self._refuse(413, f"The body exceeds {self._max_size} bytes.")
            return b""
        body_start = head_end + 4
        if len(self._head) < body_start + length:
            return b""
        body = bytes(self._head[body_start : body_start + length])
        self._held = bytearray(self._head[body_start + length :])
        self._head = None
        request = Request(
            target.decode("ascii", "replace"),
            headers,
            method.decode("ascii"),
            version.decode("ascii"),
        )
        self._detached = True
        if self._on_http is None or not self._on_http(self, request, body):
            self._detached = False
            self._refuse(405, "Only GET is served here.")
            return b""
        self._handshake_done()
        return b""

    def _refuse(self, status: int, reason: str) -> None:
        """Answer an HTTP request this connection does not serve, then close it."""
        logger.debug("refused an HTTP request from %s: %d", self.peer, status)
        body = (reason + "\n").encode()
        allow = "Allow: GET\r\n" if status == 405 else ""
        self.write_raw(
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n{allow}"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        self._head = None
        self._linger()

    def _linger(self) -> None:
        """Close the connection once the refusal is sent, reading and dropping what the peer
        still sends until it closes too (within ``LINGER_BYTES`` and the handshake's deadline).
        A socket closed with input unread is reset by the kernel, and the peer, still
        sending a body the server did not want, would get the reset instead of the answer."""
        if self.transport is not None and half_close(self.transport):
            self._linger_left = LINGER_BYTES

    def eof_received(self) -> None:
        if self._linger_left is None:
            super().eof_received()
        # else: asyncio closes the transport (the refusal is sent by then, or goes first)

    @property
    def serving_http(self) -> bool:
        """True while an HTTP response is being written on this connection."""
        return self._detached

    def log_in(self) -> bool:
        """A user has logged in on this socket: True when it holds an established slot now (or
        did already). False when they are all taken: the caller refuses the request, and the
        socket keeps its handshake slot until it closes or a newcomer cuts it."""
        return self._slots.establish(self)

    def write_raw(self, data: bytes) -> None:
        """Write bytes as they are (an HTTP response)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def http_done(self, keep_alive: bool) -> None:
        """The HTTP response is complete: read the next request on this connection, or close."""
        if not self._detached:
            return
        if not keep_alive or self.transport is None or self.transport.is_closing():
            if self.transport is not None:
                self.transport.close()
            return
        self._detached = False
        self.ws = ServerProtocol(max_size=self._max_size)
        self._head = bytearray()
        held, self._held = bytes(self._held), bytearray()
        self.resume_reading()
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_SECONDS, self.abort)
        if held:
            self.data_received(held)

    def _on_handshake(self, event: Request | Response) -> None:
        assert isinstance(self.ws, ServerProtocol)
        assert isinstance(event, Request)
        if self._on_http is not None and "upgrade" not in event.headers:
            self._detached = True
            if self._on_http(self, event, b""):
                self._handshake_done()
                return
            self._detached = False
        response = self.ws.accept(event)
        if response.status_code == 101 and self._check_path is not None:
            refusal = self._check_path(event.path)
            if refusal is not None:
                response = self.ws.reject(HTTPStatus.NOT_FOUND, refusal + "\n")
        self.ws.send_response(response)
        if response.status_code == 101:
            self.path = event.path
            self._handshake_done()
            self._on_open(self)
        else:
            logger.debug("refused a handshake from %s: %s", self.peer, self.ws.handshake_exc)


def _parse_headers(raw: bytes) -> Headers:
    headers = Headers()
    for line in raw.split(b"\r\n"):
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise ValueError("Malformed header line")
        headers[name.decode("ascii")] = value.strip(b" \t").decode("latin-1")
    return headers


def _content_length(headers: Headers) -> int:
    values = headers.get_all("Content-Length")
    if not values:
        return 0
    if len(set(values)) != 1 or not re.fullmatch(r"[0-9]{1,12}", values[0]):
        raise ValueError("Bad Content-Length")
    return int(values[0])


class ClientIO(FrameIO):
    """The client side: sends the opening handshake as soon as TCP is up."""

    def __init__(self, uri: str, max_size: int) -> None:
        super().__init__(ClientProtocol(parse_uri(uri), max_size=max_size))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(self.ws, ClientProtocol)
        self.ws.send_request(self.ws.connect())
        self._flush()

    def _on_handshake(self, event: Request | Response) -> None:
        if self.ws.handshake_exc is not None:
            if not self.opened.done():
                self.opened.set_exception(self.ws.handshake_exc)
            self.abort()
        else:
            self._handshake_done()


async def open_client(
    uri: str,
    *,
    max_size: int,
    ssl_context: ssl.SSLContext | None = None,
    open_timeout: float = 10.0,
) -> ClientIO:
    """Connect and complete the opening handshake. Raises OSError, TimeoutError or
    InvalidHandshake/InvalidURI (from websockets)."""
    parsed = parse_uri(uri)
    loop = asyncio.get_running_loop()
    context = (ssl_context or ssl.create_default_context()) if parsed.secure else None
    async with asyncio.timeout(open_timeout):
        _transport, protocol = await loop.create_connection(
            lambda: ClientIO(uri, max_size), parsed.host, parsed.port, ssl=context
        )
        await protocol.opened
    return protocol


__all__ = [
    "ClientIO",
    "ConnectionClosedError",
    "FrameIO",
    "InvalidHandshake",
    "InvalidURI",
    "ServerIO",
    "open_client",
]
