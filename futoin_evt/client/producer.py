"""A reliable producer: every event added is stored exactly once, in order, across lost
connections and server restarts, with no code of the caller's.

Each event gets a key, the producer's id and a counter (``<id>:<n>``), and is kept until the
server acknowledges it. The producer sends up to ``max_in_flight`` events at a time on one
connection; when the connection goes away (or the server answers that its database is
unavailable) it reconnects with a growing delay and sends every event not acknowledged yet
again, in order. The server stores nothing for a key it stored within its dedup window
(``serve --dedup-window``, 2 minutes by default) and answers the first event's id, so an
event whose reply was lost is not stored twice; one that never reached the server is
stored now. An event the server refuses (``InvalidRequest``, ``SecurityError``: sending it
again cannot help) fails on its own future and is dropped.

Keys are per partition: connect to a partition's own path (``/NAME/P``, or ``/`` for
``events``/0; ``/NAME`` of a stream with one partition), not to ``/NAME`` of a stream with
several, whose connections are spread over the partitions. Exactly once holds while an
event is acknowledged within the window: a producer cut off from the server for longer may
store an event again. Order holds across lost connections and restarts; when the database
fails a commit (an outage), events sent after the one that failed may be stored before it
is sent again (``max_in_flight=1`` keeps the order then too).

Example::

    async with ReliableProducer(url, credentials="shop:s3cret") as producer:
        for order in orders:
            producer.submit("ORDER_PLACED", order)   # a future of the event's id
        event_id = await producer.add_event("ORDER_PAID", {"order": 17})
    # leaving the block waited until every event was acknowledged
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from ..ftn3.errors import DEFENSE_REJECTED, INTERNAL_ERROR
from .aio import CommError, FTN3Client, RemoteError, add_event_call
from .reconnect import Reconnect

logger = logging.getLogger(__name__)

#: A producer id: the key is ``<id>:<counter>``, at most 64 characters in all.
PRODUCER_ID_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,43}\Z")
#: Errors after which the same call may succeed later: the event is sent again.
RETRIED_ERRORS: Final = frozenset({INTERNAL_ERROR, DEFENSE_REJECTED})


@dataclass(slots=True)
class _Event:
    type: str
    data: Any
    key: str
    future: asyncio.Future[int]
    #: The session it was last sent in (0: not yet).
    sent_in: int = 0
    settled: bool = False


@dataclass(slots=True)
class _Session:
    number: int
    client: FTN3Client
    calls: set[asyncio.Task[None]] = field(default_factory=set)
    #: Why the session ends (a lost connection, a retried error).
    failed: BaseException | None = None


class ReliableProducer:
    """Adds events exactly once, in order; see the module's documentation."""

    def __init__(
        self,
        url: str,
        *,
        credentials: str,
        producer_id: str | None = None,
        max_in_flight: int = 32,
        reconnect_initial: float = 0.05,
        reconnect_max: float = 5.0,
    ) -> None:
        """``producer_id``: the first part of every key (random when not given; one given
        must be unique to this producer among those of the partition)."""
        if producer_id is None:
            producer_id = secrets.token_hex(8)
        if PRODUCER_ID_RE.match(producer_id) is None:
            raise ValueError(f"a producer id is 1-43 of A-Z a-z 0-9 . _ -, not {producer_id!r}")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.url = url
        self.producer_id = producer_id
        self._credentials = credentials
        self._max_in_flight = max_in_flight
        self._reconnect_initial = reconnect_initial
        self._reconnect_max = reconnect_max
        self._counter = itertools.count(1)
        #: Events not acknowledged yet, in the order they were added.
        self._unsettled: deque[_Event] = deque()
        #: Something to do: an event added, a call answered, the connection lost, a stop.
        self._wake = asyncio.Event()
        self._stopped = False
        self._runner: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._settled.set()
        #: How many connections the producer opened (the first included).
        self.sessions = 0
        #: Events the producer sent (sent again after a lost connection included).
        self.sent = 0

    # -- adding events ------------------------------------------------------------------------

    def submit(self, event_type: str, data: Any) -> asyncio.Future[int]:
        """Queue an event; the future gets its id once the server acknowledged it (or the
        error it was refused with). Cancelling the future does not withdraw the event."""
        if self._stopped:
            raise RuntimeError("the producer is closed")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        key = f"{self.producer_id}:{next(self._counter)}"
        self._unsettled.append(_Event(event_type, data, key, future))
        self._settled.clear()
        self._wake.set()
        return future

    async def add_event(self, event_type: str, data: Any) -> int:
        """:meth:`submit`, and wait for the id."""
        return await asyncio.shield(self.submit(event_type, data))

    @property
    def unsettled(self) -> int:
        """Events added and not acknowledged (nor refused) yet."""
        return sum(not event.settled for event in self._unsettled)

    async def flush(self) -> None:
        """Until every event added so far is acknowledged (or refused)."""
        await self._settled.wait()

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        """Run in a task of its own (:meth:`close` ends it)."""
        if self._runner is None:
            self._runner = asyncio.create_task(self.run(), name="futoin-evt-producer")

    async def close(self, *, flush: bool = True) -> None:
        """Wait for every event to be acknowledged (unless not ``flush``), then stop; the
        futures of events still unsettled are cancelled."""
        if flush and self._runner is not None and not self._runner.done():
            await self.flush()
        self.stop()
        if self._runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for event in self._unsettled:
            event.future.cancel()
        self._unsettled.clear()

    def stop(self) -> None:
        """Stop sending (:meth:`run` returns); events not acknowledged stay unsettled."""
        self._stopped = True
        self._wake.set()

    async def __aenter__(self) -> ReliableProducer:
        self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def run(self) -> None:
        """Send until :meth:`stop`, connecting again with a growing delay (with some
        randomness) after each loss. Cancelling it is safe: nothing added is lost."""
        tries = Reconnect(
            logger,
            f"producer {self.producer_id}",
            self.url,
            initial=self._reconnect_initial,
            maximum=self._reconnect_max,
        )
        while not self._stopped:
            try:
                if await self._session():
                    tries.worked()  # it had worked: start over quickly
                delay = tries.waited()
            except (CommError, OSError, TimeoutError, RemoteError) as exc:
                delay = tries.failed(exc)
            if self._stopped:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    while not self._stopped:
                        await self._wake.wait()  # a stop ends the wait
                        self._wake.clear()

    async def _session(self) -> int:
        """One connection: send every unsettled event in order, then each new one, up to
        ``max_in_flight`` at a time, until the connection fails or the producer stops;
        returns how many events it got acknowledged. Raises why it failed."""
        client = await FTN3Client.connect(self.url, credentials=self._credentials)
        self.sessions += 1
        session = _Session(self.sessions, client)
        acknowledged = 0
        try:
            while not self._stopped and session.failed is None:
                self._wake.clear()
                before = len(self._unsettled)
                self._send_next(session)
                await self._wake.wait()
                acknowledged += max(before - len(self._unsettled), 0)
            if session.failed is not None:
                raise session.failed
        finally:
            for call in session.calls:
                call.cancel()
            await asyncio.gather(*session.calls, return_exceptions=True)
            await client.close()
        return acknowledged

    def _send_next(self, session: _Session) -> None:
        """Send the unsettled events this session has not sent, in order, while fewer than
        ``max_in_flight`` are in flight."""
        for event in self._unsettled:
            if len(session.calls) >= self._max_in_flight:
                return
            if event.sent_in == session.number or event.settled:
                continue
            event.sent_in = session.number
            self.sent += 1
            session.calls.add(asyncio.create_task(self._send(session, event)))

    async def _send(self, session: _Session, event: _Event) -> None:
        call = add_event_call(event.type, event.data, event.key)
        try:
            event_id = int(await session.client.call(*call))
        except RemoteError as exc:
            if exc.name in RETRIED_ERRORS:
                self._fail(session, exc)
            else:
                self._settle(event, exc)
        except CommError as exc:
            self._fail(session, exc)
        else:
            self._settle(event, event_id)
        finally:  # out of the calls in flight before the session loop looks again
            task = asyncio.current_task()
            assert task is not None
            session.calls.discard(task)
            self._wake.set()

    def _fail(self, session: _Session, exc: BaseException) -> None:
        if session.failed is None:
            session.failed = exc

    def _settle(self, event: _Event, outcome: int | BaseException) -> None:
        event.settled = True
        if not event.future.done():
            if isinstance(outcome, BaseException):
                event.future.set_exception(outcome)
            else:
                event.future.set_result(outcome)
        while self._unsettled and self._unsettled[0].settled:
            self._unsettled.popleft()
        if not self._unsettled:
            self._settled.set()
