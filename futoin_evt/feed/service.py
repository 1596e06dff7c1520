"""HTTP event feeds over the event logs: FeedAPI v2 and its predecessor ZeroEventHub v1.

No sockets here: :func:`parse_feed_request` turns a path and query into a request (or a
:class:`FeedError` with its HTTP status), and :class:`FeedService` writes the NDJSON lines of
a response through a callback, a few events at a time, so memory stays bounded whatever page
size is asked for.

Each stream is a feed; its partitions ``"0".."P-1"`` are the feed's partitions. A cursor is
the id of the last event it covers in its partition, as a decimal string: ``_first`` is
before the oldest retained event, ``_last`` is after the newest one (only events added later
follow). Each line's ``data`` is the event as FTN18 has it:
``{"id": "17", "type": "ORDER", "data": {...}, "ts": "2026-11-22T10:00:00Z"}``. Cursors
belong to the clients: reading the feed moves no consumer's position, and does not hold
back discarding.

A stream's token names the database, the stream (its partitions' keys are never reused, so
a stream dropped and added again has another) and its partition count: growing the stream
changes it, and a fetch with the old one gets 409 (FeedAPI's method 1). The key and count are
in it as a digest: a key counts the partitions of every stream, which a reader of one stream
is not told. Partitions are never closed (every one keeps taking events), so none is listed
``startsAfterPartition``.

``selector=`` (a selector of the event notification, URL-encoded) keeps the events it
matches; the event types it pins are read alone, as ``event-types`` would be. Cursors still
move over the events it leaves out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ..domain.notification import Notification
from ..domain.partition import DEFAULT_STREAM, Partition, StreamInfo, check_stream_name
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import EVENT_TYPE_RULE, STREAM_NAME_RULE
from ..log.access import Refused
from ..log.eventlog import EventLog
from ..log.streams import StreamLogs, StreamRegistry
from ..notify.message import NotifyError
from ..notify.selector import Selector, compile_selector
from ..quoting import quote_input

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
_PARTITION = re.compile(r"0|[1-9][0-9]{0,4}")
_CURSOR_KEY = re.compile(r"cursor(0|[1-9][0-9]{0,4})")
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
    """FeedAPI v2: ``GET`` of the feed with no arguments."""


@dataclass(frozen=True)
class EventsRequest:
    #: 1: ZeroEventHub (``n``, ``cursorK``, lines carry ``"partition": K``); 2: FeedAPI.
    version: int
    #: (partition number, cursor) of each partition read, in partition order.
    cursors: tuple[tuple[int, str], ...]
    page_size: int
    types: tuple[str, ...] | None
    wait_seconds: float
    #: ``selector=``: only the events it matches (their types pushed down into ``types``).
    selector: Selector | None = None


def parse_feed_request(
    subpath: str, query: Mapping[str, Sequence[str]], stream: StreamInfo, token: str
) -> Discovery | EventsRequest:
    """``subpath`` is what follows the feed's path: ``""`` or ``"/events"``."""
    args = {key: values[-1] for key, values in query.items()}
    count = len(stream.partitions)
    if subpath in ("", "/"):
        if "n" in args:
            return _zeroeventhub(args, count)
        if args:
            raise FeedError(400, "Fetch events at the feed's /events path (FeedAPI v2).")
        return Discovery()
    if subpath == "/events":
        return _feedapi(args, token, count)
    raise FeedError(404, "No such resource in this feed.")


def _partitions_text(count: int) -> str:
    return "partition 0 only" if count == 1 else f"partitions 0 to {count - 1}"


def _zeroeventhub(args: Mapping[str, str], count: int) -> EventsRequest:
    if args["n"] != str(count):
        plural = "partition" if count == 1 else "partitions"
        raise FeedError(400, f"n must be {count}: this feed has {count} {plural}.")
    cursors: list[tuple[int, str]] = []
    for key, value in args.items():
        if not key.startswith("cursor"):
            continue
        match = _CURSOR_KEY.fullmatch(key)
        if match is None or int(match[1]) >= count:
            raise FeedError(
                400,
                f"Unknown partition in {quote_input(key)}: this feed has "
                f"{_partitions_text(count)}.",
            )
        cursors.append((int(match[1]), _cursor(value)))
    if not cursors:
        raise FeedError(400, f"No cursors given: pass cursor0 (to cursor{count - 1}).")
    selector, types = _selector(args, None)
    return EventsRequest(1, tuple(sorted(cursors)), _page_size(args), types, _wait(args), selector)


def _feedapi(args: Mapping[str, str], token: str, count: int) -> EventsRequest:
    if "token" not in args:
        raise FeedError(400, "No token given: discover the feed first.")
    if args["token"] != token:
        raise FeedError(409, "The feed's token has changed: discover the feed again.")
    raw = args.get("partition")
    if raw is None or _PARTITION.fullmatch(raw) is None or int(raw) >= count:
        raise FeedError(
            400, f"Unknown partition {quote_input(raw)}: this feed has {_partitions_text(count)}."
        )
    if "cursor" not in args:
        raise FeedError(400, "No cursor given: use _first, _last or a cursor from the feed.")
    types = None
    if "event-types" in args:
        types = tuple(t for t in args["event-types"].split(";") if t)
        bad = [t for t in types if not _EVENT_TYPE.fullmatch(t)]
        if bad or not types:
            raise FeedError(
                400,
                f"Bad event-types {quote_input(args['event-types'])}: use TYPE_A;TYPE_B, where"
                f" {EVENT_TYPE_RULE}.",
            )
    selector, types = _selector(args, types)
    cursors = ((int(raw), _cursor(args["cursor"])),)
    return EventsRequest(2, cursors, _page_size(args), types, _wait(args), selector)


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


@dataclass(frozen=True)
class Feed:
    """One stream's feed as this process knows it now."""

    stream: StreamInfo
    token: str


@dataclass
class PartitionRead:
    """One partition of a response, read as ``who``: where it is, and whether its cursor
    line went out."""

    who: Principal
    number: int
    log: EventLog
    after_id: int
    prefix: bytes
    cursor_prefix: bytes
    cursor_written: bool = False


class FeedService:
    """Serves feed responses from the event logs, for every stream the registry knows."""

    def __init__(self, logs: StreamLogs, streams: StreamRegistry, database: str) -> None:
        """``database``: the database's random name (``Store.stream_id``)."""
        self._logs = logs
        self._streams = streams
        #: The database's random name, which every token starts with.
        self._database = database
        #: Set when the server shuts down: waiting responses end at once.
        self.closing = asyncio.Event()

    def feed(self, who: Principal, name: str = DEFAULT_STREAM) -> Feed:
        """The stream's feed for ``who``, who needs the read right on it; FeedError 404 when
        there is no such stream (or it was dropped) and ``who`` holds some right on the name
        (:meth:`~futoin_evt.log.streams.StreamRegistry.reachable`), else
        :class:`~futoin_evt.log.access.AccessDenied`."""
        try:
            check_stream_name(name)
        except ValueError:  # no stream can have it: nothing to hide
            raise FeedError(
                404, f"No stream {quote_input(name)}. Check the name: {STREAM_NAME_RULE}."
            ) from None
        stream = self._streams.reachable(who, name, Right.READ)
        if stream is None:
            raise FeedError(404, f"No stream {quote_input(name)}.")
        return Feed(stream, self.token(stream))

    def token(self, stream: StreamInfo) -> str:
        """The database's name alone for ``events`` with one partition (as before streams);
        else the name and a digest of the stream's first partition key and its partition
        count. The key is the store's count of partitions ever made, of every stream: the
        token does not show it."""
        first, count = stream.partitions[0].key, len(stream.partitions)
        if first == 0 and count == 1:
            return self._database
        digest = hashlib.blake2b(
            f"{first}/{count}".encode(), key=self._database.encode()[:64], digest_size=8
        )
        return f"{self._database}-{digest.hexdigest()}"

    def discovery(self, feed: Feed) -> bytes:
        partitions = [{"id": str(p.number)} for p in feed.stream.partitions]
        return json.dumps({
            "token": feed.token,
            "partitions": partitions,
            "exactlyOnce": True,
        }, separators=(",", ":")).encode()  # fmt: skip

    async def start_after(
        self, who: Principal, feed: Feed, request: EventsRequest
    ) -> list[PartitionRead]:
        """Where each partition's response to ``who`` starts; FeedError for a cursor beyond
        the newest event of its partition."""
        readings = []
        for number, cursor in request.cursors:
            log = self._logs.partition(feed.stream.partitions[number])
            prefix, cursor_prefix = _line_prefixes(request.version, number)
            after_id = await _start_after(who, log, cursor, number)
            readings.append(PartitionRead(who, number, log, after_id, prefix, cursor_prefix))
        return readings

    async def events(
        self, request: EventsRequest, readings: list[PartitionRead], write: Write
    ) -> None:
        """Write the response's NDJSON lines: events after each reading's start (from
        :meth:`start_after`), a cursor line after each chunk, and always at least one cursor
        line per partition. With several partitions the page is shared among those that have
        events, a chunk of each in turn."""
        if request.wait_seconds and all(r.log.head <= r.after_id for r in readings):
            await self._wait_beyond(readings, request.wait_seconds)
        if request.types == ():  # the selector pins no type this log can hold
            for reading in readings:
                newest = max(reading.after_id, await reading.log.last_given_id(reading.who))
                await write(reading.cursor_prefix + str(newest).encode() + b'"}\n')
            return
        left = request.page_size
        active = list(readings)
        while active and left > 0:
            share = min(CHUNK, -(-left // len(active)))
            for reading in list(active):
                if left <= 0:
                    break
                count, done = await _chunk(request, reading, min(share, left), write)
                left -= count
                if done:
                    active.remove(reading)
        for reading in readings:
            if not reading.cursor_written:  # the page filled up before its turn
                await write(reading.cursor_prefix + str(reading.after_id).encode() + b'"}\n')

    async def _wait_beyond(self, readings: list[PartitionRead], seconds: float) -> None:
        """Until an event comes to any of the partitions, the server closes, time is up, or
        the caller loses the read right (the next read then refuses it: the response ends
        without data)."""
        woken = asyncio.Event()
        stops = [r.log.listen(woken.set) for r in readings]
        guard, who = readings[0].log.guard, readings[0].who  # the stream's, for every partition
        stops.append(guard.watch(who, Right.READ, woken.set))
        try:
            guard.read(who)
        except Refused:  # revoked before the watch began
            woken.set()
        closing = asyncio.ensure_future(self.closing.wait())
        moved = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait({moved, closing}, timeout=seconds, return_when="FIRST_COMPLETED")
        finally:
            for stop in stops:
                stop()
            for waiter in (moved, closing):
                waiter.cancel()
            await asyncio.gather(moved, closing, return_exceptions=True)


async def _start_after(who: Principal, log: EventLog, cursor: str, number: int) -> int:
    if cursor == FIRST:
        return 0
    newest = await log.last_given_id(who)
    if cursor == LAST:
        return newest
    after_id = int(cursor)
    if after_id > newest:
        raise FeedError(
            400, f"Cursor {after_id} is beyond the newest event of partition {number} ({newest})."
        )
    return after_id


async def _chunk(
    request: EventsRequest, reading: PartitionRead, limit: int, write: Write
) -> tuple[int, bool]:
    """Write the next events of one partition (at most ``limit``) and its cursor line; how
    many were read, and whether the partition has no more for now."""
    after_id = reading.after_id
    page = await reading.log.read_page(
        reading.who, after_id, types=request.types, limit=limit, max_bytes=CHUNK_BYTES
    )
    done = page.count < limit and not page.truncated
    new_after = page.last_id if page.count else after_id
    if request.types is not None and done:
        new_after = max(new_after, page.head_id)  # skip what the filter left out
    if not page.count and new_after == after_id and reading.cursor_written:
        return 0, True
    items = page.items
    if request.selector is not None:
        items = [
            item
            for item in items
            if request.selector.matches(_notification(item, reading.log.partition))
        ]
    lines = [reading.prefix + item.encode() + b"}\n" for item in items]
    lines.append(reading.cursor_prefix + str(new_after).encode() + b'"}\n')
    await write(b"".join(lines))
    reading.cursor_written = True
    reading.after_id = new_after
    return page.count, done


def _notification(item: str, partition: Partition) -> Notification:
    event = json.loads(item)
    return Notification(
        event["type"],
        int(event["id"]),
        event["ts"],
        event["data"],
        partition.stream,
        partition.number,
    )


def _line_prefixes(version: int, number: int) -> tuple[bytes, bytes]:
    if version == 1:
        return b'{"partition":%d,"data":' % number, b'{"partition":%d,"cursor":"' % number
    return b'{"data":', b'{"cursor":"'
