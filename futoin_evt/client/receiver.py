"""Push receivers: get events as they happen, survive disconnects and server restarts.

A receiver connects, registers its component (reliable only), calls readyToReceive and then
answers the server's ``onEvents`` calls. Groups are handed to the application callback in
``seq`` order, one at a time; the group is acknowledged when the callback returns, and an
exception in the callback makes the server send the group again later. Events the callback
already saw (a group sent again after a reconnect) are left out, so within one receiver the
callback sees every event once, in order. When the connection goes away the receiver
reconnects with a growing delay, forever, until :meth:`Receiver.stop`.

A :class:`LiveReceiver` is the same without registration: it sees new events while it is
connected, and groups the server dropped for it show up as gaps in ``seq`` only.

Example::

    async def handle(events: list[Event]) -> None:
        ...

    receiver = ReliableReceiver(url, credentials="shop:s3cret", component="BILLING",
                                on_events=handle)
    await receiver.run()        # until receiver.stop()

or, as an async iterator (an event is acknowledged once the iterator has yielded it)::

    async for event in ReliableReceiver(url, ...).events():
        ...
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final

from ..domain.stream import LIVE_COMPONENT, check_component, check_event_type
from ..ftn3.errors import FTN3Error
from ..storage.head import HeadWatch
from .aio import CommError, Event, FTN3Client, RemoteError
from .reconnect import Reconnect

logger = logging.getLogger(__name__)

PUSH: Final = "futoin.evt.push:1.1"
RECEIVER: Final = "futoin.evt.receiver"

OnEvents = Callable[[list[Event]], Awaitable[None]]


class Receiver:
    """Base of :class:`ReliableReceiver` and :class:`LiveReceiver`. A component or a wanted
    type that no server would take is a ValueError here, with the rule it breaks."""

    reliable: bool = True

    def __init__(
        self,
        url: str,
        *,
        credentials: str,
        component: str,
        on_events: OnEvents | None = None,
        want: Sequence[str] | None = None,
        reconnect_initial: float = 0.05,
        reconnect_max: float = 5.0,
    ) -> None:
        # checked here, not by a refusal the reconnecting loop would meet again and again
        # (and a reliable receiver registers its component before it says what it wants)
        self.url = url
        self.component = check_component(component)
        self.want = [check_event_type(t) for t in want] if want is not None else None
        self._credentials = credentials
        self._on_events = on_events
        self._reconnect_initial = reconnect_initial
        self._reconnect_max = reconnect_max
        self._stopped = asyncio.Event()
        self._client: FTN3Client | None = None
        #: Highest event id handed to the callback; older ones sent again are left out.
        self.last_id = 0
        #: :attr:`last_id` to wait on (``await receiver.progress.wait_beyond(id - 1)``).
        self.progress = HeadWatch()
        #: How many times the receiver (re)connected and called readyToReceive.
        self.sessions = 0
        self.ready = asyncio.Event()
        self._next_seq = 0
        self._turn = asyncio.Condition()

    async def run(self) -> None:
        """Receive until :meth:`stop`; reconnects by itself. Cancelling it is safe."""
        tries = Reconnect(
            logger,
            f"receiver {self.component}",
            self.url,
            initial=self._reconnect_initial,
            maximum=self._reconnect_max,
        )
        while not self._stopped.is_set():
            try:
                await self._session()
                tries.worked()  # it had worked: start over quickly
                delay = tries.waited()
            except (CommError, OSError, TimeoutError, RemoteError) as exc:
                delay = tries.failed(exc)
            if self._stopped.is_set():
                break
            try:
                async with asyncio.timeout(delay):
                    await self._stopped.wait()
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stopped.set()
        if self._client is not None:
            self._client.start_closing()

    async def events(self, buffer: int = 1000) -> AsyncIterator[Event]:
        """Run the receiver and yield its events; stops when the iterator is closed."""
        queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=buffer)

        async def enqueue(events: list[Event]) -> None:
            for event in events:
                await queue.put(event)

        self._on_events = enqueue
        runner = asyncio.create_task(self.run())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, runner}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    runner.result()  # the receiver ended: re-raise why
                    return
                yield getter.result()
        finally:
            self.stop()
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    async def _session(self) -> None:
        client = await FTN3Client.connect(self.url, credentials=self._credentials)
        self._client = client
        try:
            self._next_seq = 0
            client.on_request(RECEIVER, "onEvents", self._receive)
            if self.reliable:
                await client.call(PUSH, "registerConsumer", {"component": self.component})
            await client.call(
                PUSH, "readyToReceive", {"component": self.component, "want": self.want}
            )
            self.sessions += 1
            self.ready.set()
            await client.wait_closed()
        finally:
            self.ready.clear()
            self._client = None
            await client.close()
            async with self._turn:
                self._turn.notify_all()  # groups waiting for their turn give up

    async def _receive(self, params: dict[str, Any]) -> bool:
        seq: int = params["seq"]
        client = self._client
        async with self._turn:
            if self.reliable:
                await self._turn.wait_for(
                    lambda: self._next_seq >= seq or self._client is not client
                )
                if self._client is not client:
                    raise FTN3Error("InternalError", "the connection is closing")
                if self._next_seq > seq:
                    return True  # sent again after a slow reply: handled already
            events = [
                Event.from_wire(raw) for raw in params["events"] if int(raw["id"]) > self.last_id
            ]
            if events and self._on_events is not None:
                await self._on_events(events)  # an exception here: the server sends it again
            if events:
                self.last_id = events[-1].id
                self.progress.advance(self.last_id)
            self._next_seq = seq + 1
            self._turn.notify_all()
        return True


class ReliableReceiver(Receiver):
    """A registered consumer: nothing is lost, the server keeps its position."""

    reliable = True


class LiveReceiver(Receiver):
    """New events while connected; nothing is stored, groups may be dropped when slow."""

    reliable = False

    def __init__(
        self,
        url: str,
        *,
        credentials: str,
        on_events: OnEvents | None = None,
        want: Sequence[str] | None = None,
        reconnect_initial: float = 0.05,
        reconnect_max: float = 5.0,
    ) -> None:
        super().__init__(
            url,
            credentials=credentials,
            component=LIVE_COMPONENT,
            on_events=on_events,
            want=want,
            reconnect_initial=reconnect_initial,
            reconnect_max=reconnect_max,
        )
