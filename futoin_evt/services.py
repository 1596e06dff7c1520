"""The FTN18 services: event generator and consumer registration/polling.

Plain classes over the store; the executor maps wire names to these methods.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class CallContext:
    """Who calls, and what the reply may weigh."""

    principal: Principal
    max_response_bytes: int


class GenService:
    """``futoin.evt.gen``: add events."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def add_event(self, ctx: CallContext, params: dict[str, Any]) -> str:
        try:
            data_json = encode_event_data(params["type"], params["data"])
        except EventRejected as exc:
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        return str(await self._store.append(params["type"], data_json))


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
        reliable = component != LIVE_COMPONENT
        if reliable:
            if last_id:
                position = await self._store.acknowledge(user_id, component, last_id)
            else:
                position = await self._store.position(user_id, component)
            if position is None:
                raise FTN3Error(NOT_REGISTERED, f"Consumer is not registered: {component}")
        else:
            position = last_id
        page = await self._store.read_events(
            position,
            types=want,
            limit=MAX_EVENTS_PER_CALL,
            max_bytes=ctx.max_response_bytes - REPLY_ENVELOPE_BYTES,
        )
        if reliable and want is not None and page.count == 0 and page.head_id > position:
            await self._store.acknowledge(user_id, component, page.head_id)
        return EncodedJson(page.json)


async def ping(ctx: CallContext, params: dict[str, Any]) -> dict[str, Any]:
    """``futoin.ping``: echo."""
    return {"echo": params["echo"]}
