"""FTN3 over WebSocket: the asyncio server, one reader task and many calls per connection.

Each connection reads frames in one loop and runs every request as its own task, so calls
finish and reply in any order. At ``max_calls_in_flight`` the loop stops reading until a call
finishes (backpressure instead of unbounded tasks). Replies always go out as binary frames of
UTF-8 JSON, as the official FutoIn peers send them.

A frame that is not an FTN3 message with a usable ``rid`` cannot be answered: the connection
is closed with code 1008 and the reason, and a log line is written. Frames over
``max_frame_bytes`` are refused by websockets with close code 1009. Other connections never
notice either.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any, Final

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ..ftn3.errors import FTN3Error, ProtocolViolation
from ..ftn3.messages import decode_frame, encode_error, parse_request
from .executor import Channel, Executor

log = logging.getLogger(__name__)

CLOSE_POLICY_VIOLATION: Final = 1008
CLOSE_GOING_AWAY: Final = 1001


@dataclass(frozen=True, slots=True)
class Limits:
    #: Frames above this close the connection (1009); per-function limits apply below it.
    max_frame_bytes: int = 1024 * 1024
    #: Requests run at once per connection; above it the connection is not read.
    max_calls_in_flight: int = 256
    #: How long shutdown waits for calls in flight.
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


def is_loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except (TypeError, ValueError, IndexError):
        return False


class _Connection:
    def __init__(self, ws: ServerConnection, executor: Executor, channel: Channel, limits: Limits):
        self.ws = ws
        self._executor = executor
        self._channel = channel
        self._slots = asyncio.Semaphore(limits.max_calls_in_flight)
        self._calls: set[asyncio.Task[None]] = set()
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def run(self) -> None:
        try:
            async for frame in self.ws:
                if self._draining:
                    continue  # shutting down: unanswered, the caller knows it was not done
                try:
                    msg = decode_frame(frame)
                except ProtocolViolation as exc:
                    log.warning("closing connection from %s: %s", self._channel.peer, exc)
                    await self.ws.close(CLOSE_POLICY_VIOLATION, str(exc)[:120])
                    break
                if msg["rid"][0] != "C":
                    log.debug("unexpected reply %s from %s", msg["rid"], self._channel.peer)
                    continue
                await self._slots.acquire()
                size = (
                    len(frame)
                    if isinstance(frame, bytes) or frame.isascii()
                    else len(frame.encode())
                )
                task = asyncio.create_task(self._serve(msg, size))
                self._calls.add(task)
                self._idle.clear()
                task.add_done_callback(self._call_done)
        except ConnectionClosed:
            pass
        finally:
            # Calls in flight finish (their writes are durable); their replies may be lost.
            await self._idle.wait()

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self._calls.discard(task)
        self._slots.release()
        if not self._calls:
            self._idle.set()

    async def _serve(self, msg: dict[str, Any], size: int) -> None:
        try:
            request = parse_request(msg)
        except FTN3Error as exc:
            reply = encode_error(msg["rid"], exc.name, exc.desc)
        else:
            reply = await self._executor.call(request, size, self._channel)
        try:
            await self.ws.send(reply)
        except ConnectionClosed:
            log.debug("reply to %s lost: connection closed", msg["rid"])

    async def drain(self, grace_seconds: float) -> None:
        """Stop taking requests, let those in flight reply, then close."""
        self._draining = True
        try:
            async with asyncio.timeout(grace_seconds):
                await self._idle.wait()
        except TimeoutError:
            log.warning("%d calls still running at shutdown", len(self._calls))
        await self.ws.close(CLOSE_GOING_AWAY, "server shutting down")


class WebSocketTransport:
    """Serves an :class:`Executor` over WebSocket. ``async with`` or start()/close()."""

    def __init__(self, executor: Executor, config: TransportConfig = TransportConfig()) -> None:
        self._executor = executor
        self._config = config
        self._server: Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            self._config.host,
            self._config.port,
            ssl=self._config.tls,
            max_size=self._config.limits.max_frame_bytes,
            compression=None,
        )

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        scheme = "wss" if self._config.tls else "ws"
        host = self._config.host
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}/"

    async def _handle(self, ws: ServerConnection) -> None:
        peer = ws.remote_address
        secure = self._config.tls is not None or self._config.trust_channel or is_loopback(peer)
        channel = Channel(peer=f"{peer[0]}:{peer[1]}" if peer else "?", secure=secure)
        connection = _Connection(ws, self._executor, channel, self._config.limits)
        self._connections.add(connection)
        log.debug("connection from %s", channel.peer)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            log.debug("connection from %s closed", channel.peer)

    async def close(self) -> None:
        """Stop accepting, let calls in flight finish and reply, then close every connection."""
        if self._server is None:
            return
        self._server.close(close_connections=False)
        timeout = self._config.limits.drain_seconds
        await asyncio.gather(*(c.drain(timeout) for c in list(self._connections)))
        await self._server.wait_closed()
        self._server = None
