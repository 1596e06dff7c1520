"""The load of the fault schedules, and what its clients saw (the history the checker judges).

Producers add events at full speed over FTN18 (``addEvent``, several in flight on each
connection, one in :data:`BAD_EVERY` with a bad type that must be refused); a registered
poll consumer reads them, and each reply confirms the position it was given. With several
servers (several processes on one database), each producer starts on its own server and
moves to the next one when its connection fails or a call goes unanswered for
``call_timeout`` seconds; so does the poll consumer. At the end, :meth:`Load.final_read`
reads every event from the start with a LIVE reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

from futoin_evt.client.aio import OPS, CommError, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.ftn3.errors import INVALID_REQUEST

from .checker import Ack, Add, History, Outcome, Read

USER: Final = "faults"
PASSWORD: Final = "faults-pw"
CREDENTIALS: Final = f"{USER}:{PASSWORD}"
POLL: Final = "POLL"
PUSH: Final = "PUSH"
#: One add in this many has a bad type: the server must refuse it.
BAD_EVERY: Final = 97
#: Seconds to wait for a condition (a server to start, consumers to catch up).
DEADLINE: Final = 60.0
#: Pause between tries when no server answers.
RETRY: Final = 0.02

_T = TypeVar("_T")


async def listening(proc: asyncio.subprocess.Process) -> bool:
    """Whether a starting ``futoin-evt serve`` printed its URL within :data:`DEADLINE`."""
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(DEADLINE):
            line = await proc.stdout.readline()
    except TimeoutError:
        return False
    return b"ws://" in line


class Load:
    """Producers and a registered poll consumer on the servers at ``urls``."""

    def __init__(
        self,
        urls: list[str],
        history: History,
        *,
        producers: int = 3,
        in_flight: int = 8,
        call_timeout: float | None = None,
    ) -> None:
        self.urls = urls
        self.history = history
        self.producers = producers
        self.in_flight = in_flight
        self.call_timeout = call_timeout
        self.stopping = asyncio.Event()
        #: Set when the producers are to stop (the consumers go on until ``stopping``).
        self.producing_stopped = asyncio.Event()
        #: Set while the poll consumer may read (cleared to let a backlog pile up).
        self.poll_gate = asyncio.Event()
        self.poll_gate.set()
        self.poll_position = 0
        self.acknowledged = 0
        self.newest_acknowledged = 0
        self.progress = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.produce(n)) for n in range(self.producers)]
        self._tasks.append(asyncio.create_task(self.poll()))

    async def stop_producing(self) -> None:
        self.producing_stopped.set()
        await asyncio.gather(*self._tasks[: self.producers])

    async def stop(self) -> None:
        self.producing_stopped.set()
        self.stopping.set()
        self.poll_gate.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _servers(self, first: int) -> Iterator[str]:
        """The servers' URLs, from the ``first``-th round and round again."""
        for n in itertools.count(first):
            yield self.urls[n % len(self.urls)]

    async def _timed(self, call: Awaitable[_T]) -> _T:
        if self.call_timeout is None:
            return await call
        async with asyncio.timeout(self.call_timeout):
            return await call

    # -- producers --------------------------------------------------------------------------

    async def produce(self, number: int) -> None:
        counter = itertools.count(1)
        for url in self._servers(number):
            if self.producing_stopped.is_set():
                return
            try:
                client = await self._timed(EventStreamClient.connect(url, credentials=CREDENTIALS))
            except (CommError, OSError, TimeoutError):
                await asyncio.sleep(RETRY)  # that server is down: the next one
                continue
            async with client:
                lanes = [self._lane(client, number, counter) for _ in range(self.in_flight)]
                await asyncio.gather(*lanes)

    async def _lane(
        self, client: EventStreamClient, number: int, counter: itertools.count[int]
    ) -> None:
        """One add at a time on ``client``, until it fails or the producers stop."""
        while not self.producing_stopped.is_set():
            seq = next(counter)
            token = f"p{number}-{seq}"
            bad = seq % BAD_EVERY == 0
            invoked = time.monotonic()
            try:
                event_id = await self._timed(
                    client.add_event("BAD TYPE" if bad else "FAULT", {"t": token})
                )
            except RemoteError as exc:
                outcome: Outcome = "refused" if exc.name == INVALID_REQUEST else "unknown"
                self.history.adds.append(Add(token, invoked, time.monotonic(), outcome))
                continue
            except (CommError, TimeoutError):
                self.history.adds.append(Add(token, invoked, None, "unknown"))
                await client.close()  # the other lanes end too; the producer moves on
                return
            self.history.adds.append(Add(token, invoked, time.monotonic(), "ok", event_id))
            self.acknowledged += 1
            self.newest_acknowledged = max(self.newest_acknowledged, event_id)
            self.progress.set()

    async def acknowledged_again(self, count: int = 20, seconds: float = DEADLINE) -> None:
        """Wait until the producers have ``count`` more acknowledgements."""
        target = self.acknowledged + count
        async with asyncio.timeout(seconds):
            while self.acknowledged < target:
                self.progress.clear()
                await self.progress.wait()

    # -- the poll consumer ------------------------------------------------------------------

    async def poll(self) -> None:
        """The registered poll consumer: each reply confirms the position it was given."""
        session = 0
        for url in self._servers(0):
            if self.stopping.is_set():
                return
            try:
                client = await self._timed(EventStreamClient.connect(url, credentials=CREDENTIALS))
            except (CommError, OSError, TimeoutError):
                await asyncio.sleep(RETRY)
                continue
            session += 1
            last = 0  # first poll of a session: from the position the server kept
            try:
                async with client:
                    await self._timed(client.register_consumer(POLL))
                    while not self.stopping.is_set():
                        await self.poll_gate.wait()
                        events = await self._timed(client.poll_events(POLL, last_id=last or None))
                        now = time.monotonic()
                        if last:
                            self.history.acks.append(Ack(POLL, now, last))
                            self.poll_position = last
                        if events:
                            seen = tuple((e.id, e.data["t"]) for e in events)
                            self.history.reads.append(Read(POLL, session, now, seen))
                            last = events[-1].id
                        else:
                            await asyncio.sleep(0.01)  # nothing new: poll again shortly
            except (CommError, RemoteError, TimeoutError):
                await asyncio.sleep(RETRY)

    # -- probes and the end -----------------------------------------------------------------

    async def _first_answer(
        self, ask: Callable[[str], Awaitable[_T]], *, timed: bool = True
    ) -> _T | None:
        for url in self.urls:
            with contextlib.suppress(CommError, RemoteError, OSError, TimeoutError):
                return await (self._timed(ask(url)) if timed else ask(url))
        return None

    async def stream_info(self) -> dict[str, int] | None:
        """``streamInfo``'s ids (``first_id``, ``last_id``, ``discard_up_to``; 0 when absent)
        from the first server that answers, or None while none does."""

        async def ask(url: str) -> dict[str, int]:
            async with await FTN3Client.connect(url, credentials=CREDENTIALS) as ops:
                info: dict[str, Any] = await ops.call(OPS, "streamInfo", {})
            names = ("first_id", "last_id", "discard_up_to")
            return {name: int(info.get(name) or 0) for name in names}

        return await self._first_answer(ask)

    async def caught_up(self, *positions: Callable[[], int]) -> None:
        """The poll consumer, and whatever else ``positions`` give, read up to the head."""
        async with asyncio.timeout(DEADLINE):
            while True:
                info = await self.stream_info()
                reached = min([self.poll_position, *(position() for position in positions)])
                if info is not None and reached >= info["last_id"]:
                    return
                await asyncio.sleep(0.05)  # the head, seen through a server: nothing signals

    async def final_read(self) -> tuple[list[tuple[int, str]], dict[str, int]]:
        """Every stored event, read LIVE from the start; and ``streamInfo`` when the read
        ended (what retention had discarded by then is below ``first_id``)."""

        async def read(url: str) -> list[tuple[int, str]]:
            seen: list[tuple[int, str]] = []
            async with await EventStreamClient.connect(url, credentials=CREDENTIALS) as c:
                while True:
                    events = await c.poll_events("LIVE", last_id=seen[-1][0] if seen else None)
                    if not events:
                        return seen
                    seen.extend((e.id, e.data["t"]) for e in events)

        seen = await self._first_answer(read, timed=False)
        info = await self.stream_info()
        assert seen is not None, "no server answered at the end"
        assert info is not None, "no server answered at the end"
        return seen, info

    def record_final(self, final: list[tuple[int, str]], end: dict[str, int]) -> None:
        """The final read into the history, with what retention had discarded."""
        first, last = end["first_id"], end["last_id"]
        self.history.final = {"events/0": final}
        # empty (all discarded): everything up to the discarder's bound is gone
        floor = first - 1 if first else max(last, end["discard_up_to"])
        self.history.floors = {"events/0": floor}
