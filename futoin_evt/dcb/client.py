"""Python clients of the DCB HTTP API: :class:`DcbClient` (blocking, standard library only)
and :class:`AsyncDcbClient` (the same calls, each in a worker thread).

``read`` returns a :class:`ReadResult` (events and the head), ``append`` the position of the
last event appended, and ``subscribe`` yields matching events as they commit, for as long
as the caller iterates. Event data is any JSON value, or ``bytes`` kept exactly.

``stream="NAME"`` talks to the stream ``NAME`` (one of one partition) instead of ``events``.

Errors: :class:`DcbError` with the server's ``error`` name and message;
:class:`AppendConditionFailed` (a subclass) when the condition failed.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import threading
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit


class DcbError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.status = status
        self.error = error
        self.message = message


class AppendConditionFailed(DcbError):
    """Another matching event was appended after the position the condition names."""


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    data: Any
    tags: Sequence[str] = ()
    id: str | None = None


@dataclass(frozen=True, slots=True)
class SequencedEvent:
    position: int
    type: str
    data: Any
    tags: tuple[str, ...]
    ts: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ReadResult:
    events: list[SequencedEvent]
    #: The store's newest position when the read was answered.
    head: int


@dataclass(frozen=True, slots=True)
class QueryItem:
    types: Sequence[str] = ()
    tags: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Query:
    items: Sequence[QueryItem] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"items": [{"types": list(i.types), "tags": list(i.tags)} for i in self.items]}


def _event_json(event: Event) -> dict[str, Any]:
    raw: dict[str, Any] = {"type": event.type, "tags": list(event.tags)}
    if isinstance(event.data, (bytes, bytearray, memoryview)):
        raw["data"] = base64.b64encode(bytes(event.data)).decode("ascii")
        raw["bytes"] = True
    else:
        raw["data"] = event.data
    if event.id is not None:
        raw["id"] = event.id
    return raw


def _sequenced(raw: dict[str, Any]) -> SequencedEvent:
    data = base64.b64decode(raw["data"]) if raw.get("bytes") else raw["data"]
    return SequencedEvent(
        raw["position"], raw["type"], data, tuple(raw["tags"]), raw["ts"], raw.get("id")
    )


class DcbClient:
    """One kept-alive HTTP connection to ``http(s)://host:port``; safe to share between
    threads (calls take turns)."""

    def __init__(
        self,
        url: str,
        *,
        credentials: str,
        path: str = "/dcb/v1",
        timeout: float = 60.0,
        stream: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss"):
            raise ValueError(f"not an http(s) URL: {url}")
        secure = parts.scheme in ("https", "wss")
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80)
        self._connection = (
            http.client.HTTPSConnection(host, port, timeout=timeout)
            if secure
            else http.client.HTTPConnection(host, port, timeout=timeout)
        )
        self._timeout = timeout
        self._path = stream_path(path, stream)
        token = base64.b64encode(credentials.encode()).decode("ascii")
        self._headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> DcbClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def append(self, events: Sequence[Event], condition: dict[str, Any] | None = None) -> int:
        """Append atomically; the position of the last event. ``condition`` is
        ``{"failIfEventsMatch": query, "after": position}`` (see :func:`condition`)."""
        body: dict[str, Any] = {"events": [_event_json(e) for e in events]}
        if condition is not None:
            body["condition"] = condition
        position: int = self._post("append", body)["position"]
        return position

    def read(
        self,
        query: Query | dict[str, Any] | None = None,
        *,
        after: int | None = None,
        limit: int | None = None,
        backwards: bool = False,
        wait: float = 0.0,
    ) -> ReadResult:
        body: dict[str, Any] = {"backwards": backwards}
        if query is not None:
            body["query"] = query.to_json() if isinstance(query, Query) else query
        if after is not None:
            body["after"] = after
        if limit is not None:
            body["limit"] = limit
        if wait:
            body["wait"] = wait
        answer = self._post("read", body, timeout=self._timeout + wait)
        return ReadResult([_sequenced(raw) for raw in answer["events"]], answer["head"])

    def subscribe(
        self,
        query: Query | dict[str, Any] | None = None,
        *,
        after: int | None = None,
        wait: float = 10.0,
    ) -> Iterator[SequencedEvent]:
        """Matching events after ``after``, then new ones as they commit (long polling)."""
        position = after or 0
        while True:
            result = self.read(query, after=position, limit=1000, wait=wait)
            for event in result.events:
                position = event.position
                yield event

    def _post(self, action: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        with self._lock:
            if timeout is not None:
                self._connection.timeout = timeout
                if self._connection.sock is not None:
                    self._connection.sock.settimeout(timeout)
            for attempt in range(2):
                try:
                    self._connection.request(
                        "POST", f"{self._path}/{action}", payload, self._headers
                    )
                    response = self._connection.getresponse()
                    text = response.read()
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self._connection.close()  # a kept-alive connection the server closed
                    if attempt:
                        raise
        answer = json.loads(text) if text else {}
        if response.status != 200:
            error = answer.get("error", "HTTP") if isinstance(answer, dict) else "HTTP"
            message = answer.get("message", "") if isinstance(answer, dict) else text.decode()
            kind = AppendConditionFailed if error == "AppendConditionFailed" else DcbError
            raise kind(response.status, error, message)
        return answer


def stream_path(path: str, stream: str | None) -> str:
    """The DCB API's path for ``stream`` (None: the server's ``events``)."""
    path = path.rstrip("/")
    return path if stream is None else f"{path}/streams/{quote(stream, safe='')}"


def condition(query: Query | dict[str, Any], after: int | None = None) -> dict[str, Any]:
    """An append condition: fail if an event matching ``query`` exists after ``after``."""
    raw: dict[str, Any] = {
        "failIfEventsMatch": query.to_json() if isinstance(query, Query) else query
    }
    if after is not None:
        raw["after"] = after
    return raw


class AsyncDcbClient:
    """:class:`DcbClient` for asyncio code: each call runs in a worker thread."""

    def __init__(
        self, url: str, *, credentials: str, path: str = "/dcb/v1", stream: str | None = None
    ) -> None:
        self._url, self._credentials, self._path = url, credentials, stream_path(path, stream)
        self._client = DcbClient(url, credentials=credentials, path=self._path)

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> AsyncDcbClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def append(self, events: Sequence[Event], condition: dict[str, Any] | None = None) -> int:
        return await asyncio.to_thread(self._client.append, events, condition)

    async def read(
        self,
        query: Query | dict[str, Any] | None = None,
        *,
        after: int | None = None,
        limit: int | None = None,
        backwards: bool = False,
    ) -> ReadResult:
        return await asyncio.to_thread(
            lambda: self._client.read(query, after=after, limit=limit, backwards=backwards)
        )

    async def subscribe(
        self, query: Query | dict[str, Any] | None = None, *, after: int | None = None
    ) -> AsyncGenerator[SequencedEvent, None]:
        """Matching events, then new ones as they commit; stop by leaving the loop. Long
        polls go over a connection of their own, so other calls are not held up."""
        position = after or 0
        polls = DcbClient(self._url, credentials=self._credentials, path=self._path)
        try:
            while True:
                result = await asyncio.to_thread(
                    polls.read, query, after=position, limit=1000, wait=5.0
                )
                for event in result.events:
                    position = event.position
                    yield event
        finally:
            polls.close()
