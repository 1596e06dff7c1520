"""``futoinevt.ops``: stream and consumer information, consumer administration, seeking.

Our own iface beside FTN18. Every call acts on the partition of the connection's path
(``events``/0 on ``/``), or the one its ``stream`` and ``partition`` name (see
:mod:`.doors`), and needs a right on its stream: ``read`` for every call (a caller
with no right at all on the stream is refused the same whether it exists or not). A user
sees, drops and seeks their own consumers; with ``manage`` on the stream (and as an admin),
everyone's. Another user's consumer is answered as UnknownConsumer, the same as one that
does not exist. ``acknowledge`` and ``seekConsumer`` never put a position past the
partition's head (InvalidRequest naming it). ``streamInfo`` shows ``held_back_by`` and
``discard_up_to`` (which is the lowest consumer's position) only when that consumer is the
caller's own or the caller may see everyone's.
"""

from __future__ import annotations

import calendar
import time
from typing import Any, Final

from ..domain.principal import Principal
from ..domain.rights import Right
from ..ftn3.calls import CallContext
from ..ftn3.errors import INVALID_REQUEST, FTN3Error
from ..ftn3.messages import EncodedJson
from ..log.consumers import PositionPastHead
from ..log.eventlog import EventLog
from ..log.retention import Discarder
from .push import PushService
from .services import REPLY_ENVELOPE_BYTES

UNKNOWN_CONSUMER: Final = "UnknownConsumer"
ALREADY_ACKNOWLEDGED: Final = "AlreadyAcknowledged"


def _age_seconds(ts: str | None) -> int | None:
    if ts is None:
        return None
    return max(int(time.time()) - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")), 0)


def _event_id(value: int | None) -> str | None:
    return str(value) if value else None


def _without_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class ConsumerOps:
    """The calls on one partition's consumers that a range reader (the Spark source) makes:
    served on each partition's path, each on its own log."""

    def __init__(self, events: EventLog) -> None:
        self._log = events
        self._consumers = events.consumers

    async def acknowledge(self, ctx: CallContext[Principal], params: dict[str, Any]) -> str | bool:
        try:
            position = await self._consumers.acknowledge(
                ctx.principal, params["component"], int(params["last_id"])
            )
        except PositionPastHead as exc:
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        if position is None:
            raise FTN3Error(UNKNOWN_CONSUMER, "No such consumer")
        return str(position) if position else False

    async def id_before(self, ctx: CallContext[Principal], params: dict[str, Any]) -> str | bool:
        position = await self._log.id_before(ctx.principal, params["ts"])
        return str(position) if position else False

    async def consumer_state(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, str]:
        state = await self._consumers.state(ctx.principal, params["component"])
        if state is None:
            raise FTN3Error(UNKNOWN_CONSUMER, "No such consumer")
        return {"position": str(state[0]), "head_id": str(state[1])}

    async def read_events(self, ctx: CallContext[Principal], params: dict[str, Any]) -> EncodedJson:
        after_id = int(params["after_id"])
        upto_id = int(params["upto_id"]) if params["upto_id"] is not None else None
        page = await self._consumers.read_range(
            ctx.principal,
            params["component"],
            after_id,
            upto_id,
            types=params["want"],
            max_bytes=ctx.max_response_bytes - REPLY_ENVELOPE_BYTES,
            data_as_text=params["data_as_text"],
        )
        if page is None:
            raise FTN3Error(UNKNOWN_CONSUMER, "No such consumer")
        if page.start_id > after_id:
            raise FTN3Error(
                ALREADY_ACKNOWLEDGED,
                f"Events up to {page.start_id} are acknowledged and may be discarded;"
                f" read after {page.start_id}",
            )
        return EncodedJson(page.json)


class OpsService(ConsumerOps):
    """Every ops call on the consumers of one partition."""

    def __init__(self, events: EventLog, push: PushService, discarder: Discarder) -> None:
        super().__init__(events)
        self._push = push
        self._discarder = discarder

    async def stream_info(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        who = ctx.principal
        partition = self._log.partition
        guard = self._consumers.guard
        bounds = await self._log.bounds(who)
        lowest = await self._consumers.lowest(who)
        held_back_by = None
        discard_up_to = None
        if lowest is None or guard.acts_for(who, lowest[1]):  # else another's position
            discard_up_to = _event_id(await self._discarder.bound(partition))
            if lowest is not None:
                held_back_by = {"user": lowest[0], "component": lowest[2]}
        record = await self._discarder.server_record(partition)
        expired = [
            {"user": user, "component": component}
            for user, component in record.expired
            if guard.acts_for(who, user)
        ]
        return _without_none({
            "stream": partition.stream,
            "partition": partition.number,
            "first_id": _event_id(bounds.first_id),
            "first_ts": bounds.first_ts,
            "last_id": _event_id(bounds.last_id),
            "last_ts": bounds.last_ts,
            "events": bounds.events,
            "discard_up_to": discard_up_to,
            "held_back_by": held_back_by,
            "discarded_total": record.discarded,
            "expired_consumers": expired,
        })  # fmt: skip

    async def list_consumers(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> list[Any]:
        rows = await self._consumers.listed(ctx.principal)
        partition_key = self._log.partition.key
        streams = {
            (s.user_id, s.component): s
            for s in self._push.all_streams
            if s.reliable and s.key[0] == partition_key
        }
        elsewhere = {(user, component) for key, user, component in self._push.pushing_elsewhere()
                     if key == partition_key}  # fmt: skip
        out = []
        for row in rows:
            stream = streams.get((row.user_id, row.component))
            out.append(_without_none({
                "user": row.user,
                "component": row.component,
                "position": _event_id(row.position),
                "behind": row.behind,
                "oldest_unread_age": _age_seconds(row.oldest_unread_ts),
                "registered": row.registered_at,
                "last_seen": row.last_seen_at,
                "push_connected": stream is not None
                or (row.user_id, row.component) in elsewhere,
                "push_retrying": stream.stats.retrying if stream else 0,
                "push_failures": stream.stats.groups_failed if stream else 0,
            }))  # fmt: skip
        return out

    async def drop_consumer(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        self._consumers.guard.some_right(ctx.principal, Right.READ)
        if not await self._consumers.drop(
            ctx.principal, params["user"], params["component"], reason="dropped by an operator call"
        ):
            raise FTN3Error(UNKNOWN_CONSUMER, "No such consumer")
        return True

    async def seek_consumer(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> str | bool:
        who = ctx.principal
        position = await self._log.id_before(who, params["ts"]) or 0
        try:
            sought = await self._consumers.seek(who, who.user_id, params["component"], position)
        except PositionPastHead as exc:  # never from a time (an id given before it): the rule
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        if not sought:
            raise FTN3Error(UNKNOWN_CONSUMER, "No such consumer")
        return str(position) if position else False
