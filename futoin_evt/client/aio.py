"""An asyncio FTN3 client over WebSocket, and the event stream calls on top of it.

Many calls may be in flight on one connection; each reply is matched by ``rid``. Requests the
server sends to us (``S`` rids, e.g. pushed events) go to handlers registered with
:meth:`FTN3Client.on_request`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple

from ..ftn3.errors import FTN3Error, ProtocolViolation
from ..ftn3.messages import (
    decode_frame,
    encode_error,
    encode_request,
    encode_result,
    parse_request,
    parse_response,
)
from ..wsio import ClientIO, ConnectionClosedError, InvalidHandshake, open_client

logger = logging.getLogger(__name__)

#: Replies up to pollEvents through poll 1.1 (8 MiB) and some room.
CLIENT_MAX_FRAME_BYTES: Final = 9 * 1024 * 1024

GEN: Final = "futoin.evt.gen:1.1"
#: addEvent with a producer's key (an older server answers NotSupportedVersion).
GEN_KEYED: Final = "futoin.evt.gen:1.2"
POLL: Final = "futoin.evt.poll:1.1"
OPS: Final = "futoinevt.ops:1.0"

RequestHandler = Callable[[dict[str, Any]], Awaitable[Any]]


class RemoteError(FTN3Error):
    """The server answered a call with an FTN3 error."""


class CommError(ConnectionError):
    """The connection went away before the reply came (the call may or may not have run)."""


def normalize_url(url: str) -> str:
    """Accept the official client's ``secure+ws://`` form: it only marks the channel secure."""
    return url.removeprefix("secure+")


class FTN3Client:
    """One WebSocket connection to an FTN3 server. ``async with await FTN3Client.connect(...)``."""

    def __init__(self, io: ClientIO, credentials: str | None) -> None:
        self._io = io
        self._credentials = credentials
        self._rids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._handlers: dict[tuple[str, str], RequestHandler] = {}
        self._served: set[asyncio.Task[None]] = set()
        io.on_message = self._on_message
        io.closed.add_done_callback(self._on_closed)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        credentials: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        open_timeout: float = 10.0,
    ) -> FTN3Client:
        """Raises CommError when the server cannot be reached or refuses the handshake."""
        url = normalize_url(url)
        try:
            io = await open_client(
                url,
                max_size=CLIENT_MAX_FRAME_BYTES,
                ssl_context=ssl_context,
                open_timeout=open_timeout,
            )
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosedError) as exc:
            raise CommError(f"cannot connect to {url}: {exc or type(exc).__name__}") from exc
        return cls(io, credentials)

    async def call(self, iface_version: str, func: str, params: dict[str, Any]) -> Any:
        """Call ``iface:ver:func``; raises RemoteError for an FTN3 error, CommError on loss.

        Cancelling abandons the reply; the call may still run on the server.
        """
        rid = f"C{next(self._rids)}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            if not self._io.writable:
                await self._io.drain()
            self._io.send(encode_request(rid, f"{iface_version}:{func}", params, self._credentials))
            return await future
        except ConnectionClosedError as exc:
            raise CommError(f"connection closed: {exc}") from None
        finally:
            self._pending.pop(rid, None)

    def on_request(self, iface: str, func: str, handler: RequestHandler) -> None:
        """Answer server-initiated calls of ``iface:*:func`` with ``handler(params)``."""
        self._handlers[(iface, func)] = handler

    async def close(self) -> None:
        self._io.close()
        await self._io.closed

    def start_closing(self) -> None:
        """Begin closing without waiting for it (see :meth:`wait_closed`)."""
        self._io.close()

    async def wait_closed(self) -> None:
        await self._io.closed

    @property
    def closed(self) -> bool:
        return self._io.closed.done()

    async def __aenter__(self) -> FTN3Client:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def _on_message(self, frame: bytes) -> None:
        try:
            msg = decode_frame(frame)
        except ProtocolViolation as exc:
            logger.warning("ignoring a frame from the server: %s", exc)
            return
        if msg["rid"][0] == "S":
            task = asyncio.create_task(self._serve(msg))
            self._served.add(task)
            task.add_done_callback(self._served.discard)
            return
        response = parse_response(msg)
        future = self._pending.get(response.rid)
        if future is None or future.done():
            return
        if response.error is not None:
            future.set_exception(RemoteError(response.error, response.error_desc))
        else:
            future.set_result(response.result)

    def _on_closed(self, _closed: asyncio.Future[None]) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CommError("connection closed before the reply"))

    async def _serve(self, msg: dict[str, Any]) -> None:
        rid = msg["rid"]
        try:
            request = parse_request(msg)
            handler = self._handlers.get((request.iface, request.func))
            if handler is None:
                raise FTN3Error("UnknownInterface", f"Unknown interface: {request.iface}")
            reply = encode_result(rid, await handler(request.params))
        except FTN3Error as exc:
            reply = encode_error(rid, exc.name, exc.desc)
        except Exception:
            logger.exception("handler for %s failed", msg.get("f"))
            reply = encode_error(rid, "InternalError", "Internal error")
        with contextlib.suppress(ConnectionClosedError):
            await self._io.drain()
            self._io.send(reply)


class Event(NamedTuple):
    """One event as a consumer sees it (a tuple: cheap to build a thousand at a time)."""

    id: int
    type: str
    data: Any
    ts: str

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Event:
        return cls(int(raw["id"]), raw["type"], raw["data"], raw["ts"])


class EventStreamClient:
    """The FTN18 calls: ``add_event``, ``register_consumer``, ``poll_events``, ``ping``."""

    def __init__(self, ftn3: FTN3Client) -> None:
        self.ftn3 = ftn3

    @classmethod
    async def connect(cls, url: str, *, credentials: str | None = None) -> EventStreamClient:
        return cls(await FTN3Client.connect(url, credentials=credentials))

    async def close(self) -> None:
        await self.ftn3.close()

    async def __aenter__(self) -> EventStreamClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def ping(self, echo: int = 1) -> int:
        result = await self.ftn3.call(GEN, "ping", {"echo": echo})
        return int(result["echo"])

    async def add_event(self, event_type: str, data: Any, key: str | None = None) -> int:
        """The event's id. With ``key`` (1-64 of ``A-Za-z0-9._:-``, unique per event of
        the producer): the first event's id when the server stored an event with that key
        within its dedup window, so a retry after a lost reply stores nothing twice."""
        return int(await self.ftn3.call(*add_event_call(event_type, data, key)))

    async def register_consumer(self, component: str, *, iface: str = POLL) -> bool:
        return bool(await self.ftn3.call(iface, "registerConsumer", {"component": component}))

    async def poll_events(
        self,
        component: str,
        last_id: int | None = None,
        want: Sequence[str] | None = None,
        *,
        iface: str = POLL,
    ) -> list[Event]:
        raw = await self.ftn3.call(iface, "pollEvents", poll_params(component, last_id, want))
        return [Event.from_wire(item) for item in raw]


def add_event_call(event_type: str, data: Any, key: str | None) -> tuple[str, str, dict[str, Any]]:
    """(iface, function, params) of an addEvent: through 1.2 only with a key."""
    if key is None:
        return GEN, "addEvent", {"type": event_type, "data": data}
    return GEN_KEYED, "addEvent", {"type": event_type, "data": data, "key": key}


def poll_params(component: str, last_id: int | None, want: Sequence[str] | None) -> dict[str, Any]:
    """pollEvents params as FTN18 has them (ids as strings, no ``last_id`` for "from the start")."""
    params: dict[str, Any] = {"component": component}
    if last_id:
        params["last_id"] = str(last_id)
    if want is not None:
        params["want"] = list(want)
    return params
