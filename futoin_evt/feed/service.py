"""HTTP event feeds over the store: FeedAPI v2 and its predecessor ZeroEventHub v1.

No sockets here: :func:`parse_feed_request` turns a path and query into a request (or a
:class:`FeedError` with its HTTP status), and :class:`FeedService` writes the NDJSON lines of
a response through a callback, a few events at a time, so memory stays bounded whatever page
size is asked for.

The feed has one partition, ``"0"``. A cursor is the id of the last event it covers, as a
decimal string: ``_first`` is before the oldest retained event, ``_last`` is after the newest
one (only events added later follow). Each line's ``data`` is the event as FTN18 has it:
``{"id": "17", "type": "ORDER", "data": {...}, "ts": "2026-11-22T10:00:00Z"}``. Cursors
belong to the clients: reading the feed moves no consumer's position, and does not hold
back discarding.

``selector=`` (a selector of the event notification, URL-encoded) keeps the events it
matches; the event types it pins are read alone, as ``event-types`` would be. Cursors still
move over the events it leaves out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ..domain.partition import DEFAULT_PARTITION
from ..notify.message import Notification, NotifyError
from ..notify.selector import Selector, compile_selector
from ..quoting import quote_input
from ..storage.base import EventLog

PARTITION: Final = "0"
FIRST: Final = "_first"
LAST: Final = "_last"
#: The most events one response carries, whatever ``pagesizehint`` asks for.
MAX_PAGE: Final = 1000
#: Events read from the store per step of a response.
CHUNK: Final = 100
#: The longest a caught-up client may ask to wait for new events (``wait`` seconds).
MAX_WAIT_SECONDS: Final = 60.0
#: Bounds one chunk's read, and so what a client that stops reading holds in server memory
#: (one chunk, or one event when a single event is larger).
CHUNK_BYTES: Final = 1024 * 1024

# [0-9], not str.isdigit() or float(): those take other scripts' digits, which int() may not.
_EVENT_TYPE = re.compile(r"[A-Z_]{1,16}")
_CURSOR = re.compile(r"0|[1-9][0-9]{0,17}")
_DIGITS = re.compile(r"[0-9]+")
_SECONDS = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?")


class FeedError(Exception):
    """A request the feed refuses, with its HTTP status and a one-sentence reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Discovery:
    """FeedAPI v2: ``GET /feed`` with no arguments."""


@dataclass(frozen=True)
class EventsRequest:
    #: 1: ZeroEventHub (``n``, ``cursor0``, lines carry ``"partition": 0``); 2: FeedAPI.
    version: int
    cursor: str
    page_size: int
    types: tuple[str, ...] | None
    wait_seconds: float
    #: ``selector=``: only the events it matches (their types pushed down into ``types``).
    selector: Selector | None = None


def parse_feed_request(
    subpath: str, query: Mapping[str, Sequence[str]], token: str
) -> Discovery | EventsRequest:
    """``subpath`` is what follows the feed's path: ``""`` or ``"/events"``."""
    args = {key: values[-1] for key, values in query.items()}
    if subpath in ("", "/"):
        if "n" in args:
            return _zeroeventhub(args)
        if args:
            raise FeedError(400, "Fetch events at the feed's /events path (FeedAPI v2).")
        return Discovery()
    if subpath == "/events":
        return _feedapi(args, token)
    raise FeedError(404, "No such resource in this feed.")


def _zeroeventhub(args: Mapping[str, str]) -> EventsRequest:
    if args["n"] != "1":
        raise FeedError(400, "n must be 1: this feed has one partition.")
    extra = [k for k in args if k.startswith("cursor") and k != "cursor0"]
    if extra:
        raise FeedError(
            400, f"Unknown partition in {quote_input(extra[0])}: this feed has partition 0 only."
        )
    if "cursor0" not in args:
        raise FeedError(400, "No cursors given: pass cursor0.")
    selector, types = _selector(args, None)
    return EventsRequest(
        1, _cursor(args["cursor0"]), _page_size(args), types, _wait(args), selector
    )


def _feedapi(args: Mapping[str, str], token: str) -> EventsRequest:
    if "token" not in args:
        raise FeedError(400, "No token given: discover the feed first.")
    if args["token"] != token:
        raise FeedError(409, "The feed's token has changed: discover the feed again.")
    if args.get("partition") != PARTITION:
        raise FeedError(
            400, f"Unknown partition {quote_input(args.get('partition'))}: use partition 0."
        )
    if "cursor" not in args:
        raise FeedError(400, "No cursor given: use _first, _last or a cursor from the feed.")
    types = None
    if "event-types" in args:
        types = tuple(t for t in args["event-types"].split(";") if t)
        bad = [t for t in types if not _EVENT_TYPE.fullmatch(t)]
        if bad or not types:
            raise FeedError(
                400, f"Bad event-types {quote_input(args['event-types'])}: use TYPE_A;TYPE_B."
            )
    selector, types = _selector(args, types)
    return EventsRequest(2, _cursor(args["cursor"]), _page_size(args), types, _wait(args), selector)


def _selector(
    args: Mapping[str, str], types: tuple[str, ...] | None
) -> tuple[Selector | None, tuple[str, ...] | None]:
    """The selector, and the types left to read once those it pins are pushed down."""
    if "selector" not in args:
        return None, types
    try:
        selector = compile_selector(args["selector"])
    except NotifyError as exc:
        raise FeedError(400, f"Bad selector: {exc}.") from None
    pinned = selector.event_types
    if pinned is not None:
        kept = pinned if types is None else pinned.intersection(types)
        types = tuple(sorted(kept))
    return selector, types


def _cursor(raw: str) -> str:
    if raw in (FIRST, LAST) or _CURSOR.fullmatch(raw):
        return raw
    raise FeedError(
        400, f"Bad cursor {quote_input(raw)}: use _first, _last or a cursor from the feed."
    )


def _page_size(args: Mapping[str, str]) -> int:
    raw = args.get("pagesizehint")
    if raw is None:
        return MAX_PAGE
    digits = raw.lstrip("0") if _DIGITS.fullmatch(raw) else ""
    if not digits:
        raise FeedError(400, f"Bad pagesizehint {quote_input(raw)}: use a positive integer.")
    # A hint of any length is clamped; int() is not asked to read thousands of digits.
    return MAX_PAGE if len(digits) > len(str(MAX_PAGE)) else min(int(digits), MAX_PAGE)


def _wait(args: Mapping[str, str]) -> float:
    raw = args.get("wait")
    if raw is None:
        return 0.0
    if _SECONDS.fullmatch(raw) is None or float(raw) > MAX_WAIT_SECONDS:
        raise FeedError(400, f"Bad wait {quote_input(raw)}: use 0 to {MAX_WAIT_SECONDS:g} seconds.")
    return float(raw)


Write = Callable[[bytes], Awaitable[None]]


class FeedService:
    """Serves feed responses from the store."""

    def __init__(self, store: EventLog, token: str) -> None:
        self._store = store
        self.token = token
        #: Set when the server shuts down: waiting responses end at once.
        self.closing = asyncio.Event()

    @classmethod
    async def open(cls, store: EventLog) -> FeedService:
        return cls(store, await store.stream_id())

    def discovery(self) -> bytes:
        return json.dumps({
            "token": self.token,
            "partitions": [{"id": PARTITION}],
            "exactlyOnce": True,
        }, separators=(",", ":")).encode()  # fmt: skip

    async def start_after(self, request: EventsRequest) -> int:
        """The id the response starts after; FeedError for a cursor beyond the newest event."""
        if request.cursor == FIRST:
            return 0
        newest = await self._store.last_given_id()
        if request.cursor == LAST:
            return newest
        after_id = int(request.cursor)
        if after_id > newest:
            raise FeedError(400, f"Cursor {after_id} is beyond the newest event ({newest}).")
        return after_id

    async def events(self, request: EventsRequest, after_id: int, write: Write) -> None:
        """Write the response's NDJSON lines: events after ``after_id`` (from
        :meth:`start_after`), a cursor line after each chunk, and always at least one."""
        if request.wait_seconds and self._store.head.head <= after_id:
            await self._wait_beyond(after_id, request.wait_seconds)
        prefix, cursor_prefix = _line_prefixes(request.version)
        if request.types == ():  # the selector pins no type this log can hold
            newest = max(after_id, await self._store.last_given_id())
            await write(cursor_prefix + str(newest).encode() + b'"}\n')
            return
        sent = 0
        cursor_written = False
        while sent < request.page_size:
            limit = min(CHUNK, request.page_size - sent)
            page = await self._store.read_events(
                after_id, types=request.types, limit=limit, max_bytes=CHUNK_BYTES
            )
            done = page.count < limit and not page.truncated
            new_after = page.last_id if page.count else after_id
            if request.types is not None and done:
                new_after = max(new_after, page.head_id)  # skip what the filter left out
            if not page.count and new_after == after_id and cursor_written:
                break
            items = page.items
            if request.selector is not None:
                items = [item for item in items if request.selector.matches(_notification(item))]
            lines = [prefix + item.encode() + b"}\n" for item in items]
            lines.append(cursor_prefix + str(new_after).encode() + b'"}\n')
            await write(b"".join(lines))
            cursor_written = True
            sent += page.count
            after_id = new_after
            if done:
                break

    async def _wait_beyond(self, after_id: int, seconds: float) -> None:
        head = asyncio.ensure_future(self._store.head.wait_beyond(after_id))
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({head, closing}, timeout=seconds, return_when="FIRST_COMPLETED")
        finally:
            for waiter in (head, closing):
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter


def _notification(item: str) -> Notification:
    event = json.loads(item)
    return Notification(
        event["type"],
        int(event["id"]),
        event["ts"],
        event["data"],
        DEFAULT_PARTITION.stream,
        DEFAULT_PARTITION.number,
    )


def _line_prefixes(version: int) -> tuple[bytes, bytes]:
    if version == 1:
        return b'{"partition":0,"data":', b'{"partition":0,"cursor":"'
    return b'{"data":', b'{"cursor":"'
