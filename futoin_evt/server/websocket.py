"""FTN3 over WebSocket: the asyncio server, many calls in flight per connection.

Calls run concurrently and reply in any order as they finish; replies finished in the same
loop turn leave in one write. At ``max_calls_in_flight`` the connection is not read until a
call finishes (backpressure instead of unbounded work); a peer that leaves more than
``max_unread_bytes`` unread is disconnected. Replies are binary frames of UTF-8 JSON, as
the official FutoIn peers send them.

A frame that is not an FTN3 message with a usable ``rid`` cannot be answered: nothing after
it is read, the calls read before it are answered (within ``drain_seconds``), then the
connection is closed with code 1008 and the reason, and a log line is written. Messages over
``max_frame_bytes`` close the connection with code 1009. Other connections never notice.

A plain ``GET /`` (no upgrade) is answered with a small HTML page linking what else the port
serves (:attr:`WebSocketTransport.home_links`), instead of the WebSocket library's "You
cannot access a WebSocket server directly with a browser"; it is handled with the other plain
HTTP requests, before any connection is open, never on the frame path.
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import itertools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, cast

from websockets.http11 import Request

from ..domain.management import CONNECTION_CLOSED, CONNECTION_OPENED, ManagementBus
from ..domain.principal import Principal
from ..ftn3.calls import Routes
from ..ftn3.errors import FTN3Error, ProtocolViolation, RefusedMessage
from ..ftn3.messages import Response, decode_frame, encode_error, parse_request, parse_response
from ..log.connections import Connections
from ..slots import TOO_MANY_CONNECTIONS, WEBSOCKET_CELL, GroupShare, SharedCount, Slots
from ..stats import CONNECTION
from ..wsio import ConnectionClosedError, HttpHandler, ServerIO
from .executor import Channel, Executor

logger = logging.getLogger(__name__)

CLOSE_POLICY_VIOLATION: Final = 1008
CLOSE_GOING_AWAY: Final = 1001
CLOSE_TRY_AGAIN_LATER: Final = 1013
#: The door's name in the list of open connections.
FTN3_DOOR: Final = "FTN3 over WebSocket"


@dataclass(frozen=True, slots=True)
class Limits:
    #: Frames above this close the connection (1009); per-function limits apply below it.
    max_frame_bytes: int = 1024 * 1024
    #: Connections past their handshake at once; more are refused in it with HTTP 503.
    max_connections: int = 10_000
    #: Sockets still in their handshake, on top of those; when they are all taken, the
    #: oldest is closed for a new one. None: a quarter of max_connections (at least 8).
    max_handshakes: int | None = None
    #: Requests run at once per connection; above it the connection is not read.
    max_calls_in_flight: int = 256
    #: A peer that leaves more than this of replies and pushes unread is disconnected.
    max_unread_bytes: int = 64 * 1024 * 1024
    #: How long shutdown, or a close for an unanswerable frame, waits for calls in flight.
    drain_seconds: float = 10.0


DEFAULT_LIMITS: Final = Limits()


@dataclass(frozen=True, slots=True)
class TransportConfig:
    host: str = "127.0.0.1"
    port: int = 8480
    tls: ssl.SSLContext | None = None
    #: Plain ws from any peer counts as secure (a TLS-terminating proxy is in front).
    trust_channel: bool = False
    limits: Limits = field(default=DEFAULT_LIMITS)
    #: Share the port with the other workers of a group (SO_REUSEPORT).
    reuse_port: bool = False
    #: This worker's place in the group whose limits these are (``serve --workers``).
    group: GroupShare | None = None


def home_page(links: Sequence[tuple[str, str, str]]) -> bytes:
    """``GET /``: what this port serves, as (title, path, what it is) links."""
    items = "".join(
        f'<li><a href="{html.escape(path)}">{html.escape(title)}</a>: {html.escape(what)}</li>\n'
        for title, path, what in links
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>futoin-evt</title></head>\n<body><h1>futoin-evt</h1>\n"
        "<p>An event stream server. FTN18 clients connect to this address with WebSocket"
        " (<code>ws://</code> or <code>wss://</code>); a browser finds here:</p>\n"
        f"<ul>\n{items}</ul>\n</body></html>\n"
    ).encode()


def _answer_home(io: ServerIO, request: Request, page: bytes) -> bool:
    """Answer ``GET /`` (or ``HEAD /``) with ``page`` and close; False for other requests."""
    method = request.method
    if request.path.partition("?")[0] != "/" or method not in ("GET", "HEAD"):
        return False
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(page)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    ).encode()
    io.write_raw(head if method == "HEAD" else head + page)
    io.http_done(False)
    return True


class PathRoutes(Protocol):
    """Which routes serve a WebSocket path (see :class:`~futoin_evt.ftn18.doors.PartitionDoors`)."""

    def refusal(self, path: str) -> str | None:
        """Why an upgrade to ``path`` is refused (HTTP 404 with it), or None."""

    def open(self, path: str) -> Routes[Principal]:
        """The routes of an accepted connection to ``path``."""


def _ignore_message(_frame: bytes) -> None:
    pass


def _expire(reply: asyncio.Future[Response]) -> None:
    if not reply.done():
        reply.set_exception(TimeoutError("no reply in time"))


def is_loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except (TypeError, ValueError, IndexError):
        return False


class _Connection:
    """The FTN3 side of one server connection."""

    def __init__(
        self, io: ServerIO, executor: Executor, limits: Limits, listed: Connections | None = None
    ):
        self.io = io
        self._executor = executor
        self.channel = Channel(peer=io.peer, secure=False)
        self._max_calls = limits.max_calls_in_flight
        self._max_unread = limits.max_unread_bytes
        self._drain_seconds = limits.drain_seconds
        self._writable_listeners: set[Callable[[], None]] = set()
        self._in_flight = 0
        self._draining = False
        #: The reason of a close for an unanswerable frame, until it is sent.
        self._violation: str | None = None
        self._violation_timer: asyncio.TimerHandle | None = None
        #: A call was refused for want of an established slot: the connection is closing.
        self._refused = False
        #: Where the connection is listed once a user logged in (None: not listed).
        self._listed = listed
        self._idle = asyncio.Event()
        self._idle.set()
        self._peer_rids = itertools.count(1)
        self._peer_calls: dict[str, asyncio.Future[Response]] = {}
        io.on_message = self._on_message
        io.on_write_pressure = self._on_write_pressure
        io.closed.add_done_callback(self._on_closed)

    def _on_message(self, frame: bytes) -> None:
        try:
            msg = decode_frame(frame)
        except RefusedMessage as exc:
            if exc.rid[0] != "C":
                self._close_for(exc)
            elif self.io.is_open and not self._draining:
                self.io.send(encode_error(exc.rid, exc.name, exc.desc))
                self._check_unread()
            return
        except ProtocolViolation as exc:
            self._close_for(exc)
            return
        if msg["rid"][0] != "C":
            self._on_peer_reply(msg)
            return
        if self._draining:
            return  # shutting down: unanswered, the caller knows it was not done
        self._in_flight += 1
        self._idle.clear()
        if self._in_flight >= self._max_calls:
            self.io.pause_reading()
        try:
            request = parse_request(msg)
        except FTN3Error as exc:
            self._respond(encode_error(msg["rid"], exc.name, exc.desc))
            return
        self._executor.dispatch(request, len(frame), self.channel, self._respond)

    def log_in(self) -> bool:
        """A user made a call: the socket moves to an established slot, or, when those are
        all taken, the connection is closed with 1013 (try again later)."""
        if self.io.log_in():
            return True
        self._refused = True  # closed once the refusal is sent
        return False

    def first_log_in(self) -> bool:
        """:meth:`log_in`, listing the connection in ``_listed`` the first time it admits a
        user; the channel's ``log_in`` is then :meth:`log_in` itself (nothing more per call)."""
        if not self.log_in():
            return False
        listed, self._listed = self._listed, None
        if listed is not None:
            served = CONNECTION.get()  # the executor's, set for this call: (door, peer, user)
            user = served[2] if served is not None else None
            key = listed.add(
                FTN3_DOOR,
                user or "",
                self.channel.peer,
                self.close_refused,
                self.calls_in_flight,
            )
            self.io.closed.add_done_callback(lambda _closed: listed.remove(key))
            self.channel = replace(self.channel, log_in=self.log_in)
        return True

    def calls_in_flight(self) -> int:
        return self._in_flight

    def _close_for(self, violation: ProtocolViolation) -> None:
        logger.warning("closing connection from %s: %s", self.channel.peer, violation)
        self._close_after_calls(str(violation))

    def close_refused(self, reason: str) -> None:
        """PeerLink: what the peer lost (a right revoked, a stream dropped) ends its
        connection, saying why."""
        if self._violation is None and self.io.is_open:
            logger.info("closing connection from %s: %s", self.channel.peer, reason)
            self._close_after_calls(reason)

    def _close_after_calls(self, reason: str) -> None:
        """Read nothing more; close with 1008 and ``reason`` once the calls in flight have
        replied (or ``drain_seconds`` have passed)."""
        self.io.on_message = _ignore_message
        self._draining = True  # no call is taken, and replies do not resume reading
        self._violation = reason[:120]
        if not self._in_flight:
            self._close_for_violation()
            return
        self.io.pause_reading()
        self._violation_timer = asyncio.get_running_loop().call_later(
            self._drain_seconds, self._close_for_violation
        )

    def _close_for_violation(self) -> None:
        if self._violation_timer is not None:
            self._violation_timer.cancel()
            self._violation_timer = None
        reason, self._violation = self._violation, None
        if reason is None:
            return
        if self._in_flight:
            logger.warning("%d calls unanswered from %s", self._in_flight, self.channel.peer)
        self.io.close(CLOSE_POLICY_VIOLATION, reason)

    def _respond(self, reply: bytes) -> None:
        self._in_flight -= 1
        if self.io.is_open:
            self.io.send(reply)
            self._check_unread()
            if self._refused:
                self.io.close(CLOSE_TRY_AGAIN_LATER, TOO_MANY_CONNECTIONS)
        if self._in_flight < self._max_calls and not self._draining:
            self.io.resume_reading()
        if not self._in_flight:
            self._idle.set()
            if self._violation is not None:
                self._close_for_violation()

    def _check_unread(self) -> None:
        """Reading stays on (so a close is always seen); a peer that leaves too much unread
        is dropped instead. Pushes wait for room, so this catches replies piling up."""
        unread = self.io.write_buffer_size()
        if unread > self._max_unread:
            logger.warning("dropping %s: %d bytes unread", self.channel.peer, unread)
            self.io.abort()

    def _on_write_pressure(self, pressed: bool) -> None:
        if not pressed:
            for listener in list(self._writable_listeners):
                listener()

    # -- requests to the peer (PeerLink) -------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.io.is_open

    def on_writable(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._writable_listeners.add(callback)
        return lambda: self._writable_listeners.discard(callback)

    @property
    def closed(self) -> asyncio.Future[None]:
        return self.io.closed

    @property
    def writable(self) -> bool:
        return self.io.writable

    def request(
        self, f: str, params_json: str, timeout: float, *, now: bool = False
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Response] = loop.create_future()
        if not self.io.is_open:
            reply.set_exception(ConnectionClosedError("the connection is closed"))
            return reply
        rid = f"S{next(self._peer_rids)}"
        self._peer_calls[rid] = reply
        self.io.send(f'{{"f":"{f}","p":{params_json},"rid":"{rid}"}}'.encode())
        if now:
            self.io.flush()
        self._check_unread()
        timer = loop.call_later(timeout, _expire, reply)

        def forget(_reply: asyncio.Future[Response]) -> None:
            timer.cancel()
            self._peer_calls.pop(rid, None)

        reply.add_done_callback(forget)
        return reply

    def abort(self) -> None:
        self.io.abort()

    def _on_peer_reply(self, msg: dict[str, Any]) -> None:
        reply = self._peer_calls.get(msg["rid"])
        if reply is None or reply.done():
            logger.debug("unexpected reply %s from %s", msg["rid"], self.channel.peer)
            return
        reply.set_result(parse_response(msg))

    def _on_closed(self, _closed: asyncio.Future[None]) -> None:
        if self._violation_timer is not None:
            self._violation_timer.cancel()
        for reply in list(self._peer_calls.values()):
            if not reply.done():
                reply.set_exception(ConnectionClosedError("the connection closed"))

    async def wait_closed(self) -> None:
        """Until the peer is gone and every call it started has finished."""
        await self.io.closed
        await self._idle.wait()

    async def drain(self, deadline: float) -> None:
        """Stop taking requests, let those in flight reply, then close; by ``deadline`` (loop
        time) the connection is gone, whatever the peer does."""
        self._draining = True
        try:
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        except TimeoutError:
            logger.warning("%d calls still running at shutdown", self._in_flight)
        self.io.close(CLOSE_GOING_AWAY, "server shutting down")
        try:
            async with asyncio.timeout_at(deadline):
                await self.io.closed
        except TimeoutError:
            self.io.abort()


class WebSocketTransport:
    """Serves an :class:`Executor` over WebSocket. ``async with`` or start()/close()."""

    def __init__(self, executor: Executor, config: TransportConfig = TransportConfig()) -> None:
        self._executor = executor
        self._config = config
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        #: Plain HTTP requests go here (the feed, DCB); False for those it does not serve.
        self.http_handler: HttpHandler | None = None
        #: What ``GET /`` links to: (title, path, what it is); set before :meth:`start`.
        self.home_links: list[tuple[str, str, str]] = []
        limits = config.limits
        group = config.group
        #: Every open socket, in a handshake slot or an established one.
        self.slots: Slots[ServerIO] = Slots(
            "WebSocket/HTTP port",
            limits.max_connections,
            limits.max_handshakes,
            shared=SharedCount(group, WEBSOCKET_CELL) if group is not None else None,
        )
        #: Told of FTN3 connections opening and closing (management events), when set.
        self.notices: ManagementBus | None = None
        #: Which routes a path reaches (the FTN18 door per partition); None: no path serves
        #: any call.
        self.doors: PathRoutes | None = None
        #: Where connections are listed once their user logs in (the console's page), if set.
        self.connections: Connections | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        limits = self._config.limits
        http_handler = self._with_home(self.http_handler)
        self._server = await loop.create_server(
            lambda: ServerIO(
                limits.max_frame_bytes,
                self._on_open,
                self.slots,
                http_handler,
                self.doors.refusal if self.doors is not None else None,
            ),
            self._config.host,
            self._config.port,
            ssl=self._config.tls,
            reuse_port=self._config.reuse_port or None,
        )

    def _with_home(self, handler: HttpHandler | None) -> HttpHandler:
        """``handler``, with ``GET /`` answered by :func:`home_page` first."""
        page = home_page(self.home_links)

        def serve(io: ServerIO, request: Request, body: bytes) -> bool:
            if _answer_home(io, request, page):
                return True
            return handler is not None and handler(io, request, body)

        return serve

    @property
    def limits(self) -> Limits:
        return self._config.limits

    @property
    def serving(self) -> bool:
        """The port accepts connections."""
        return self._server is not None and self._server.is_serving()

    def is_secure(self, io: ServerIO) -> bool:
        """TLS, a loopback peer, or a channel the operator said to trust (FTN3 SecureChannel)."""
        assert io.transport is not None
        peer = io.transport.get_extra_info("peername")
        return self._config.tls is not None or self._config.trust_channel or is_loopback(peer)

    @property
    def open_sockets(self) -> int:
        """Sockets open now, in a handshake or past it."""
        return len(self.slots)

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        # Any: uvloop's sockets are a list, not the stubs' tuple (a compiled build checks)
        return int(cast(Any, self._server).sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        scheme = "wss" if self._config.tls else "ws"
        host = self._config.host
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}/"

    def _on_open(self, io: ServerIO) -> None:
        connection = _Connection(io, self._executor, self._config.limits, self.connections)
        channel = Channel(
            peer=io.peer,
            secure=self.is_secure(io),
            link=connection,
            log_in=connection.log_in if self.connections is None else connection.first_log_in,
            routes=self.doors.open(io.path) if self.doors is not None else None,
        )
        connection.channel = channel
        self._connections.add(connection)
        logger.debug("connection from %s", channel.peer)
        notices = self.notices
        if notices is not None:
            notices.publish(CONNECTION_OPENED, transport="ws", peer=channel.peer, user=None)
        watcher = asyncio.create_task(connection.wait_closed())
        self._watchers.add(watcher)

        def forget(task: asyncio.Task[None]) -> None:
            self._watchers.discard(task)
            self._connections.discard(connection)
            if notices is not None:
                notices.publish(
                    CONNECTION_CLOSED, transport="ws", peer=channel.peer, user=None, reason=None
                )

        watcher.add_done_callback(forget)

    async def close(self, deadline: float | None = None) -> None:
        """Stop accepting, let calls in flight finish and reply, then close every connection.

        Everything is over by ``deadline`` (loop time; default: ``drain_seconds`` from now).
        Calls still running then go on to their end (a queued write still commits), but
        their connections are gone, so nothing is acknowledged that was not done.
        """
        if self._server is None:
            return
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self._config.limits.drain_seconds
        self._server.close()
        self._abort_idle()
        await asyncio.gather(*(c.drain(deadline) for c in list(self._connections)))
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.gather(*self._watchers)  # calls of peers that left earlier, too
        except TimeoutError:
            logger.warning("%d connections had calls running at shutdown", len(self._watchers))
        self._abort_idle()
        await self._server.wait_closed()
        self._server = None

    def _abort_idle(self) -> None:
        """Cut sockets that carry neither a WebSocket nor an HTTP response (a handshake not
        yet complete, a kept-alive HTTP connection between requests)."""
        websockets = {c.io for c in self._connections}
        for io in self.slots:
            if io not in websockets and not io.serving_http:
                io.abort()

    def abort_all(self) -> None:
        """Cut every socket still open (the last step of a shutdown)."""
        for io in self.slots:
            io.abort()
