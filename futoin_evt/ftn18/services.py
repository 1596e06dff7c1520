"""The FTN18 services: event generator and consumer registration/polling.

Plain classes over a partition's event log; the executor maps wire names to these methods.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final

from ..domain.principal import Principal
from ..domain.stream import (
    LIVE_COMPONENT,
    MAX_EVENTS_PER_CALL,
    EventDraft,
    UserId,
)
from ..ftn3.calls import CallContext, Pending
from ..ftn3.errors import INVALID_REQUEST, FTN3Error
from ..ftn3.messages import EncodedJson
from ..log.consumers import PositionPastHead
from ..log.eventlog import EventLog, EventPage, retrieve_quietly

logger = logging.getLogger(__name__)

NOT_REGISTERED: Final = "NotRegistered"
LIVE_NOT_ALLOWED: Final = "LiveNotAllowed"

#: Bytes of a reply around its result: ``{"r":`` ... ``,"rid":"C1234567890"}``.
REPLY_ENVELOPE_BYTES: Final = 64


class GenService:
    """``futoin.evt.gen``: add events."""

    def __init__(self, events: EventLog) -> None:
        self._log = events

    def add_event(self, ctx: CallContext[Principal], params: dict[str, Any]) -> Pending:
        """The reply (the id as a string) goes out once the event is durable; with a key
        (1.2), the first event's id when that key is known (see :meth:`EventLog.append`).
        A refusal is answered by the executor (:data:`~futoin_evt.server.executor.FAULTS`)."""
        key = params.get("key")
        appended = self._log.append(
            ctx.principal,
            (EventDraft(params["type"], params["data"]),),
            keys=None if key is None else (key,),
        )
        return Pending(appended, _id_json)


def _id_json(event_id: int) -> EncodedJson:
    """An EventID (a string of digits) as JSON, without an encoder."""
    return EncodedJson(f'"{event_id}"')


#: Read-ahead pages kept at most (one per consumer that is reading through a backlog).
MAX_READ_AHEADS: Final = 64
#: An unused read-ahead page is dropped after this long.
READ_AHEAD_SECONDS: Final = 30.0


@dataclass(slots=True)
class _ReadAhead:
    """The page a consumer will most likely ask for next, read while it handles this one."""

    after_id: int
    want: tuple[str, ...] | None
    max_bytes: int
    page: asyncio.Task[EventPage]
    expiry: asyncio.TimerHandle


class PollService:
    """``futoin.evt.poll``: consumer registration and polling.

    A reliable consumer's ``last_id`` acknowledges everything up to it; the stored position
    only moves forward and is durable before the reply. A ``last_id`` past the partition's
    head is refused (InvalidRequest naming the head): nothing not yet given is acknowledged.
    With ``want``, when nothing wanted is left the position skips over the unwanted events
    (FTN18 2.2.3), so they do not hold back discarding. LIVE polls store nothing.

    A consumer working through a backlog gets a full page each time; while it processes one,
    the next is read ahead (events below the newest committed id never change), so a drain
    costs the consumer's time or the server's, not both.
    """

    def __init__(self, events: EventLog) -> None:
        self._log = events
        self._consumers = events.consumers
        self._read_aheads: dict[tuple[UserId, str], _ReadAhead] = {}

    async def register_consumer(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        component = params["component"]
        if component == LIVE_COMPONENT:
            raise FTN3Error(LIVE_NOT_ALLOWED, "LIVE consumers do not register")
        await self._consumers.register(ctx.principal, component, transport="ws")
        return True

    async def poll_events(self, ctx: CallContext[Principal], params: dict[str, Any]) -> EncodedJson:
        component: str = params["component"]
        last_id = int(params["last_id"]) if params["last_id"] is not None else 0
        want: list[str] | None = params["want"]
        who = ctx.principal
        max_bytes = ctx.max_response_bytes - REPLY_ENVELOPE_BYTES
        if component == LIVE_COMPONENT:
            page = await self._log.read_page(
                who, last_id, types=want, max_bytes=max_bytes, ftn18_only=True
            )
            return EncodedJson(page.json)
        try:
            page = await self._reliable_page(who, component, last_id, want, max_bytes)
        except PositionPastHead as exc:  # a last_id never given: it acknowledges nothing
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        if page.count == 0 and page.head_id > page.start_id:  # all filtered out: skip them
            await self._consumers.acknowledge(who, component, page.head_id)
        if page.count == MAX_EVENTS_PER_CALL or page.truncated:
            self._read_ahead(who, component, page.last_id, want, max_bytes)
        return EncodedJson(page.json)

    async def _reliable_page(
        self, who: Principal, component: str, last_id: int, want: list[str] | None, max_bytes: int
    ) -> EventPage:
        ahead = self._take_read_ahead((who.user_id, component), last_id, want, max_bytes)
        if ahead is not None:
            position = await self._consumers.acknowledge(who, component, last_id)
            if position is None:
                ahead.cancel()
                raise FTN3Error(NOT_REGISTERED, f"Consumer is not registered: {component}")
            if position == last_id:
                try:
                    page = await ahead
                except Exception:  # read again below, and fail there if it still fails
                    logger.debug("read-ahead for %s failed", component, exc_info=True)
                else:  # a short page ended at the newest event as it was before this poll
                    if page.count == MAX_EVENTS_PER_CALL or page.truncated:
                        return page
            else:
                ahead.cancel()  # another poller moved the position further
        # The read starts where the acknowledgement puts the position; both run at once, and
        # the reply waits until the acknowledgement is durable.
        read = self._consumers.read(
            who, component, at_least=last_id, types=want, max_bytes=max_bytes, ftn18_only=True
        )
        consumer_page: EventPage | None
        if last_id:
            # Any: gather gives a list, not the stubs' tuple (a compiled build checks types)
            both: Any = asyncio.gather(read, self._consumers.acknowledge(who, component, last_id))
            consumer_page = (await both)[0]
        else:
            consumer_page = await read
        if consumer_page is None:
            raise FTN3Error(NOT_REGISTERED, f"Consumer is not registered: {component}")
        return consumer_page

    def _read_ahead(
        self, who: Principal, component: str, after_id: int, want: list[str] | None, max_bytes: int
    ) -> None:
        consumer = (who.user_id, component)
        self._drop_read_ahead(consumer)
        if len(self._read_aheads) >= MAX_READ_AHEADS:
            return
        page = asyncio.ensure_future(
            self._log.read_page(who, after_id, types=want, max_bytes=max_bytes, ftn18_only=True)
        )
        page.add_done_callback(retrieve_quietly)
        expiry = asyncio.get_running_loop().call_later(
            READ_AHEAD_SECONDS, self._drop_read_ahead, consumer
        )
        wanted = tuple(want) if want is not None else None
        self._read_aheads[consumer] = _ReadAhead(after_id, wanted, max_bytes, page, expiry)

    def _take_read_ahead(
        self, consumer: tuple[UserId, str], last_id: int, want: list[str] | None, max_bytes: int
    ) -> asyncio.Task[EventPage] | None:
        ahead = self._read_aheads.pop(consumer, None)
        if ahead is None:
            return None
        ahead.expiry.cancel()
        wanted = tuple(want) if want is not None else None
        if (ahead.after_id, ahead.want, ahead.max_bytes) != (last_id, wanted, max_bytes):
            ahead.page.cancel()
            return None
        return ahead.page

    def _drop_read_ahead(self, consumer: tuple[UserId, str]) -> None:
        ahead = self._read_aheads.pop(consumer, None)
        if ahead is not None:
            ahead.expiry.cancel()
            ahead.page.cancel()


def ping(ctx: CallContext[Principal], params: dict[str, Any]) -> dict[str, Any]:
    """``futoin.ping``: echo."""
    return {"echo": params["echo"]}
