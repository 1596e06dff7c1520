"""``python -m bench.soak [--minutes N] [--rate R] [--postgres URL]``: every door at once, for
a long time, at a fixed moderate rate; the server's memory and descriptors every minute.

It starts ``futoin-evt serve`` (SQLite, or a new PostgreSQL database with ``--postgres``)
with the AMQP listener, discarding every second and ``--keep-seconds 60`` (the feed does not
hold back discarding), adds a second user through ``futoin-evt user add``,
and for N minutes runs:

- FTN3 producers (``futoin_evt.client``), ``--rate`` events/s in all, 10% of them through
  the DCB writer; each producer keeps up to 8 calls in flight and reconnects every few
  minutes;
- registered poll consumers (two users, the same component name) and registered push
  consumers (``ReliableReceiver``), each leaving and coming back every ``--churn`` seconds
  or so (a poll consumer resumes from its stored position, so its last page comes again);
- LIVE push consumers, one connected throughout, one coming and going;
- short-lived consumers, one after another a minute apart, each of a new name: it registers,
  reads for 30 seconds, and drops itself;
- an AMQP consumer group bound to a registered consumer (``ftn18:AMQP``, python-qpid-proton
  in a thread), reconnecting with a higher epoch each time;
- a DCB writer: conditional appends over HTTP, each after the position of its last one;
- HTTP feed readers: a FeedAPI v2 follower with ``wait``, and each minute a new ZeroEventHub
  v1 reader paging from ``_first``;
- a prober: a process of its own calling ``futoin.ping`` every 100 ms.

Each minute it prints one line: events added, events read per kind (first deliveries),
errors, the server's RSS (``VmRSS``), open descriptors (``/proc/PID/fd``), threads, CPU,
the prober's ping round trip (p50, p99, max: what a call waited for the server's event loop,
plus the loopback and the prober's own scheduling; an upper bound of the loop's lag) and the
driver's own loop lag (so that a slow driver shows). At the end: whether every registered
consumer, the AMQP group and the feed follower saw every event once in order (re-deliveries
after a reconnect are counted apart), and whether RSS and descriptors were flat after the
warm-up (the criterion is printed with the verdict). The exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
from proton import symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.client.receiver import LiveReceiver, ReliableReceiver

from . import postgres, traced_server
from .dcb import HttpCaller
from .loadgen import LoadClient
from .systems import (
    PASSWORD,
    USER,
    System,
    payload,
    process_cpu_seconds,
    start_futoin_evt,
)

ROOT: Final = Path(__file__).resolve().parent.parent
OPS: Final = "futoinevt.ops:1.0"
#: The second user: its own consumers of the same names, and the feed readers.
USER2: Final = "soak2"
PASSWORD2: Final = "soak2-pw"
EVENT_TYPE: Final = "ORDER"
SEQUENCE: Final = symbol("x-opt-sequence-number")
PROBE_INTERVAL: Final = 0.1
#: addEvent calls a producer keeps in flight at most (a commit waits for the disk).
PRODUCER_WINDOW: Final = 8
#: Flat: the end within this of the end of the warm-up, and so is the growth the least-squares
#: slope after the warm-up gives over the same minutes.
RSS_TOLERANCE_MB: Final = 5.0
RSS_TOLERANCE_SHARE: Final = 0.05
FD_TOLERANCE: Final = 5


class Tally:
    """What one consumer (across its reconnections) was given: first deliveries in id order,
    deliveries again of ids it had (after a reconnect), and ids out of order (never had, yet
    not above the last): a defect."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.ids: array[int] = array("q")
        self.again = 0
        self.disorder = 0
        self.sessions = 0

    @property
    def last(self) -> int:
        return self.ids[-1] if self.ids else 0

    def see(self, event_id: int) -> None:
        if event_id > self.last:
            self.ids.append(event_id)
            return
        at = bisect.bisect_left(self.ids, event_id)
        if at < len(self.ids) and self.ids[at] == event_id:
            self.again += 1
        else:
            self.disorder += 1

    def wrong(self, expected: list[int], since: int = 0, upto: int | None = None) -> list[int]:
        """Ids in ``expected`` after ``since`` and up to ``upto`` (default: the last it was
        given) that it was not given, and ids it was given that are not in ``expected``."""
        upto = self.last if upto is None else upto
        wanted = [i for i in expected if since < i <= upto]
        return sorted(set(wanted).symmetric_difference(i for i in self.ids if i > since))


@dataclass
class Sample:
    minute: int
    added: int
    read: dict[str, int]
    errors: int
    rss_mb: float
    fds: int
    threads: int
    cpu_percent: float
    ping_ms: tuple[float, float, float]
    add_ms: tuple[float, float, float]
    driver_lag_ms: float
    driver_cpu_percent: float
    load1: float

    def line(self) -> str:
        reads = " ".join(f"{k}={v}" for k, v in self.read.items())
        return (
            f"min {self.minute:3d} | added {self.added:6d} | read {reads} | errors {self.errors}"
            f" | RSS {self.rss_mb:6.1f} MB | fds {self.fds:3d} | threads {self.threads:2d}"
            f" | CPU {self.cpu_percent:4.1f}% | ping ms {_spread(self.ping_ms)}"
            f" | addEvent ms {_spread(self.add_ms)} | driver: lag max {self.driver_lag_ms:.0f} ms,"
            f" CPU {self.driver_cpu_percent:.0f}% | load {self.load1:.2f}"
        )


def _spread(p50_p99_max: tuple[float, float, float]) -> str:
    return "p50 {:.1f} p99 {:.1f} max {:.1f}".format(*p50_p99_max)


def percentiles(values: list[float], scale: float = 1.0) -> tuple[float, float, float]:
    """p50, p99 and max of ``values`` times ``scale``; NaN when there are none."""
    ordered = sorted(values) or [float("nan")]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * scale, p99 * scale, ordered[-1] * scale


@dataclass
class Soak:
    """The clients of a soak against one server, and what they added and were given."""

    system: System
    rate: float
    churn: float
    producers: int = 4
    #: False once the producers are to stop; the consumers run on until caught up.
    producing: bool = True
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ftn_ids: array[int] = field(default_factory=lambda: array("q"))
    dcb_ids: array[int] = field(default_factory=lambda: array("q"))
    tallies: dict[str, Tally] = field(default_factory=dict)
    #: Short-lived consumers: (tally, the newest id when it registered).
    transient: list[tuple[Tally, int]] = field(default_factory=list)
    feed_reads: int = 0
    errors: list[str] = field(default_factory=list)
    pings: list[float] = field(default_factory=list)
    #: Seconds each addEvent of the producers took, this minute.
    adds: list[float] = field(default_factory=list)
    driver_lag: float = 0.0
    #: Called when the soak stops (threads that cannot wait on :attr:`stopping`).
    stopping_hooks: list[Callable[[], None]] = field(default_factory=list)
    #: Every task of the soak, cancelled when it ends.
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def credentials(self) -> str:
        return f"{USER}:{PASSWORD}"

    def tally(self, name: str) -> Tally:
        return self.tallies.setdefault(name, Tally(name))

    def error(self, where: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.errors.append(f"{where}: {text}")
        if len(self.errors) <= 20:
            print(f"# error in {where}: {text}", file=sys.stderr, flush=True)

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` (pacing, not synchronisation); False once the soak is stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        return not self.stopping.is_set()

    async def sessions(self, where: str, session: Callable[[], Awaitable[None]]) -> None:
        """Run ``session`` again and again until the soak stops; an error is counted, and the
        next session starts a second later."""
        while not self.stopping.is_set():
            try:
                await session()
            except Exception as exc:
                self.error(where, exc)
                await self.pause(1.0)

    # -- producers ----------------------------------------------------------------------------

    async def paced(self, rate: float, seconds: float) -> AsyncIterator[int]:
        """Yield at ``rate`` per second for ``seconds`` or until producing stops; after a
        stall of more than a second the schedule starts again rather than burst."""
        end = time.perf_counter() + seconds
        due = time.perf_counter()
        for n in itertools.count():
            now = time.perf_counter()
            if not self.producing or now > end:
                return
            if due > now:
                await asyncio.sleep(due - now)  # pacing
            elif now - due > 1.0:
                due = now
            yield n
            due += 1 / rate

    async def producer(self, k: int) -> None:
        rate = self.rate * 0.9 / self.producers
        counter = itertools.count()

        async def add(client: EventStreamClient, window: asyncio.Semaphore) -> None:
            try:
                start = time.perf_counter()
                self.ftn_ids.append(await client.add_event(EVENT_TYPE, payload(next(counter))))
                self.adds.append(time.perf_counter() - start)
            except Exception as exc:
                self.error(f"producer {k}", exc)
            finally:
                window.release()

        async def session() -> None:
            window = asyncio.Semaphore(PRODUCER_WINDOW)
            async with await EventStreamClient.connect(
                self.system.url, credentials=self.credentials
            ) as client:
                calls = set()
                async for _ in self.paced(rate, self.churn * (2.5 + k * 0.3)):
                    await window.acquire()
                    call = asyncio.create_task(add(client, window))
                    calls.add(call)
                    call.add_done_callback(calls.discard)
                await asyncio.gather(*calls)

        while self.producing:
            try:
                await session()
            except Exception as exc:
                self.error(f"producer {k}", exc)
                await self.pause(1.0)

    async def dcb_writer(self) -> None:
        """Conditional appends, each on the condition that nothing with its tag came after
        its last one; the tag changes every minute (a new one starts after the head)."""
        rate = self.rate * 0.1
        while self.producing:
            caller = HttpCaller(self.system.url)
            try:
                tag = f"course:soak{int(time.monotonic() // 60)}"
                _matched, after = await caller.read_tag(tag)
                async for n in self.paced(rate, 60.0):
                    after = await caller.append_tagged(tag, {"n": n}, after)
                    self.dcb_ids.append(after)
            except Exception as exc:
                self.error("dcb writer", exc)
                await self.pause(1.0)
            finally:
                await caller.close()

    # -- FTN3 consumers -----------------------------------------------------------------------

    async def poll_consumer(
        self, credentials: str, component: str, tally: Tally, length: float
    ) -> None:
        """Polls, acknowledging each page with the next poll; after ``length`` seconds it
        disconnects and comes back without its last id (the server's position decides)."""

        async def session() -> None:
            async with await EventStreamClient.connect(
                self.system.url, credentials=credentials
            ) as client:
                await client.register_consumer(component)
                tally.sessions += 1
                last_id: int | None = None
                until = time.monotonic() + length
                while time.monotonic() < until and not self.stopping.is_set():
                    events = await client.poll_events(component, last_id)
                    for event in events:
                        tally.see(event.id)
                    if events:
                        last_id = events[-1].id
                    elif not await self.pause(0.2):
                        break
                if last_id is not None:  # acknowledge what was read before leaving
                    await client.poll_events(component, last_id)
            await self.pause(1.0)

        await self.sessions(f"poll {tally.kind}", session)

    async def push_consumer(self, receiver_of: Callable[[], ReliableReceiver | LiveReceiver],
                            tally: Tally, length: float | None) -> None:  # fmt: skip
        """Receiver sessions of ``length`` seconds with a second between them, or one session
        to the end (``None``)."""

        async def session() -> None:
            receiver = receiver_of()
            task = asyncio.create_task(receiver.run())
            tally.sessions += 1
            try:
                await self.pause(length if length is not None else 1e9)
            finally:
                receiver.stop()
                await task
            await self.pause(1.0)

        await self.sessions(f"push {tally.kind}", session)

    def on_events(self, tally: Tally) -> Callable[[list[Any]], Awaitable[None]]:
        async def handle(events: list[Any]) -> None:
            for event in events:
                tally.see(event.id)

        return handle

    async def transient_consumers(self) -> None:
        """A minute after the last one left, a consumer of a new name registers, reads for
        half a minute and drops itself: the server must forget it."""
        for n in itertools.count(1):
            if not await self.pause(60.0 if n > 1 else 5.0) or not self.producing:
                return
            component = f"TMP{n}"
            tally = Tally(component)
            tally.sessions = 1
            try:
                async with await EventStreamClient.connect(
                    self.system.url, credentials=self.credentials
                ) as client:
                    await client.register_consumer(component)
                    self.transient.append((tally, self.ftn_ids[-1] if self.ftn_ids else 0))
                    last_id: int | None = None
                    until = time.monotonic() + 30
                    while time.monotonic() < until and not self.stopping.is_set():
                        events = await client.poll_events(component, last_id)
                        for event in events:
                            tally.see(event.id)
                        if events:
                            last_id = events[-1].id
                        elif not await self.pause(0.2):
                            break
                    await client.ftn3.call(
                        OPS, "dropConsumer", {"user": USER, "component": component}
                    )
            except Exception as exc:
                self.error(f"transient {component}", exc)

    # -- AMQP ---------------------------------------------------------------------------------

    async def amqp_group(self, tally: Tally) -> None:
        """Sessions of a proton receiver in the group ``ftn18:AMQP``, each with a higher epoch;
        proton's reactor runs in a thread and hands each id to this loop."""
        url = self.system.amqp_url
        assert url is not None
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        self.stopping_hooks.append(stop.set)
        for epoch in itertools.count(1):
            if self.stopping.is_set():
                return
            handler = GroupReceiver(url, epoch, self.churn * 1.1, stop, loop, self, tally)
            tally.sessions += 1
            try:
                await asyncio.to_thread(Container(handler).run)
            except Exception as exc:
                self.error("amqp group", exc)
            await self.pause(1.0)

    # -- HTTP feed ----------------------------------------------------------------------------

    @property
    def feed_url(self) -> str:
        return self.system.url.replace("ws", "http", 1).rstrip("/") + "/feed"

    async def feed_follower(self, tally: Tally) -> None:
        """FeedAPI v2 from ``_last`` (so: every event added after it started), long polling."""
        async with httpx.AsyncClient(auth=(USER2, PASSWORD2), timeout=30) as http:
            token = (await http.get(self.feed_url)).json()["token"]
            cursor = "_last"
            tally.sessions += 1
            while not self.stopping.is_set():
                try:
                    params = {"token": token, "partition": "0", "cursor": cursor, "wait": "5"}
                    response = await http.get(self.feed_url + "/events", params=params)
                    response.raise_for_status()
                    for line in response.text.splitlines():
                        message = json.loads(line)
                        if "data" in message:
                            event_id = int(message["data"]["id"])
                            if tally.last and event_id > tally.last + 1:  # ids have no holes
                                print(f"# feed follower: {tally.last} then {event_id}", flush=True)
                            tally.see(event_id)
                        elif "cursor" in message:
                            cursor = message["cursor"]
                except Exception as exc:
                    self.error("feed follower", exc)
                    await self.pause(1.0)

    async def feed_readers(self) -> None:
        """Each minute a new client reads up to 5 pages of ZeroEventHub v1 from ``_first``;
        the ids must rise."""
        while await self.pause(60.0):
            try:
                async with httpx.AsyncClient(auth=(USER2, PASSWORD2), timeout=30) as http:
                    cursor, last = "_first", 0
                    for _page in range(5):
                        params = {"n": "1", "cursor0": cursor}
                        response = await http.get(self.feed_url, params=params)
                        response.raise_for_status()
                        events = 0
                        for line in response.text.splitlines():
                            message = json.loads(line)
                            if "data" in message:
                                event_id = int(message["data"]["id"])
                                if event_id <= last:
                                    self.error("feed reader", f"{event_id} after {last}")
                                last = event_id
                                events += 1
                            elif "cursor" in message:
                                cursor = message["cursor"]
                        self.feed_reads += events
                        if not events:
                            break
            except Exception as exc:
                self.error("feed reader", exc)

    # -- measuring ----------------------------------------------------------------------------

    async def prober(self) -> None:
        """The ping prober, a process of its own; one round trip (ms) per line."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.soak", "--probe", self.system.url,
            stdout=asyncio.subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                str(ROOT), os.environ.get("PYTHONPATH"))))},
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            async for line in proc.stdout:
                self.pings.append(float(line))
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()

    async def driver_lag_monitor(self) -> None:
        while not self.stopping.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.1)  # measuring this loop's lag
            self.driver_lag = max(self.driver_lag, time.perf_counter() - start - 0.1)

    def sample(
        self, minute: int, before: dict[str, int], cpu_before: tuple[float, float], span: float
    ) -> Sample:
        """The figures of the minute that ends now; ``cpu_before``: the server's and the
        driver's CPU seconds when it began."""
        pid = self.system.process.pid
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        reads = self.read_counts()
        pings, adds, self.pings, self.adds = self.pings, self.adds, [], []
        lag, self.driver_lag = self.driver_lag, 0.0
        server_cpu, driver_cpu = cpu_seconds(pid)
        return Sample(
            minute=minute,
            added=reads["added"] - before.get("added", 0),
            read={k: v - before.get(k, 0) for k, v in reads.items() if k != "added"},
            errors=len(self.errors),
            rss_mb=int(status["VmRSS"].split()[0]) / 1024,
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            threads=int(status["Threads"]),
            cpu_percent=100 * (server_cpu - cpu_before[0]) / span,
            ping_ms=percentiles(pings),
            add_ms=percentiles(adds, 1000),
            driver_lag_ms=lag * 1000,
            driver_cpu_percent=100 * (driver_cpu - cpu_before[1]) / span,
            load1=os.getloadavg()[0],
        )

    def read_counts(self) -> dict[str, int]:
        counts = {"added": len(self.ftn_ids) + len(self.dcb_ids)}
        for kind in ("poll", "push", "live", "amqp", "feed"):
            counts[kind] = sum(len(t.ids) for t in self.tallies.values() if t.kind.startswith(kind))
        counts["tmp"] = sum(len(t.ids) for t, _ in self.transient)
        counts["feed"] += self.feed_reads
        return counts

    # -- the end ------------------------------------------------------------------------------

    async def caught_up(self, seconds: float) -> bool:
        """Wait (bounded) until every consumer that must see everything has the newest id."""
        ftn_last = max(self.ftn_ids, default=0)
        all_last = max(ftn_last, max(self.dcb_ids, default=0))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            behind = [
                t.kind
                for t in self.tallies.values()
                if (t.kind.startswith(("poll", "push-reliable")) and t.last < ftn_last)
                or (t.kind.startswith(("amqp", "feed")) and t.last < all_last)
            ]
            if not behind:
                return True
            await asyncio.sleep(0.2)  # a bounded wait on the condition above
        print(f"# not caught up after {seconds:.0f} s: {behind}", flush=True)
        return False

    def check(self) -> list[str]:
        """What the consumers were given, against what was added."""
        ftn = sorted(self.ftn_ids)
        every = sorted([*self.ftn_ids, *self.dcb_ids])
        failures: list[str] = []
        print("# consumer              first deliveries  again  sessions  wrong")
        rows: list[tuple[Tally, list[int], int, int | None]] = [
            (t, ftn, 0, max(ftn, default=0))
            if t.kind.startswith(("poll", "push-reliable"))
            else (t, every, 0, max(every, default=0))
            for t in self.tallies.values()
        ]
        rows += [(t, ftn, since, None) for t, since in self.transient]
        for tally, expected, since, upto in rows:
            # a LIVE consumer may lose groups when it is slow: only the order is checked
            live = tally.kind.startswith("live")
            wrong = [] if live else tally.wrong(expected, since, upto)
            print(
                f"# {tally.kind:<22}{len(tally.ids):>17,}{tally.again:>7,}{tally.sessions:>10}"
                f"{len(wrong) + tally.disorder:>7}"
            )
            if wrong or tally.disorder:
                failures.append(
                    f"{tally.kind}: {tally.disorder} out of order; missing or unexpected:"
                    f" {wrong[:10]}{'...' if len(wrong) > 10 else ''}"
                )
        return failures


def cpu_seconds(server_pid: int) -> tuple[float, float]:
    """CPU seconds of the server and of this process (the driver), all threads."""
    return process_cpu_seconds(server_pid), process_cpu_seconds(os.getpid())


class LinkProperties(LinkOption):
    def __init__(self, properties: dict[Any, Any]) -> None:
        self.properties = properties

    def apply(self, link: Any) -> None:
        link.properties = self.properties


class GroupReceiver(MessagingHandler):
    """One session of the AMQP consumer group: receives for ``seconds``, then detaches and
    closes (what it had not settled comes again to the next session)."""

    def __init__(
        self,
        url: str,
        epoch: int,
        seconds: float,
        stop: threading.Event,
        loop: asyncio.AbstractEventLoop,
        soak: Soak,
        tally: Tally,
    ) -> None:
        super().__init__(prefetch=100, auto_accept=True)
        self.url, self.epoch, self.stop, self.loop = url, epoch, stop, loop
        self.soak, self.tally = soak, tally
        self.until = time.monotonic() + seconds
        self.conn: Any = None
        self.link: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(
            self.url, user=USER, password=PASSWORD, allowed_mechs="PLAIN"
        )
        properties = {
            symbol("event-streams-consumer-group"): "ftn18:AMQP",
            symbol("event-streams-epoch"): self.epoch,
        }
        self.link = event.container.create_receiver(
            self.conn, "events", options=LinkProperties(properties)
        )
        event.container.schedule(0.5, self)

    def on_timer_task(self, event: Any) -> None:
        if self.stop.is_set() or time.monotonic() > self.until:
            self.link.close()
            self.conn.close()
        else:
            event.container.schedule(0.5, self)

    def on_message(self, event: Any) -> None:
        self.loop.call_soon_threadsafe(self.tally.see, int(event.message.annotations[SEQUENCE]))

    def _failed(self, what: str, event: Any) -> None:
        endpoint = event.link or event.connection or event.transport
        condition = getattr(endpoint, "remote_condition", None) or getattr(
            endpoint, "condition", None
        )
        self.loop.call_soon_threadsafe(self.soak.error, "amqp group", f"{what}: {condition}")
        if event.connection is not None:
            event.connection.close()

    def on_link_error(self, event: Any) -> None:
        self._failed("link", event)

    def on_connection_error(self, event: Any) -> None:
        self._failed("connection", event)

    def on_transport_error(self, event: Any) -> None:
        self._failed("transport", event)


# -- the run -------------------------------------------------------------------------------------


async def start(
    workdir: Path, durability: str, postgres_url: str | None, traced: Path | None
) -> System:
    """The server, and the second user; ``traced``: with tracemalloc, snapshots there."""
    # the feed does not hold back discarding: a retention policy keeps what its readers need
    extra = ("--amqp", "127.0.0.1:0", "--discard-interval", "1", "--keep-seconds", "60")
    if postgres_url is None:
        launcher = ("-m", "futoin_evt") if traced is None else ("-m", traced_server.__name__,
                                                                  str(traced))  # fmt: skip
        system = await start_futoin_evt(workdir, *extra, durability=durability, launcher=launcher)
        db = str(system.db_path)
    else:
        system = await postgres.start_futoin_evt_pg(workdir, *extra, admin_url=postgres_url)
        db = system.db_url
    add_user = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "futoin_evt", "--log-level", "warning", "user", "add", USER2,
        "--password-stdin", "--db", db, stdin=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    await add_user.communicate(PASSWORD2.encode())
    if add_user.returncode:
        await system.stop()
        raise RuntimeError(f"futoin-evt user add exited with {add_user.returncode}")
    grant = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "futoin_evt", "--log-level", "warning", "grant", USER2,
        "read,write", "*", "--db", db, cwd=ROOT,
    )  # fmt: skip
    if await grant.wait():
        await system.stop()
        raise RuntimeError(f"futoin-evt grant exited with {grant.returncode}")
    return system


async def snapshot(system: System, directory: Path, n: int) -> Path:
    """Have the traced server write its snapshot ``n``; wait for it (bounded)."""
    path = directory / f"snapshot-{n}.tracemalloc"
    os.kill(system.process.pid, signal.SIGUSR1)
    for _ in range(600):
        if path.exists():
            return path
        await asyncio.sleep(0.2)  # a bounded wait for the file
    raise TimeoutError(f"the server wrote no {path.name} within 120 s")


def verdict(samples: list[Sample], warm_up: int) -> tuple[str, list[str]]:
    """``flat`` or ``growing`` (with what grows), or why it cannot be told."""
    after = [s for s in samples if s.minute >= warm_up]
    if len(after) < 3:
        return "not judged (fewer than 3 minutes after the warm-up)", []
    rss_tolerance = max(RSS_TOLERANCE_MB, RSS_TOLERANCE_SHARE * after[0].rss_mb)
    growing = []
    for name, values, tolerance in (
        ("RSS (MB)", [s.rss_mb for s in after], rss_tolerance),
        ("descriptors", [float(s.fds) for s in after], float(FD_TOLERANCE)),
    ):
        minutes = [float(s.minute) for s in after]
        slope = statistics.linear_regression(minutes, values).slope
        trend = slope * (minutes[-1] - minutes[0])
        if values[-1] - values[0] > tolerance or trend > tolerance:
            growing.append(
                f"{name}: {values[0]:.1f} -> {values[-1]:.1f}, trend {trend:+.1f} over"
                f" {minutes[-1] - minutes[0]:.0f} min (tolerance {tolerance:.1f})"
            )
    return ("growing" if growing else "flat"), growing


async def soak(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        system = await start(Path(tmp), args.durability, args.postgres, args.tracemalloc)
        run = Soak(system, args.rate, min(args.churn, args.minutes * 60 / 3))
        try:
            samples, snapshots, caught_up = await drive(run, args)
        finally:
            for task in run.tasks:
                task.cancel()
            await asyncio.gather(*run.tasks, return_exceptions=True)
            await system.stop()
    if len(snapshots) == 2:
        print(f"# tracemalloc: what grew from minute {args.warm_up} to minute {args.minutes}")
        for line in traced_server.growth(snapshots[0], snapshots[1]):
            print(f"#   {line}")
    failures = run.check()
    if not caught_up:
        failures.append("the consumers did not catch up within 60 s of the last event")
    failures += run.errors
    return report(samples, args.warm_up, run, failures, judge=not args.tracemalloc)


async def drive(run: Soak, args: argparse.Namespace) -> tuple[list[Sample], list[Path], bool]:
    """The minutes of the soak: the samples, the tracemalloc snapshots, and whether the
    consumers caught up at the end."""
    minutes: int = args.minutes
    system, churn, url = run.system, run.churn, run.system.url
    cred2 = f"{USER2}:{PASSWORD2}"

    def reliable(name: str, credentials: str = run.credentials) -> Callable[[], Any]:
        return lambda: ReliableReceiver(
            url, credentials=credentials, component=name,
            on_events=run.on_events(run.tally(f"push-reliable {name}")),
        )  # fmt: skip

    def live(name: str) -> Callable[[], Any]:
        return lambda: LiveReceiver(
            url, credentials=run.credentials, on_events=run.on_events(run.tally(name))
        )

    consumers = [
        run.poll_consumer(run.credentials, "POLL1", run.tally("poll POLL1"), churn),
        run.poll_consumer(run.credentials, "POLL2", run.tally("poll POLL2"), churn * 1.2),
        run.poll_consumer(cred2, "POLL1", run.tally("poll POLL1 (soak2)"), churn * 0.9),
        run.push_consumer(reliable("PUSH1"), run.tally("push-reliable PUSH1"), churn),
        run.push_consumer(reliable("PUSH2"), run.tally("push-reliable PUSH2"), churn * 1.3),
        run.push_consumer(live("live steady"), run.tally("live steady"), None),
        run.push_consumer(live("live churning"), run.tally("live churning"), churn * 0.7),
        run.amqp_group(run.tally("amqp ftn18:AMQP")),
        run.feed_follower(run.tally("feed follower")),
        run.feed_readers(),
        run.transient_consumers(),
    ]
    consuming = [asyncio.create_task(c) for c in consumers]
    run.tasks += consuming
    run.tasks += [asyncio.create_task(c) for c in (run.prober(), run.driver_lag_monitor())]
    # every consumer connected before the first event, so each must see every one
    await asyncio.sleep(2.0)  # a grace for the connections, not a synchronisation
    print(
        f"# soak: {minutes} min at {args.rate:g} events/s ({run.producers} FTN3 producers,"
        f" DCB {args.rate * 0.1:g}/s), churn {churn:.0f} s, server pid {system.process.pid},"
        f" {'PostgreSQL' if args.postgres else 'SQLite ' + args.durability}",
        flush=True,
    )
    producers = [asyncio.create_task(run.producer(k)) for k in range(run.producers)]
    producers.append(asyncio.create_task(run.dcb_writer()))
    run.tasks += producers
    samples: list[Sample] = []
    snapshots: list[Path] = []
    started = time.monotonic()
    before = run.read_counts()
    cpu_before = cpu_seconds(system.process.pid)
    for minute in range(1, minutes + 1):
        await asyncio.sleep(max(0.0, started + 60 * minute - time.monotonic()))  # the clock
        cpu_now = cpu_seconds(system.process.pid)
        sample = run.sample(minute, before, cpu_before, 60.0)
        before, cpu_before = run.read_counts(), cpu_now
        samples.append(sample)
        print(sample.line(), flush=True)
        if args.tracemalloc and minute in (args.warm_up, minutes):
            snapshots.append(await snapshot(system, args.tracemalloc, len(snapshots) + 1))
    run.producing = False
    await asyncio.gather(*producers)
    caught_up = await run.caught_up(60.0)
    run.stopping.set()
    for hook in run.stopping_hooks:
        hook()
    await asyncio.gather(*consuming, return_exceptions=True)
    return samples, snapshots, caught_up


def report(
    samples: list[Sample], warm_up: int, run: Soak, failures: list[str], *, judge: bool = True
) -> int:
    """The summary; ``judge``: whether RSS and descriptors are judged (not when the server
    traces its allocations: the snapshots themselves take memory)."""
    added = len(run.ftn_ids) + len(run.dcb_ids)
    print(f"# added {added:,} events ({len(run.dcb_ids):,} through DCB); errors {len(run.errors)}")
    if samples:
        base = next((s for s in samples if s.minute == warm_up), samples[0])
        end = samples[-1]
        top = max(samples, key=lambda s: s.rss_mb)
        print(
            f"# RSS: {base.rss_mb:.1f} MB at minute {base.minute} (end of warm-up),"
            f" {end.rss_mb:.1f} MB at minute {end.minute}, max {top.rss_mb:.1f} MB"
            f" (minute {top.minute})"
        )
        print(
            f"# descriptors: {base.fds} at minute {base.minute}, {end.fds} at minute"
            f" {end.minute}, max {max(s.fds for s in samples)}"
        )
        pings = [s.ping_ms for s in samples]
        print(
            f"# ping ms: p50 median {statistics.median(p[0] for p in pings):.1f},"
            f" p99 worst {max(p[1] for p in pings):.1f}, max {max(p[2] for p in pings):.1f}"
        )
    flat, growing = verdict(samples, warm_up) if judge else ("not judged (tracemalloc)", [])
    print(
        f"# criterion: after minute {warm_up}, the end and the least-squares trend each within"
        f" max({RSS_TOLERANCE_MB:g} MB, {RSS_TOLERANCE_SHARE:.0%}) of the RSS and"
        f" {FD_TOLERANCE} descriptors"
    )
    for line in growing:
        print(f"# growing: {line}")
    print(f"verdict: {flat}")
    for failure in failures:
        print(f"# FAILED: {failure}")
    print("correctness: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures or flat == "growing" else 0


# -- the prober ----------------------------------------------------------------------------------


async def probe(url: str) -> None:
    """Print the round trip (ms) of a ``futoin.ping`` every :data:`PROBE_INTERVAL` seconds."""
    client = await LoadClient.connect(url, f"{USER}:{PASSWORD}")
    with contextlib.suppress(BrokenPipeError, ConnectionError):
        while True:
            start = time.perf_counter()
            await client.call("futoin.ping:1.0:ping", '{"echo":1}')
            elapsed = time.perf_counter() - start
            print(f"{elapsed * 1000:.3f}", flush=True)
            await asyncio.sleep(max(0.0, PROBE_INTERVAL - elapsed))  # the probe's cadence


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--rate", type=float, default=200.0, help="events/s in all (200)")
    parser.add_argument("--churn", type=float, default=45.0,
                        help="seconds a consumer stays before it reconnects (45)")  # fmt: skip
    parser.add_argument("--warm-up", type=int, default=3, help="minutes (3)")
    parser.add_argument("--durability", choices=["full", "normal"], default="full")
    parser.add_argument("--postgres", metavar="URL", help="a new database on this server")
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        metavar="DIR",
        help="SQLite only: the server traces its allocations; snapshots at the end of the"
        " warm-up and at the end go to DIR, and what grew between them is printed",
    )
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        with contextlib.suppress(KeyboardInterrupt, RemoteError):
            asyncio.run(probe(args.probe))
        return 0
    if args.minutes < 1 or args.rate <= 0:
        parser.error("--minutes and --rate must be positive")
    if args.tracemalloc and args.postgres:
        parser.error("--tracemalloc runs with SQLite only")
    if args.tracemalloc:
        args.tracemalloc.mkdir(parents=True, exist_ok=True)
    return asyncio.run(soak(args))


if __name__ == "__main__":
    raise SystemExit(main())
