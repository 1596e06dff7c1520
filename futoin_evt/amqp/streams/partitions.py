"""The links that read every partition of a stream: :class:`PartitionsLink` for a
partition-agnostic consumer, :class:`InfoLink` for ``NAME/$info``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...log.eventlog import EventLog
from ..codec import Position, format_offset
from ..engine.message import Message
from ..engine.session import Link
from ..engine.types import Symbol, encode
from ..links import SourceLink
from ..table import ConnectionView
from .consumer import ENCODER, READ_BATCH, newer_committed

#: Delivery annotations: the partition a consumer's message came from.
SOURCE_PARTITION: Final = Symbol("event-streams-source-partition")


def _source_annotation(partition: int) -> tuple[bytes, int]:
    """The encoded ``event-streams-source-partition`` entry of a delivery-annotations map:
    its bytes and how many map items it is (2)."""
    encoded = encode({SOURCE_PARTITION: Symbol(str(partition))})
    if encoded[0] == 0xC1:  # map8: constructor, size, count
        return encoded[3:], 2
    return encoded[9:], 2  # map32


def _annotated(message: bytes, entry: tuple[bytes, int]) -> bytes:
    """``message`` (delivery annotations first, as :class:`EventEncoder` writes it) with one
    more entry in its delivery annotations."""
    extra, items = entry
    if message[3] == 0xC1:
        size, count = message[4], message[5]
        if size + len(extra) <= 0xFF and count + items <= 0xFF:
            head = bytes((0xC1, size + len(extra), count + items))
            return message[:3] + head + message[6 : 5 + size] + extra + message[5 + size :]
        body = message[6 : 5 + size]
        rest = message[5 + size :]
        count_total = count + items
    else:
        size = int.from_bytes(message[4:8], "big")
        count = int.from_bytes(message[8:12], "big")
        body = message[12 : 8 + size]
        rest = message[8 + size :]
        count_total = count + items
    content = body + extra
    head = b"\xd1" + (len(content) + 4).to_bytes(4, "big") + count_total.to_bytes(4, "big")
    return message[:3] + head + content + rest


@dataclass(frozen=True, slots=True)
class Grows:
    """A stream's partitions now (None once it is dropped), and how to hear of a change."""

    current: Callable[[], Sequence[EventLog] | None]
    listen: Callable[[Callable[[], None]], Callable[[], None]]


class PartitionsLink(SourceLink):
    """A partition-agnostic consumer: the events of every partition of the stream, each
    partition in id order, every transfer annotated with its partition
    (``event-streams-source-partition``). Partitions take turns for the credit. A partition
    the stream gains later (``futoin-evt stream grow``) is read from its first event, under
    the link's filter but for an offset (which names a place in another partition)."""

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        logs: Sequence[EventLog],
        starts: Sequence[Position | None],
        *,
        event_hubs: bool = False,
        grows: Grows | None = None,
    ) -> None:
        self._logs = list(logs)
        #: What a partition added later starts from: its first event, after the filter's time.
        first = next((start for start in starts if start is not None), None)
        self._later = Position(0, first.after_ms, first.matches) if first else Position(0)
        self._starts = [
            start if start is not None else Position(events.head)
            for events, start in zip(logs, starts, strict=True)
        ]
        self._event_hubs = event_hubs
        self._entries = [_source_annotation(number) for number in range(len(logs))]
        self._stops = [events.listen(self._on_head) for events in logs]
        self._grows = grows
        if grows is not None:
            self._stops.append(grows.listen(self._on_head))
        super().__init__(conn, link, logs[0])

    async def _grown(self, afters: list[int]) -> None:
        """Take the partitions the stream gained since the last look."""
        logs = self._grows.current() if self._grows is not None else None
        if logs is None or len(logs) <= len(self._logs):
            return
        for number in range(len(self._logs), len(logs)):
            events = logs[number]
            self._logs.append(events)
            self._starts.append(self._later)
            self._entries.append(_source_annotation(number))
            self._stops.append(events.listen(self._on_head))
            afters.append(await self._after_time(events, self._later, 0))

    def _on_head(self) -> None:
        self._wake.set()

    def on_closed(self) -> asyncio.Future[None] | None:
        for stop in self._stops:
            stop()
        return super().on_closed()

    async def _run(self) -> None:
        logs = self._logs
        afters = [
            await self._after_time(events, start, start.after_id)
            for events, start in zip(logs, self._starts, strict=True)
        ]
        link = self._link
        encode = ENCODER.encode
        event_hubs = self._event_hubs
        turn = 0
        while True:
            self._wake.clear()
            await self._grown(afters)
            sent = read = False
            for step in range(len(logs)):
                number = (turn + step) % len(logs)
                events = logs[number]
                if link.credit <= 0 or not self._conn.writable:
                    break
                if events.head <= afters[number]:
                    continue
                share = max(1, min(link.credit, READ_BATCH) // len(logs))
                matches = self._starts[number].matches
                entry = self._entries[number]
                for event in await events.read_after(self._who, afters[number], share):
                    if link.credit <= 0:
                        break
                    read = True
                    afters[number] = event.id
                    if matches is None or matches(event):
                        message = _annotated(encode(event, event_hubs), entry)
                        self._send(message, f"{number}:{event.id}")
                        sent = True
            turn += 1
            if sent:
                self._conn.wake()
            if read:
                continue
            caught_up = all(e.head <= after for e, after in zip(logs, afters, strict=True))
            if link.credit > 0 and link.drain and caught_up:
                if await newer_committed(logs, afters):
                    continue
                link.drained()
                self._conn.wake()
            await self._wake.wait()


class InfoLink(SourceLink):
    """``NAME/$info``: one message with the bounds of every partition per unit of credit."""

    def __init__(self, conn: ConnectionView, link: Link, logs: Sequence[EventLog]) -> None:
        self._logs = list(logs)
        super().__init__(conn, link, logs[0])

    async def _run(self) -> None:
        link = self._link
        sent = 0
        while True:
            self._wake.clear()
            while link.credit > 0:
                bounds = [await events.bounds(self._who) for events in self._logs]
                sent += 1
                info = Message(body=_info([(b.first_id, b.last_id) for b in bounds]))
                self._send(info.encode(), str(sent))
                self._conn.wake()
            await self._wake.wait()


def _info(bounds: Sequence[tuple[int | None, int | None]]) -> dict[Any, Any]:
    def offset(event_id: int | None) -> Any:
        return Symbol(format_offset(event_id)) if event_id is not None else None

    return {
        Symbol("partitions"): [
            {
                Symbol("partition"): Symbol(str(number)),
                Symbol("earliest-offset"): offset(first_id),
                Symbol("latest-offset"): offset(last_id),
            }
            for number, (first_id, last_id) in enumerate(bounds)
        ],
        Symbol("futoin-evt:head-id"): max((last or 0) for _first, last in bounds),
    }
