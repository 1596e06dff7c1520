"""The power-loss schedule: ``futoin-evt serve`` on SQLite on the power-loss filesystem
(:mod:`tests.faultfs`), under load, with the power cut again and again.

Producers add events at full speed over FTN18 (``addEvent``, several in flight on each
connection, a few with a bad type that must be refused); a registered poll consumer (whose
acknowledged positions the server confirms in its replies) and a registered push consumer
read them; retention discards what both have read every ``discard_interval`` seconds. Each
cut freezes the filesystem (nothing more lands; unsynced writes are dropped, or, for some
cuts, partly written back), SIGKILLs the server, mounts the disk again and starts the server
on it. Cuts take turns at three kinds of moment:

- ``random``: after a random stretch of load;
- ``checkpoint``: while the database file has unsynced pages (SQLite copying the WAL into
  it, before the fsync that ends the checkpoint);
- ``retention``: while the discarder deletes a backlog of thousands of events (the poll
  consumer holds back, then catches up at once), with some still to go.

At the end the producers stop, both consumers read up to the head, a LIVE reader reads every
partition's events from the start, and :func:`bench.faults.checker.check` gives the verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import OPS, CommError, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.rights import Right
from futoin_evt.ftn3.errors import INVALID_REQUEST
from futoin_evt.storage.sqlite import SqliteStore
from tests.faultfs import FaultFS

from .checker import Ack, Add, History, Outcome, Read, Verdicts, check

USER: Final = "faults"
PASSWORD: Final = "faults-pw"
CREDENTIALS: Final = f"{USER}:{PASSWORD}"
DB_NAME: Final = "events.sqlite"
POLL: Final = "POLL"
PUSH: Final = "PUSH"
KINDS: Final = ("random", "checkpoint", "retention")
#: One add in this many has a bad type: the server must refuse it.
BAD_EVERY: Final = 97
#: Seconds to wait for a condition (the server to start, consumers to catch up).
DEADLINE: Final = 60.0
#: Seconds a targeted cut waits for its moment before it cuts anyway.
AIM: Final = 5.0
#: Events still to discard at a retention cut (the discarder deletes 1,000 a transaction).
TO_GO: Final = 500


@dataclass(frozen=True)
class Schedule:
    durability: str = "full"
    cuts: int = 10
    seed: int = 1
    producers: int = 3
    in_flight: int = 8
    #: Seconds of load before a random cut (uniform), once the server acknowledged again.
    load: tuple[float, float] = (0.1, 0.6)
    #: Share of the cuts that write back part of what was unsynced (the others drop it all).
    partial: float = 0.3
    discard_interval: float = 0.05
    #: Events the poll consumer lets pile up before a retention cut.
    backlog: int = 2000


@dataclass(frozen=True)
class Cut:
    kind: str
    keep: float
    #: The cut came at the moment its kind aims at: inside a checkpoint (during a write to
    #: the database file, which only checkpoints write), or while the discarder was deleting
    #: a backlog with :data:`TO_GO` events to go.
    aimed: bool
    dirty_files: dict[str, int]
    restart_seconds: float


@dataclass
class Result:
    schedule: Schedule
    history: History
    verdicts: Verdicts
    cuts: list[Cut] = field(default_factory=list)
    #: Events in the final read.
    events: int = 0
    seconds: float = 0.0
    #: Why the server did not start again after a cut (None: it always did).
    failed_start: str | None = None
    #: ``streamInfo``'s ids when the final read ended.
    end: dict[str, int] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``futoin-evt serve`` in a session of its own (SIGKILL takes all of it)."""

    def __init__(self, db: Path, port: int, schedule: Schedule, log: IO[str]) -> None:
        self.db, self.port, self.schedule, self.log = db, port, schedule, log
        self.url = f"ws://127.0.0.1:{port}/"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start it; raises RuntimeError with its log when it does not print its URL."""
        proc = self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "futoin_evt", "--log-level", "warning", "serve",
            "--db", str(self.db), "--port", str(self.port), "--workers", "1",
            "--durability", self.schedule.durability,
            "--discard-interval", str(self.schedule.discard_interval),
            stdout=asyncio.subprocess.PIPE, stderr=self.log, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(DEADLINE):
                line = await proc.stdout.readline()
        except TimeoutError:
            line = b""
        if b"ws://" not in line:
            await self.kill()
            self.log.seek(0)
            tail = self.log.read().strip().splitlines()[-3:]
            raise RuntimeError(f"the server did not start: {' | '.join(tail)}")

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(DEADLINE):
                    await proc.wait()
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def prepare(db: Path) -> None:
    """The database with the user the clients log in as (read and write on every stream)."""
    async with await SqliteStore.open(db) as store:
        user_id = await store.add_user(USER, hash_password(PASSWORD))
        await store.grant(user_id, "*", int(Right.READ | Right.WRITE))


class Run:
    """One schedule's clients, faults and history."""

    def __init__(self, schedule: Schedule, fs: FaultFS, server: Server) -> None:
        self.schedule = schedule
        self.fs = fs
        self.server = server
        self.rng = random.Random(schedule.seed)
        self.history = History(reliable={POLL, PUSH})
        self.stopping = asyncio.Event()
        #: Set while the poll consumer may read (cleared to build a retention backlog).
        self.poll_gate = asyncio.Event()
        self.poll_gate.set()
        self.poll_position = 0
        self.acknowledged = 0
        self.newest_acknowledged = 0
        #: Set when the producers are to stop (the consumers go on until ``stopping``).
        self.producing_stopped = asyncio.Event()
        self.progress = asyncio.Event()
        self.receiver = ReliableReceiver(
            server.url, credentials=CREDENTIALS, component=PUSH, on_events=self._pushed,
            reconnect_initial=0.02, reconnect_max=0.2,
        )  # fmt: skip

    # -- the clients ------------------------------------------------------------------------

    async def produce(self, number: int) -> None:
        counter = iter(range(1, 1 << 62))
        while not self.producing_stopped.is_set():
            try:
                client = await EventStreamClient.connect(self.server.url, credentials=CREDENTIALS)
            except CommError:
                await asyncio.sleep(0.02)  # the server is down: try again shortly
                continue
            async with client:
                lanes = [
                    self._lane(client, number, counter) for _ in range(self.schedule.in_flight)
                ]
                await asyncio.gather(*lanes)

    async def _lane(self, client: EventStreamClient, number: int, counter: Any) -> None:
        """One add at a time on ``client``, until it fails or the producers stop."""
        while not self.producing_stopped.is_set():
            seq = next(counter)
            token = f"p{number}-{seq}"
            bad = seq % BAD_EVERY == 0
            invoked = time.monotonic()
            try:
                event_id = await client.add_event("BAD TYPE" if bad else "FAULT", {"t": token})
            except RemoteError as exc:
                outcome: Outcome = "refused" if exc.name == INVALID_REQUEST else "unknown"
                self.history.adds.append(Add(token, invoked, time.monotonic(), outcome))
                continue
            except CommError:
                self.history.adds.append(Add(token, invoked, None, "unknown"))
                return
            self.history.adds.append(Add(token, invoked, time.monotonic(), "ok", event_id))
            self.acknowledged += 1
            self.newest_acknowledged = max(self.newest_acknowledged, event_id)
            self.progress.set()

    async def poll(self) -> None:
        """The registered poll consumer: each reply confirms the position it was given."""
        session = 0
        while not self.stopping.is_set():
            try:
                client = await EventStreamClient.connect(self.server.url, credentials=CREDENTIALS)
            except CommError:
                await asyncio.sleep(0.02)
                continue
            session += 1
            last = 0  # first poll of a session: from the position the server kept
            try:
                async with client:
                    await client.register_consumer(POLL)
                    while not self.stopping.is_set():
                        await self.poll_gate.wait()
                        events = await client.poll_events(POLL, last_id=last or None)
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
            except (CommError, RemoteError):
                await asyncio.sleep(0.02)

    async def _pushed(self, events: list[Any]) -> None:
        seen = tuple((e.id, e.data["t"]) for e in events)
        self.history.reads.append(Read(PUSH, self.receiver.sessions, time.monotonic(), seen))

    # -- probes -----------------------------------------------------------------------------

    async def stream_info(self) -> dict[str, int] | None:
        """``streamInfo``'s ids (``first_id``, ``last_id``, ``discard_up_to``; 0 when absent),
        or None while the server is down."""
        try:
            async with await FTN3Client.connect(self.server.url, credentials=CREDENTIALS) as ops:
                info: dict[str, Any] = await ops.call(OPS, "streamInfo", {})
        except (CommError, RemoteError, OSError):
            return None
        return {name: int(info.get(name) or 0) for name in ("first_id", "last_id", "discard_up_to")}

    async def acknowledged_again(self, count: int = 20) -> None:
        """Wait until the producers have ``count`` more acknowledgements."""
        target = self.acknowledged + count
        async with asyncio.timeout(DEADLINE):
            while self.acknowledged < target:
                self.progress.clear()
                await self.progress.wait()

    # -- the cuts ---------------------------------------------------------------------------

    async def power_cut(self, kind: str, keep: float, seed: int) -> tuple[dict[str, Any], bool]:
        """Cut the power at a moment of ``kind``; what the filesystem dropped, and whether
        the moment was the one aimed at (always, for ``random``)."""
        if kind == "random":
            await asyncio.sleep(self.rng.uniform(*self.schedule.load))
            return self.fs.cut(keep, seed), True
        if kind == "checkpoint":  # inside the copy of the WAL into the database file
            self.fs.arm(DB_NAME, self.rng.randint(1, 30), keep, seed)
            deadline = time.monotonic() + AIM
            while time.monotonic() < deadline:
                stats = await asyncio.to_thread(self.fs.stats)
                if stats["cut"] is not None:
                    return stats["cut"], True
                await asyncio.sleep(0.005)
            return self.fs.cut(keep, seed), False  # (or the armed one, if it came meanwhile)
        aimed = await self._retention_backlog()
        return self.fs.cut(keep, seed), aimed

    async def _retention_backlog(self) -> bool:
        """Hold the poll consumer back until a backlog piled up, let it catch up, and return
        once the discarder has started on it with :data:`TO_GO` events still to go (True),
        or when it did not in time (False)."""
        self.poll_gate.clear()
        try:
            async with asyncio.timeout(AIM):
                while self.newest_acknowledged - self.poll_position < self.schedule.backlog:
                    self.progress.clear()
                    await self.progress.wait()
        except TimeoutError:
            pass
        before = await self.stream_info()
        self.poll_gate.set()
        deadline = time.monotonic() + AIM
        while before is not None and time.monotonic() < deadline:
            info = await self.stream_info()
            started = info is not None and info["first_id"] > before["first_id"]
            if info is not None and started and info["discard_up_to"] - info["first_id"] >= TO_GO:
                return True
            await asyncio.sleep(0.005)
        return False

    async def cut(self, kind: str, number: int) -> Cut:
        keep = 0.0 if self.rng.random() >= self.schedule.partial else self.rng.uniform(0.2, 0.9)
        stats, aimed = await self.power_cut(kind, keep, self.schedule.seed * 1000 + number)
        self.history.cuts.append(time.monotonic())
        await self.server.kill()
        started = time.monotonic()
        await asyncio.to_thread(self.fs.remount)
        await self.server.start()
        return Cut(
            kind,
            keep,
            aimed=aimed,
            dirty_files=stats["dirty_files"],
            restart_seconds=time.monotonic() - started,
        )

    # -- the end ----------------------------------------------------------------------------

    async def caught_up(self) -> None:
        """Both consumers have read up to the head."""
        async with asyncio.timeout(DEADLINE):
            while True:
                info = await self.stream_info()
                if (
                    info is not None
                    and min(self.poll_position, self.receiver.last_id) >= info["last_id"]
                ):
                    return
                await asyncio.sleep(0.05)

    async def final_read(self) -> tuple[list[tuple[int, str]], dict[str, int]]:
        """Every stored event, read LIVE from the start; and ``streamInfo`` when the read
        ended (what retention had discarded by then is below ``first_id``)."""
        seen: list[tuple[int, str]] = []
        async with await EventStreamClient.connect(self.server.url, credentials=CREDENTIALS) as c:
            while True:
                events = await c.poll_events("LIVE", last_id=seen[-1][0] if seen else None)
                if not events:
                    break
                seen.extend((e.id, e.data["t"]) for e in events)
        info = await self.stream_info()
        assert info is not None
        return seen, info


async def run(
    schedule: Schedule, workdir: Path, say: Callable[[str], None] = lambda _line: None
) -> Result:
    """Run ``schedule`` in ``workdir`` (a filesystem of its own, mounted there)."""
    began = time.monotonic()
    with FaultFS(workdir / "faultfs") as fs, tempfile.TemporaryFile("w+") as log:
        db = fs.mountpoint / DB_NAME
        await prepare(db)
        server = Server(db, free_port(), schedule, log)
        await server.start()
        state = Run(schedule, fs, server)
        outcome = Result(schedule, state.history, Verdicts())
        tasks = [asyncio.create_task(state.produce(n)) for n in range(schedule.producers)]
        tasks.append(asyncio.create_task(state.poll()))
        tasks.append(asyncio.create_task(state.receiver.run()))
        try:
            for number in range(schedule.cuts):
                kind = KINDS[number % len(KINDS)]
                await state.acknowledged_again()
                try:
                    cut = await state.cut(kind, number)
                except RuntimeError as exc:
                    outcome.failed_start = str(exc)
                    break
                outcome.cuts.append(cut)
                say(
                    f"cut {number + 1}/{schedule.cuts} ({kind}{'' if cut.aimed else ' missed'}, "
                    f"keep {cut.keep:.2f}): "
                    f"unsynced {cut.dirty_files}, restarted in {cut.restart_seconds:.2f} s"
                )
            if outcome.failed_start is None:
                await state.acknowledged_again()
                state.producing_stopped.set()
                await asyncio.gather(*tasks[: schedule.producers])
                await state.caught_up()
                final, outcome.end = await state.final_read()
                first, last = outcome.end["first_id"], outcome.end["last_id"]
                state.history.final = {"events/0": final}
                # empty (all discarded): everything up to the discarder's bound is gone
                floor = first - 1 if first else max(last, outcome.end["discard_up_to"])
                state.history.floors = {"events/0": floor}
                outcome.events = len(final)
        finally:
            state.producing_stopped.set()
            state.stopping.set()
            state.poll_gate.set()
            state.receiver.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.stop()
    outcome.verdicts = check(state.history)
    outcome.seconds = time.monotonic() - began
    return outcome
