"""The DCB service: conditional appends and query reads over one log. No wire format.

Every door (HTTP, FTN3, the console) parses its requests with :mod:`futoin_evt.dcb.model`
and calls this, with the acting user; the rules (atomic batches, conditions checked in the
write transaction, the snapshot a read answers from) live in the store behind the event log.
The log is the one partition of a stream (:func:`stream_dcb_log`): a condition is checked
against one order of events, which a stream of several partitions does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ..domain.dcb import AppendCondition, BlindAppend, NewEvent, Query, SequencedEvent
from ..domain.partition import Partition, StreamInfo, check_stream_name
from ..domain.principal import Principal
from ..log.access import Refused
from ..log.eventlog import EventLog

#: Events read from the store per step of a read.
PAGE_SIZE: Final = 1000
#: Events of a read's first step: a read of a consistency boundary (tens of events) is
#: whole in it, and the SQLite store reads a step this small on the event loop (no hop to
#: its read thread and back: see :data:`futoin_evt.storage.sqlite.store.INLINE_DCB_ROWS`).
FIRST_PAGE_SIZE: Final = 50
#: The longest a reader may ask to wait for a first matching event.
MAX_WAIT_SECONDS: Final = 60.0
_NO_POSITION: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ReadRequest:
    query: Query
    #: Forwards: events after this position; backwards: events before it (None: from the end).
    after: int | None = None
    limit: int | None = None
    backwards: bool = False
    #: Seconds to wait for a matching event when there is none yet (forwards only).
    wait_seconds: float = 0.0


class DcbReadResult:
    """A read: ``head`` is the store's newest position when the read began (a writer passes
    it as ``after`` in its condition); :meth:`pages` yields the events, a page at a time,
    never past ``head``."""

    def __init__(
        self,
        events: EventLog,
        who: Principal,
        request: ReadRequest,
        head: int,
        first: list[SequencedEvent],
        asked: int = PAGE_SIZE,
    ) -> None:
        """``first``: the first page, of at most ``asked`` events (fewer: the last)."""
        self.head = head
        self._log = events
        self._who = who
        self._request = request
        self._first = first
        self._asked = asked

    async def pages(self) -> AsyncIterator[list[SequencedEvent]]:
        request, page, size = self._request, self._first, self._asked
        remaining = request.limit if request.limit is not None else _NO_POSITION
        while page:
            yield page
            remaining -= len(page)
            if remaining <= 0 or len(page) < size:
                return
            cursor = page[-1].position
            size = min(PAGE_SIZE, remaining)
            if request.backwards:
                page, _head = await self._log.dcb_read(
                    self._who, request.query, after=None, before=cursor, limit=size
                )
            else:
                page, _head = await self._log.dcb_read(
                    self._who, request.query, after=cursor, before=None, limit=size
                )
                page = [e for e in page if e.position <= self.head]

    async def all(self) -> list[SequencedEvent]:
        return [event async for page in self.pages() for event in page]


class DcbStreamRefused(Exception):
    """A stream the DCB API cannot serve. ``status`` is 400 (``error`` ``InvalidStream``: not
    a stream name; ``PartitionedStream``: more than one partition) or 404 (``UnknownStream``)."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def stream_dcb_log(
    name: str, stream: Callable[[str], StreamInfo | None], log_of: Callable[[Partition], EventLog]
) -> EventLog:
    """The log DCB calls on the stream ``name`` go to, or :class:`DcbStreamRefused` saying why
    not. ``stream`` looks a stream up for the caller (``server.streams.reachable``, which
    refuses a name the caller holds no right on before telling whether it exists);
    ``log_of`` gives a partition's log."""
    try:
        check_stream_name(name)
    except ValueError as exc:
        raise DcbStreamRefused(400, "InvalidStream", f"{exc}.") from None
    info = stream(name)
    if info is None:
        raise DcbStreamRefused(404, "UnknownStream", f"There is no stream {name}.")
    if len(info.partitions) != 1:
        raise DcbStreamRefused(
            400,
            "PartitionedStream",
            f"The stream {name} has {len(info.partitions)} partitions: a DCB condition needs"
            " one order of events, so DCB serves only streams of one partition.",
        )
    return log_of(info.partitions[0])


class ConditionNeedsRead(Refused):
    """An append condition from a writer who may not read the stream: the condition would
    tell whether stored events match it."""

    def __init__(self, stream: str) -> None:
        super().__init__(f"the read right on stream {stream} is needed for an append condition")


class DcbService:
    def __init__(self, events: EventLog) -> None:
        self._log = events

    def append(
        self, who: Principal, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        """The future of the last event's position, or of AppendConditionFailed,
        EventIdConflict; a refusal is raised at once. The store's own future, so a door can
        answer from its callback without a task per call.

        A writer without the read right is answered as if nothing stored were known to it:
        a condition is :class:`ConditionNeedsRead`, and an id stored before is
        :class:`~futoin_evt.domain.dcb.EventIdTaken` whatever its content (a retry of its
        own append too: telling a retry from another's event would tell the content). The
        position of its own new events is its to know."""
        guard = self._log.guard
        try:
            guard.read(who)
        except Refused:
            guard.write(who)  # without write either: refused for that
            if condition is not None:
                raise ConditionNeedsRead(guard.stream) from None
            return asyncio.ensure_future(self._log.append(who, BlindAppend(events)))
        return asyncio.ensure_future(self._log.append(who, events, condition=condition))

    async def read(self, who: Principal, request: ReadRequest) -> DcbReadResult:
        result = await self._first_page(who, request)
        if request.wait_seconds and not result._first and not request.backwards:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(request.wait_seconds, MAX_WAIT_SECONDS)):
                    while not result._first:
                        await self._log.wait_beyond(result.head)
                        result = await self._first_page(who, request)
        return result

    async def _first_page(self, who: Principal, request: ReadRequest) -> DcbReadResult:
        size = min(FIRST_PAGE_SIZE, request.limit if request.limit is not None else PAGE_SIZE)
        if size == 0:
            head = await self._log.last_given_id(who)
            return DcbReadResult(self._log, who, request, head, [])
        if request.backwards:
            before = request.after if request.after is not None else _NO_POSITION
            first, head = await self._log.dcb_read(
                who, request.query, after=None, before=before, limit=size
            )
        else:
            first, head = await self._log.dcb_read(
                who, request.query, after=request.after, before=None, limit=size
            )
        return DcbReadResult(self._log, who, request, head, first, size)
