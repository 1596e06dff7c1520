"""``futoin.evt.notify``: selector subscriptions and GET-EVENTS over FTN3 (WebSocket).

``subscribe`` starts a task that pushes the matching notifications back on the caller's
connection as ``futoin.evt.notify.receiver:1.0:onNotify`` requests, a group at a time with a
few groups in flight; ``seq`` counts groups from 0 per subscription. Notifications are live:
nothing is stored for the subscriber, and a reply (even an error) only frees room in the
window. A subscription ends with ``unsubscribe`` or with its connection.

``stream`` (default ``events``) names the stream a subscription reads, every partition of
it, and GET-EVENTS describes. ``after`` starts after given ids instead of at the newest
events: one id per partition, in partition order, separated by commas (``"12,0,7,3"``),
each as the notifications' ``id`` attribute gives it for their ``partition``.

``subscribe`` and ``getEvents`` need ``read`` on the stream: without it they are refused
(``SecurityError``) whether the stream exists or not. A subscription ends when that right is
revoked: its connection is closed with WebSocket code 1008 and the refusal's sentence (as a
push stream's is), and so it is, with ``the stream orders was dropped``, when its stream is
dropped (a new ``subscribe`` then gets ``UnknownStream``), and with the error's sentence when
a read finds a damaged event (:class:`~futoin_evt.log.eventlog.DamagedEvent`). Management
events reach a
subscriber only about streams they may read (see
:func:`~futoin_evt.notify.live.management_visible_to`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ..domain.management import ManagementBus
from ..domain.notification import Notification
from ..domain.partition import DEFAULT_STREAM
from ..domain.principal import Principal
from ..domain.rights import Right
from ..ftn3.calls import CallContext, Deferred, PeerLink
from ..ftn3.errors import INVALID_REQUEST, FTN3Error
from ..ftn3.messages import Response, encode_json
from ..log.access import AccessDenied
from ..log.eventlog import DamagedEvent
from ..notify.live import (
    LiveEvents,
    LiveStreams,
    Subscription,
    UnknownStream,
    management_visible_to,
    start_positions,
)
from ..notify.message import NotifyError, Transformation, encoded, real_message
from ..notify.selector import Selector, compile_selector

logger = logging.getLogger(__name__)

ON_NOTIFY: Final = "futoin.evt.notify.receiver:1.0:onNotify"
INVALID_SELECTOR: Final = "InvalidSelector"
INVALID_TRANSFORMATION: Final = "InvalidTransformation"
TOO_MANY: Final = "TooManySubscriptions"
UNKNOWN_STREAM: Final = "UnknownStream"
#: Subscriptions one connection may hold.
MAX_PER_CONNECTION: Final = 64
#: Groups in flight per subscription; notifications per group; bytes of a group's messages.
WINDOW: Final = 4
GROUP_MESSAGES: Final = 1000
GROUP_BYTES: Final = 1024 * 1024
REPLY_TIMEOUT: Final = 30.0


@dataclass(slots=True)
class _Pushing:
    """One subscription's push task and what it has sent."""

    sid: str
    link: PeerLink
    subscription: Subscription
    transformation: Transformation | None
    in_flight: int = 0
    seq: itertools.count[int] = field(default_factory=itertools.count)
    #: Encoded messages read but not yet sent (a group full by bytes leaves some).
    queued: deque[str] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    #: Stops watching the subscriber's read right on the stream.
    unwatch: Callable[[], None] = field(default=lambda: None)

    async def run(self) -> None:
        subscription = self.subscription.start()
        wake = subscription.wake
        stop_waiting = self.link.on_writable(wake.set)
        self.link.closed.add_done_callback(lambda _closed: wake.set())
        try:
            while not self.link.closed.done():
                wake.clear()
                gone = subscription.gone
                if gone is not None:  # the stream was dropped: its subscriber is told so
                    self.link.close_refused(str(gone))
                    return
                if self.in_flight < WINDOW and self.link.writable:
                    if not self.queued and subscription.has_more():
                        batch = await subscription.poll(GROUP_MESSAGES)
                        form = ("ftn3", self.transformation)
                        self.queued.extend(encoded(n, form, _message_json) for n in batch)
                    if self.queued:
                        self._send_group()
                        continue
                await wake.wait()
        finally:
            stop_waiting()
            subscription.close()

    def _send_group(self) -> None:
        parts: list[str] = []
        size = 0
        while self.queued and len(parts) < GROUP_MESSAGES:
            if parts and size + len(self.queued[0]) > GROUP_BYTES:
                break
            parts.append(self.queued.popleft())
            size += len(parts[-1]) + 1
        params = f'{{"sid":"{self.sid}","seq":{next(self.seq)},"messages":[{",".join(parts)}]}}'
        self.in_flight += 1
        reply = self.link.request(ON_NOTIFY, params, REPLY_TIMEOUT)
        reply.add_done_callback(self._replied)

    def _replied(self, reply: Deferred[Response]) -> None:
        if not reply.cancelled():
            reply.exception()  # looked at: a live subscriber's failure stops nothing
        self.in_flight -= 1
        self.subscription.wake.set()


def _message_json(notification: Notification, shape: Transformation | None) -> str:
    """One message of ``onNotify`` as JSON text."""
    return encode_json(real_message(notification, shape))


class NotifyService:
    """The calls of ``futoin.evt.notify``."""

    def __init__(self, streams: LiveStreams, notices: ManagementBus | None = None) -> None:
        #: The shared readers it subscribes to.
        self.streams = streams
        self._notices = notices
        #: By connection (its PeerLink).
        self._subscriptions: dict[object, dict[str, _Pushing]] = {}
        self._sids = itertools.count(1)
        self._compiling = asyncio.Lock()

    @property
    def connections(self) -> int:
        """Connections holding a subscription."""
        return len(self._subscriptions)

    def _of_stream(self, name: str | None, who: Principal) -> list[LiveEvents]:
        try:
            return self.streams.of_stream(name, who)
        except UnknownStream as exc:
            raise FTN3Error(UNKNOWN_STREAM, str(exc)) from None

    async def get_events(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, list[str]]:
        try:
            return await self.streams.event_types(
                params.get("stream"), params["event_type"], ctx.principal
            )
        except UnknownStream as exc:
            raise FTN3Error(UNKNOWN_STREAM, str(exc)) from None

    async def subscribe(self, ctx: CallContext[Principal], params: dict[str, Any]) -> str:
        link = ctx.link
        if link is None:
            raise FTN3Error("SecurityError", "Bi-directional channel is required")
        if len(self._subscriptions.get(link, ())) >= MAX_PER_CONNECTION:  # before any work
            raise FTN3Error(TOO_MANY, f"at most {MAX_PER_CONNECTION} subscriptions per connection")
        who = ctx.principal
        stream = params.get("stream")
        self._of_stream(stream, who)  # the right, then the stream, before anything else
        try:
            selector = await self._compile(params["selector"]) if params["selector"] else None
        except NotifyError as exc:
            raise FTN3Error(INVALID_SELECTOR, str(exc)) from None
        try:
            shape = params["transformation"]
            transformation = Transformation.parse(shape) if shape is not None else None
        except NotifyError as exc:
            raise FTN3Error(INVALID_TRANSFORMATION, str(exc)) from None
        lives = self._of_stream(stream, who)  # again: compiling waited for a turn
        try:
            positions = start_positions(lives, params["after"])
        except NotifyError as exc:
            raise FTN3Error(INVALID_REQUEST, str(exc)) from None
        mine = self._subscriptions.setdefault(link, {})
        if len(mine) >= MAX_PER_CONNECTION:
            raise FTN3Error(TOO_MANY, f"at most {MAX_PER_CONNECTION} subscriptions per connection")
        subscription = Subscription.of_partitions(
            list(zip(lives, positions, strict=True)),
            self._notices,
            selector,
            management_visible_to(who, self.streams.access),
            self.streams.growing(stream),
        )
        sid = str(next(self._sids))
        pushing = _Pushing(sid, link, subscription, transformation)
        mine[sid] = pushing
        pushing.task = asyncio.create_task(pushing.run(), name=f"notify {sid}")
        pushing.task.add_done_callback(lambda task: self._ended(link, sid, task))
        name = stream or DEFAULT_STREAM
        pushing.unwatch = self.streams.watch(who, name, lambda: self._revoked(pushing, name))
        return sid

    @staticmethod
    def _revoked(pushing: _Pushing, stream: str) -> None:
        """The subscriber's read right went: the subscription ends, and its connection is
        closed with the refusal (FTN3 has no other way to tell the subscriber)."""
        if pushing.task is not None:
            pushing.task.cancel()
        pushing.link.close_refused(str(AccessDenied(Right.READ, stream)))

    async def _compile(self, text: str) -> Selector:
        """Selectors are compiled one per turn of the event loop: a large one takes tens of
        milliseconds, and a thousand subscribe calls at once would otherwise hold the loop
        (every other connection) for as many seconds before it read anything again."""
        async with self._compiling:
            await asyncio.sleep(0)  # the others queue behind; this one gets a turn of its own
            return compile_selector(text)

    def unsubscribe(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        pushing = self._subscriptions.get(ctx.link, {}).get(params["sid"])
        if pushing is None or pushing.task is None:
            return False
        pushing.task.cancel()
        return True

    def _ended(self, link: PeerLink, sid: str, task: asyncio.Task[None]) -> None:
        mine = self._subscriptions.get(link, {})
        pushing = mine.pop(sid, None)
        if pushing is not None:
            pushing.unwatch()
        if not mine:
            self._subscriptions.pop(link, None)
        failure = None if task.cancelled() else task.exception()
        if isinstance(failure, DamagedEvent):  # logged once per event by the store
            link.close_refused(str(failure))
        elif failure is not None:
            logger.error("notification subscription %s failed", sid, exc_info=failure)

    async def close(self) -> None:
        tasks = [p.task for mine in self._subscriptions.values() for p in mine.values() if p.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
