"""The live tail: a partition's events as they come, with a selector and the attributes
asked for, pushed to the page as Server-Sent Events.

A tail reads through the server's shared reader of its partition
(:class:`~futoin_evt.notify.live.LiveStreams`, the one the notification service reads
through): many tails of one partition cost one reader. A tail ends when the read right it
needs is revoked, when its stream is dropped, with its session (:mod:`.sessions`), and with
the server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final
from urllib.parse import quote

from ..domain.management import ManagementBus
from ..domain.notification import Notification
from ..domain.partition import Partition
from ..domain.rights import Right
from ..log.access import AccessDenied
from ..log.eventlog import DamagedEvent
from ..notify.live import LiveStreams, Subscription, UnknownStream, management_visible_to
from ..notify.message import NotifyError, Transformation, real_message
from ..notify.selector import compile_selector
from .exchange import SECURITY_HEADERS, Call, ConsoleResponse, PageError, Routes
from .formatting import sentence, words
from .pages import Pages
from .sessions import Tails

#: A live tail ends after this long (the page's EventSource opens a new one).
TAIL_SECONDS: Final = 3600.0
TAIL_HEARTBEAT_SECONDS: Final = 15.0
#: Why a live tail ended with its session (a logout, an eviction, anywhere).
SESSION_ENDED: Final = "The session has ended: log in again."
#: Notifications per message pushed to a tail page.
TAIL_BATCH: Final = 100


class TailPages:
    def __init__(
        self, pages: Pages, live: LiveStreams, notices: ManagementBus, closing: asyncio.Event
    ) -> None:
        """``closing``: set when the server shuts down (the tails end at once)."""
        self._pages = pages
        self._live = live
        self._notices = notices
        self._closing = closing
        #: Live tails open now.
        self.open = 0

    def routes(self) -> Routes:
        return {
            ("GET", "/tail"): self._tail_page,
            ("GET", "/tail/stream"): self._tail_stream,
        }

    def _tail_spec(self, call: Call) -> tuple[Partition, str, Transformation | None, str]:
        """The partition, selector text, transformation, and what is wrong with them."""
        query = call.query
        partition = self._pages.partition(call, query)
        selector = query.get("selector", "").strip()
        names = words(query.get("attributes", ""))
        try:
            if selector:
                compile_selector(selector)
            shape = Transformation.parse({"requestedAttributes": names}) if names else None
        except NotifyError as exc:
            return partition, selector, None, str(exc)
        return partition, selector, shape, ""

    async def _tail_page(self, call: Call) -> ConsoleResponse:
        partition, selector, _shape, message = self._tail_spec(call)
        live = bool(call.query.get("run")) and not message
        source = ""
        if live:
            source = f"{self._pages.base}/tail/stream?" + "&".join(
                f"{k}={quote(call.query.get(k, ''), safe='')}"
                for k in ("stream", "partition", "selector", "attributes")
            )
        return self._pages.page(
            call.session,
            "tail.html",
            partition=partition,
            selector=selector,
            attributes=call.query.get("attributes", ""),
            message=message,
            source=source,
            rows=self._pages.config.tail_rows,
            principal=call.principal,
        )

    async def _tail_stream(self, call: Call) -> ConsoleResponse:
        session = call.session
        assert session is not None
        partition, selector, shape, message = self._tail_spec(call)
        if message:
            raise PageError(400, message)
        config, sessions = self._pages.config, self._pages.sessions
        if self.open >= config.max_tails:
            raise PageError(503, "Too many live tails are open: close one.")
        if sessions.tails_open(session) >= config.tails_per_session:
            raise PageError(429, "This session has too many live tails open: close one.")
        try:
            live = self._live.of_stream(partition.stream)[partition.number]
        except (UnknownStream, IndexError):
            raise PageError(404, f"No such stream and partition: {partition}.") from None
        who, access = session.principal, self._pages.streams.access
        own = management_visible_to(who)

        def visible(notice: Notification) -> bool:
            return own(notice) and (
                notice.stream is None or access.allows(who, Right.READ, notice.stream)
            )

        subscription = Subscription(
            live,
            self._notices,
            compile_selector(selector) if selector else None,
            live.events.head,
            management=visible,
        ).start()
        revoked = asyncio.Event()
        stop_watching = access.watch(who, Right.READ, partition.stream, revoked.set)
        self.open += 1
        tails = sessions.tail_opened(session)

        def ended() -> None:
            stop_watching()
            subscription.close()
            self.open -= 1
            sessions.tail_closed(session)

        return ConsoleResponse(
            200,
            content_type="text/event-stream; charset=utf-8",
            headers=[("Cache-Control", "no-store"), *SECURITY_HEADERS],
            stream=_pushed(
                subscription,
                shape,
                tails,
                self._closing,
                ended,
                revoked,
                sentence(AccessDenied(Right.READ, partition.stream)),
            ),
        )


async def _pushed(
    subscription: Subscription,
    shape: Transformation | None,
    tails: Tails,
    closing: asyncio.Event,
    ended: Callable[[], None],
    revoked: asyncio.Event,
    refusal: str,
) -> AsyncGenerator[bytes, None]:
    """Server-Sent Events: one ``data:`` line per batch (a JSON array), comments to keep
    the connection alive; ends with the server, or after :data:`TAIL_SECONDS`, or with an
    ``ended`` event carrying why: once the session ends (anywhere), once ``revoked`` is set
    (``refusal``), or once the stream is dropped."""
    deadline = time.monotonic() + TAIL_SECONDS
    stop: asyncio.Future[Any] = asyncio.ensure_future(closing.wait())
    taken: asyncio.Future[Any] = asyncio.ensure_future(revoked.wait())
    gone: asyncio.Future[Any] = asyncio.ensure_future(tails.ended.wait())
    reading: asyncio.Future[Any] | None = None
    try:
        yield b"retry: 3000\n\n"
        while not closing.is_set() and time.monotonic() < deadline:
            why = SESSION_ENDED if tails.ended.is_set() else refusal if revoked.is_set() else None
            if why is not None:
                yield f"event: ended\ndata: {json.dumps(why)}\n\n".encode()
                return
            if reading is None:
                reading = asyncio.ensure_future(subscription.next(TAIL_BATCH))
            await asyncio.wait(
                (reading, stop, taken, gone),
                timeout=TAIL_HEARTBEAT_SECONDS,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if revoked.is_set() or tails.ended.is_set():
                continue  # what was read after the end is not sent
            if not reading.done():
                yield b": alive\n\n"
                continue
            failed = reading.exception()
            if isinstance(failed, UnknownStream | DamagedEvent):  # dropped; a damaged event
                yield f"event: ended\ndata: {json.dumps(sentence(failed))}\n\n".encode()
                return
            batch, reading = reading.result(), None
            messages = [
                {"id": n.id, "type": n.type, "ts": n.ts, "message": real_message(n, shape)}
                for n in batch
            ]
            yield f"data: {json.dumps(messages, separators=(',', ':'))}\n\n".encode()
    finally:
        for waiting in (stop, taken, gone):
            waiting.cancel()
        if reading is not None:
            reading.cancel()
        ended()
