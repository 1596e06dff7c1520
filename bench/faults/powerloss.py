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
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from futoin_evt.auth.users import hash_password
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.rights import Right
from futoin_evt.storage.sqlite import SqliteStore
from tests.faultfs import FaultFS
from tests.nethosts import free_port

from .checker import History, Read, Verdicts, check
from .load import CREDENTIALS, DEADLINE, PASSWORD, POLL, PUSH, USER, Load, listening

DB_NAME: Final = "events.sqlite"
KINDS: Final = ("random", "checkpoint", "retention")
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
        if not await listening(proc):
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
        # at normal a cut takes what came since the last checkpoint, and its ids are given
        # out again
        self.history = History(
            reliable={POLL, PUSH}, ids_survive_cuts=schedule.durability == "full"
        )
        self.load = Load(
            [server.url], self.history, producers=schedule.producers, in_flight=schedule.in_flight
        )
        self.receiver = ReliableReceiver(
            server.url, credentials=CREDENTIALS, component=PUSH, on_events=self._pushed,
            reconnect_initial=0.02, reconnect_max=0.2,
        )  # fmt: skip

    async def _pushed(self, events: list[Any]) -> None:
        seen = tuple((e.id, e.data["t"]) for e in events)
        self.history.reads.append(Read(PUSH, self.receiver.sessions, time.monotonic(), seen))

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
        self.load.poll_gate.clear()
        try:
            async with asyncio.timeout(AIM):
                while (
                    self.load.newest_acknowledged - self.load.poll_position < self.schedule.backlog
                ):
                    self.load.progress.clear()
                    await self.load.progress.wait()
        except TimeoutError:
            pass
        before = await self.load.stream_info()
        self.load.poll_gate.set()
        deadline = time.monotonic() + AIM
        while before is not None and time.monotonic() < deadline:
            info = await self.load.stream_info()
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
        load = state.load
        load.start()
        receiving = asyncio.create_task(state.receiver.run())
        try:
            for number in range(schedule.cuts):
                kind = KINDS[number % len(KINDS)]
                await load.acknowledged_again()
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
                await load.acknowledged_again()
                await load.stop_producing()
                await load.caught_up(lambda: state.receiver.last_id)
                final, outcome.end = await load.final_read()
                load.record_final(final, outcome.end)
                outcome.events = len(final)
        finally:
            state.receiver.stop()
            receiving.cancel()
            await load.stop()
            await asyncio.gather(receiving, return_exceptions=True)
            await server.stop()
    outcome.verdicts = check(state.history)
    outcome.seconds = time.monotonic() - began
    return outcome
