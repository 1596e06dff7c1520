"""The FTN18 services: event generator and consumer registration/polling.

Plain classes over the store; the executor maps wire names to these methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .auth import Principal
from .ftn3.errors import INVALID_REQUEST, FTN3Error
from .ftn3.messages import EncodedJson
from .model import LIVE_COMPONENT, MAX_EVENTS_PER_CALL, EventRejected, encode_event_data
from .storage.sqlite import SqliteStore

NOT_REGISTERED: Final = "NotRegistered"
LIVE_NOT_ALLOWED: Final = "LiveNotAllowed"

#: Bytes of a reply around its result: ``{"r":`` ... ``,"rid":"C1234567890"}``.
REPLY_ENVELOPE_BYTES: Final = 64


@dataclass(slots=True)
class Pending:
    """A result that arrives with ``future``; ``then`` turns its value into the result."""

    future: asyncio.Future[Any]
    then: Callable[[Any], Any] | None = None


@dataclass(slots=True)
class CallContext:
    """Who calls, and what the reply may weigh."""

    principal: Principal
    max_response_bytes: int


class GenService:
    """``futoin.evt.gen``: add events."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def add_event(self, ctx: CallContext, params: dict[str, Any]) -> Pending:
        """The reply (the id as a string) goes out once the event is durable."""
        try:
            data_json = encode_event_data(params["type"], params["data"])
        except EventRejected as exc:
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        return Pending(self._store.submit_append(params["type"], data_json), str)


class PollService:
    """``futoin.evt.poll``: consumer registration and polling.

    A reliable consumer's ``last_id`` acknowledges everything up to it; the stored position
    only moves forward and is durable before the reply. With ``want``, when nothing wanted is
    left the position skips over the unwanted events (FTN18 2.2.3), so they do not hold back
    discarding. LIVE polls store nothing.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def register_consumer(self, ctx: CallContext, params: dict[str, Any]) -> bool:
        component = params["component"]
        if component == LIVE_COMPONENT:
            raise FTN3Error(LIVE_NOT_ALLOWED, "LIVE consumers do not register")
        await self._store.register_consumer(ctx.principal.user_id, component)
        return True

    async def poll_events(self, ctx: CallContext, params: dict[str, Any]) -> EncodedJson:
        component: str = params["component"]
        last_id = int(params["last_id"]) if params["last_id"] is not None else 0
        want: list[str] | None = params["want"]
        user_id = ctx.principal.user_id
        max_bytes = ctx.max_response_bytes - REPLY_ENVELOPE_BYTES
        if component == LIVE_COMPONENT:
            page = await self._store.read_events(
                last_id, types=want, limit=MAX_EVENTS_PER_CALL, max_bytes=max_bytes
            )
            return EncodedJson(page.json)
        # The read starts where the acknowledgement puts the position; both run at once, and
        # the reply waits until the acknowledgement is durable.
        read = self._store.read_consumer_events(
            user_id,
            component,
            at_least=last_id,
            types=want,
            limit=MAX_EVENTS_PER_CALL,
            max_bytes=max_bytes,
        )
        if last_id:
            consumer_page, _position = await asyncio.gather(
                read, self._store.acknowledge(user_id, component, last_id)
            )
        else:
            consumer_page = await read
        if consumer_page is None:
            raise FTN3Error(NOT_REGISTERED, f"Consumer is not registered: {component}")
        page = consumer_page
        if want is not None and page.count == 0 and page.head_id > page.start_id:
            await self._store.acknowledge(user_id, component, page.head_id)
        return EncodedJson(page.json)


def ping(ctx: CallContext, params: dict[str, Any]) -> dict[str, Any]:
    """``futoin.ping``: echo."""
    return {"echo": params["echo"]}
