"""The HTTP feed endpoint: plain GETs on the WebSocket port, under the feed's path.

Requests arrive through :class:`futoin_evt.wsio.ServerIO` (the same port and TLS as the
WebSocket endpoint). Each response is HTTP/1.1; an events response is streamed with chunked
transfer encoding, waiting for the peer to read between chunks, and the connection is kept
alive for the next request unless the client asks to close it.

Authentication is HTTP Basic with the server's users: 401 without valid credentials, 403
when the channel is neither TLS nor loopback nor trusted, or when the user lacks the read
right on the stream (:func:`refused_text`: the same for a name that names no stream, unless
the user holds some right on that name, who gets 404).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final
from urllib.parse import parse_qs, quote, urlsplit

from websockets.http11 import Request

from ..auth.users import Authenticator
from ..domain.partition import DEFAULT_STREAM
from ..domain.principal import NotAuthenticated, Principal
from ..feed.service import Discovery, FeedError, FeedService, parse_feed_request
from ..log.errors import Fault, fault_of
from ..slots import TOO_MANY_CONNECTIONS
from ..stats import CONNECTION, INSECURE_CHANNEL, Calls
from ..wsio import ServerIO
from .executor import peer_host

logger = logging.getLogger(__name__)

#: What a ``Location`` keeps as it is; anything else is percent-encoded (``%`` is kept: the
#: value may be encoded already).
LOCATION_SAFE: Final = "/:?#[]@!$&'()*+,;=%-._~"
#: What a header value cannot hold: control characters but tab (CR and LF among them), and
#: anything beyond Latin-1.
_NOT_IN_HEADER: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f\u0100-\U0010ffff]")

DEFAULT_FEED_PATH = "/feed"
#: Each stream's feed is under this path: ``/feeds/NAME``.
STREAM_FEEDS_PATH = "/feeds"


@dataclass(frozen=True)
class FeedConfig:
    #: Where the feed of the stream ``events`` is served; None: no HTTP feed (of any stream).
    path: str | None = DEFAULT_FEED_PATH


class HeaderRefused(ValueError):
    """A response header whose value a header cannot carry (CR, LF, another control
    character, or a character beyond Latin-1): nothing is sent, the request is answered 500."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the response's {name} header holds a character a header cannot carry")
        self.name = name


def header_line(name: str, value: str) -> str:
    """``name: value``, once the value is one a header can carry (:class:`HeaderRefused`
    otherwise); a ``Location`` is percent-encoded first."""
    if name.lower() == "location":
        try:
            value = quote(value, safe=LOCATION_SAFE)
        except UnicodeEncodeError:  # a lone surrogate
            raise HeaderRefused(name) from None
    if _NOT_IN_HEADER.search(value) is not None:
        raise HeaderRefused(name)
    return f"{name}: {value}"


class Exchange:
    """One HTTP response on a connection taken over from the WebSocket handshake. A header
    is data: a value with a line break or beyond Latin-1 is refused (:func:`header_line`)
    before anything is sent."""

    def __init__(self, io: ServerIO, keep_alive: bool, chunked: bool = True) -> None:
        self._io = io
        #: HTTP/1.0 has no chunked encoding: a stream ends when the connection closes.
        self._chunked = chunked
        self._keep_alive = keep_alive and chunked
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    def _head(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
        lines += [header_line(name, value) for name, value in headers]
        if not self._keep_alive:
            lines.append("Connection: close")
        self._started = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        head = self._head(
            status,
            [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers],
        )
        self._io.write_raw(head + body)
        self._io.http_done(self._keep_alive)

    def start_stream(self, content_type: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        headers = [("Content-Type", content_type), *headers]
        if self._chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        self._io.write_raw(self._head(200, headers))

    async def write(self, data: bytes) -> None:
        """One chunk; waits while the peer has not read what was sent before."""
        if self._io.closed.done():
            raise ConnectionResetError("the client went away")
        self._io.write_raw(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        await self._io.drain()

    def end_stream(self) -> None:
        if self._chunked:
            self._io.write_raw(b"0\r\n\r\n")
        self._io.http_done(self._keep_alive)

    def abort(self) -> None:
        self._io.abort()


class HttpError(Exception):
    """A request refused with an HTTP status; ``body`` is sent as it is (plain text unless
    ``content_type`` says otherwise)."""

    def __init__(
        self, status: int, message: str, body: bytes | None = None, content_type: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body if body is not None else (message + "\n").encode()
        self.content_type = content_type or "text/plain; charset=utf-8"


#: What the HTTP doors answer for each kind of failure of the log (:mod:`futoin_evt.log.errors`):
#: the status and the error's name (:meth:`HttpEndpoint.fault_error` says it in the door's form).
HTTP_FAULTS: Final[dict[Fault, tuple[int, str]]] = {
    Fault.UNAUTHENTICATED: (401, "Unauthorized"),
    Fault.REFUSED: (403, "AccessDenied"),
    Fault.BAD_INPUT: (400, "InvalidRequest"),
    Fault.NOT_WRITABLE: (400, "NotWritable"),
    Fault.CONDITION_FAILED: (409, "AppendConditionFailed"),
    Fault.ID_CONFLICT: (409, "EventIdConflict"),
    Fault.UNAVAILABLE: (503, "Unavailable"),
    Fault.DAMAGED: (500, "DamagedEvent"),
}


class HttpEndpoint:
    """Plain HTTP requests under one path, each served by a task of its own.

    Subclasses implement :meth:`handle`. Refusals are :class:`HttpError`; a failure of the log
    is answered by its kind (:data:`HTTP_FAULTS`) with its sentence (a refusal that comes once
    the answer started cuts it short); anything else is logged and answered 500.
    """

    #: Methods served; others get 405.
    methods: tuple[str, ...] = ("GET",)
    #: What the 401 challenge names.
    realm = "futoin-evt"
    #: The door, for the metrics and log lines.
    door = "feed"

    def __init__(
        self, path: str, authenticator: Authenticator, secure: Callable[[ServerIO], bool]
    ) -> None:
        #: The path served, without a trailing slash.
        self.path = path.rstrip("/") or "/"
        self._auth = authenticator
        self._secure = secure
        self._tasks: set[asyncio.Task[None]] = set()
        #: Set when the server shuts down: waiting responses end at once.
        self.closing = asyncio.Event()
        #: Requests by function and HTTP status, with their latency (metrics).
        self.calls = Calls(self.door)

    def serves(self, path: str) -> bool:
        """True for the paths this endpoint takes."""
        return _under(path, self.path)

    def take(self, io: ServerIO, request: Request, body: bytes) -> bool:
        """Called for each plain HTTP request; True when this endpoint serves it."""
        if not self.serves(urlsplit(request.path).path):
            return False
        task = asyncio.create_task(self._serve(io, request, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def close(self, deadline: float) -> None:
        """End waiting responses, let the ones being written go on until ``deadline`` (loop
        time), then cut them off (a client that stopped reading must not hold up shutdown)."""
        self.closing.set()
        if not self._tasks:
            return
        timeout = max(deadline - asyncio.get_running_loop().time(), 0.0)
        _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def subpath(self, request: Request) -> str:
        """What follows the endpoint's path: ``""``, ``"/events"``..."""
        path = urlsplit(request.path).path
        return path[len(self.path) :] if self.path != "/" else path

    async def handle(
        self, io: ServerIO, request: Request, body: bytes, exchange: Exchange
    ) -> int | None:
        """Serve the request; the status sent when it is not 200 (for the metrics)."""
        raise NotImplementedError

    async def _serve(self, io: ServerIO, request: Request, body: bytes) -> None:
        started = time.perf_counter()
        logger.debug("HTTP request from %s (%s)", io.peer, self.door)
        CONNECTION.set((self.door, io.peer, None))
        io.door = self.door
        status = await self._serve_counted(io, request, body)
        seconds = time.perf_counter() - started
        self.calls.observe(self.door, self.function(request), str(status), seconds)

    def function(self, request: Request) -> str:
        """What the request does, as the metrics' function label (a fixed set)."""
        return "read"

    async def _serve_counted(self, io: ServerIO, request: Request, body: bytes) -> int:
        """Serve the request; returns its HTTP status (0: cut short)."""
        keep_alive = (
            request.method in self.methods
            and request.headers.get("Connection", "").lower() != "close"
        )
        exchange = Exchange(
            io, keep_alive and not self.closing.is_set(), request.protocol == "HTTP/1.1"
        )
        try:
            if request.method not in self.methods:
                raise HttpError(405, f"This path serves {', '.join(self.methods)} only.")
            status = await self.handle(io, request, body, exchange)
        except HttpError as exc:
            if exchange.started:
                exchange.abort()  # the status line is out: cut the response short
                return 0
            exchange.respond(
                exc.status, exc.body, exc.content_type, headers=self._error_headers(exc)
            )
            return exc.status
        except (ConnectionError, asyncio.CancelledError):
            exchange.abort()
            return 0
        except HeaderRefused as exc:  # a bug of ours: said with its request, no traceback
            logger.error(
                "HTTP %s %s (%s): %s", request.method, _shown(request.path), self.door, exc
            )
            if exchange.started:
                exchange.abort()
                return 0
            exchange.respond(500, (str(exc)[:1].upper() + str(exc)[1:] + ".\n").encode())
            return 500
        except Exception as exc:
            fault = fault_of(exc)
            if fault is None:
                logger.exception("HTTP request %s failed", request.path[:200])
            if exchange.started:  # the status line is out: cut the response short
                exchange.abort()
                return 0
            if fault is None:
                exchange.respond(500, b"Internal error.\n")
                return 500
            if fault is Fault.UNAVAILABLE:
                logger.warning(
                    "HTTP %s (%s): database unavailable: %s", _shown(request.path), self.door, exc
                )
            status, name = HTTP_FAULTS[fault]
            error = self.fault_error(status, name, exc)
            exchange.respond(
                error.status, error.body, error.content_type, headers=self._error_headers(error)
            )
            return error.status
        return status or 200

    async def authorize(self, io: ServerIO, request: Request) -> Principal:
        """The caller, from HTTP Basic credentials over a secure channel."""
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            raise HttpError(401, "Credentials required (HTTP Basic).")
        try:
            credentials = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise HttpError(401, "Malformed Basic credentials.") from None
        if not self._secure(io):
            self._auth.refusals.note(self.door, INSECURE_CHANNEL)
            raise HttpError(403, "Credentials are accepted only over TLS or loopback.")
        try:
            principal = await self._auth.authenticate(credentials, peer_host(io.peer))
        except NotAuthenticated as exc:
            raise HttpError(401, f"{exc}.") from None
        CONNECTION.set((self.door, io.peer, principal.name))
        if not io.log_in():
            raise HttpError(503, TOO_MANY_CONNECTIONS.capitalize() + ".")
        return principal

    def fault_error(self, status: int, name: str, exc: Exception) -> HttpError:
        """How this door says a failure of the log (:data:`HTTP_FAULTS` gives ``status`` and
        the error's ``name``): its sentence in plain text; a door with error documents
        answers its own form."""
        return HttpError(status, refused_text(exc))

    def _error_headers(self, exc: HttpError) -> list[tuple[str, str]]:
        if exc.status == 401:
            return [("WWW-Authenticate", f'Basic realm="{self.realm}", charset="UTF-8"')]
        if exc.status == 405:
            return [("Allow", ", ".join(self.methods))]
        return []


def refused_text(exc: Exception) -> str:
    """A failure of ``log/`` (a refusal, a damaged event, ...) as an HTTP door says it: one
    sentence, capitalised, with its full stop (``The read right on stream payroll is needed.``)."""
    text = str(exc)
    return text[:1].upper() + text[1:] + "."


def _shown(path: str) -> str:
    """A request's path as a log line shows it: 200 characters at most, escapes for the rest."""
    return path[:200].encode("unicode_escape").decode("ascii")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


class FeedEndpoint(HttpEndpoint):
    """The HTTP feeds: GETs under the feed's path (the stream ``events``) and under
    ``/feeds/NAME`` (each stream), served by :class:`FeedService`."""

    realm = "futoin-evt feed"

    def __init__(
        self,
        feed: FeedService,
        authenticator: Authenticator,
        config: FeedConfig,
        secure: Callable[[ServerIO], bool],
    ) -> None:
        assert config.path is not None
        super().__init__(config.path, authenticator, secure)
        self._feed = feed
        self.closing = feed.closing

    async def handle(
        self, io: ServerIO, request: Request, _body: bytes, exchange: Exchange
    ) -> None:
        try:
            await self._handle(io, request, exchange)
        except FeedError as exc:
            raise HttpError(exc.status, exc.message) from None

    async def _handle(self, io: ServerIO, request: Request, exchange: Exchange) -> None:
        principal = await self.authorize(io, request)
        url = urlsplit(request.path)
        name, subpath = self._stream_path(request)
        feed = self._feed.feed(principal, name)
        query = parse_qs(url.query, keep_blank_values=True)
        parsed = parse_feed_request(subpath, query, feed.stream, feed.token)
        if isinstance(parsed, Discovery):
            exchange.respond(200, self._feed.discovery(feed), "application/json")
            return
        readings = await self._feed.start_after(principal, feed, parsed)
        if parsed.wait_seconds:  # a long poll has its 200 before it waits
            exchange.start_stream("application/x-ndjson")

        async def write(lines: bytes) -> None:
            """Else the 200 goes out with the first lines: a first read that fails (a
            damaged event) is still answered with its status."""
            if not exchange.started:
                exchange.start_stream("application/x-ndjson")
            await exchange.write(lines)

        await self._feed.events(parsed, readings, write)
        exchange.end_stream()

    def serves(self, path: str) -> bool:
        return super().serves(path) or _under(path, STREAM_FEEDS_PATH)

    def _stream_path(self, request: Request) -> tuple[str, str]:
        """(stream name, what follows the stream's feed path)."""
        path = urlsplit(request.path).path
        if not _under(path, STREAM_FEEDS_PATH):
            return DEFAULT_STREAM, self.subpath(request)
        name, slash, rest = path[len(STREAM_FEEDS_PATH) + 1 :].partition("/")
        if not name:
            raise FeedError(404, f"Name a stream: {STREAM_FEEDS_PATH}/NAME.")
        return name, slash + rest
