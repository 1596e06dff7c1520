"""The network fault schedules: two ``futoin-evt serve`` processes on one PostgreSQL, each in
a test host of its own (:mod:`tests.nethosts`), the database reached over the hosts' links.

The load (:mod:`.load`) runs against both servers: producers, each starting on its own server
and moving to the other when a call goes unanswered; the registered poll consumer. Beside
it, a registered push consumer with one connection to each server: one holds the consumer
(its readyToReceive was the last), the other stands by; every group either gets is recorded,
duplicates included. The database has an aggregated stream of ``events``, which one of the
two servers copies into (its lease is ``lease`` seconds). Schedules, ``faults`` times each,
with a stretch of load before each fault:

- ``cut``: the server holding the push consumer is cut off from the database (iptables
  drop both ways) for a while, then healed; a second into the cut, the standby connection
  takes the consumer over through the other server;
- ``slow``: one server's packets to the database are held 200 ms and 5% are dropped, for a
  while (what ``netem delay 200ms loss 5%`` does, through :mod:`tests.nethosts.delayer`);
- ``pause``: the server holding the push consumer, or, every other time, the one holding
  the aggregate's lease, is stopped (SIGSTOP) for longer than the lease, and the standby
  takes the push consumer over through the other server; then SIGCONT.

At the end the producers stop, the consumers and the aggregate catch up, the events and the
aggregate are read in full, and :func:`.checker.check` judges: nothing acknowledged lost,
nothing made up or reordered, and nothing a process did after it lost its claim or lease
reached a receiver or the aggregate (``after takeover``, ``copied twice``, ``moved back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import psycopg

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import CommError, Event, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.receiver import PUSH as PUSH_IFACE
from futoin_evt.client.receiver import RECEIVER
from futoin_evt.domain.rights import Right
from futoin_evt.storage.base import PoolLimits
from futoin_evt.storage.postgres import PostgresStore
from tests.nethosts import Host, NetHosts, Postgres, free_port

from .checker import Ack, Add, Claim, History, Read, Verdicts, check
from .load import CREDENTIALS, DEADLINE, PASSWORD, POLL, PUSH, USER, Load, listening

KINDS: Final = ("cut", "slow", "pause")
#: The source tree (the servers run from it, inside the hosts).
TREE: Final = Path(__file__).resolve().parents[2]
AGGREGATE: Final = "all"


@dataclass(frozen=True)
class Schedule:
    kind: str = "cut"
    faults: int = 3
    seed: int = 1
    producers: int = 4
    in_flight: int = 8
    #: Seconds of load before each fault (uniform).
    load: tuple[float, float] = (1.0, 2.0)
    #: Seconds a cut or a slow link lasts (uniform).
    lasts: tuple[float, float] = (3.0, 5.0)
    #: A pause lasts this many leases (uniform).
    pause_leases: tuple[float, float] = (1.5, 3.0)
    #: ``serve --pg-link-timeout`` and ``--aggregate-lease``.
    link_timeout: float = 2.0
    lease: float = 1.0
    delay_ms: float = 200.0
    loss: float = 0.05
    #: A client call unanswered this long counts as failed: the client moves to the other server.
    call_timeout: float = 5.0


@dataclass(frozen=True)
class Fault:
    kind: str
    #: Which server (0 or 1), and what it held (``push``, ``lease``, or nothing).
    server: int
    held: str
    seconds: float
    #: Seconds from the end of the fault to the faulted server's next acknowledged add.
    serving_again: float | None


@dataclass
class Result:
    schedule: Schedule
    history: History
    verdicts: Verdicts
    faults: list[Fault] = field(default_factory=list)
    events: int = 0
    copies: int = 0
    seconds: float = 0.0
    #: How the run ended early (None: it did not).
    failed: str | None = None


class Server:
    """``futoin-evt serve`` inside a host, on the database."""

    def __init__(self, host: Host, db_url: str, schedule: Schedule, log: IO[str]) -> None:
        self.host, self.db_url, self.schedule, self.log = host, db_url, schedule, log
        self.port = free_port()
        self.url = f"ws://{host.address}:{self.port}/"
        self.proc: asyncio.subprocess.Process | None = None
        self.stopped_at: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid  # ip netns exec runs the command in its own process

    async def start(self) -> None:
        proc = self.proc = await asyncio.create_subprocess_exec(
            *self.host.command(
                sys.executable, "-m", "futoin_evt", "--log-level", "warning", "serve",
                "--db", self.db_url, "--host", self.host.address, "--port", str(self.port),
                "--workers", "1", "--pg-link-timeout", str(self.schedule.link_timeout),
                "--aggregate-lease", str(self.schedule.lease), "--no-feed", "--no-dcb",
                "--trust-channel",  # plain ws:// on the hosts' links
                "--discard-interval", "86400",  # every event stays for the final read
            ),
            stdout=asyncio.subprocess.PIPE, stderr=self.log,
            cwd=TREE,
        )  # fmt: skip
        if not await listening(proc):
            await self.stop()
            raise RuntimeError("a server did not start (its log is kept)")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped_at = time.monotonic()

    def resume(self) -> tuple[float, float]:
        """SIGCONT; the pause's (start, end)."""
        os.kill(self.pid, signal.SIGCONT)
        assert self.stopped_at is not None
        pause, self.stopped_at = (self.stopped_at, time.monotonic()), None
        return pause

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(DEADLINE):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


class PushSide:
    """The push consumer: a connection to each server, one holding the consumer."""

    def __init__(self, servers: list[Server], history: History) -> None:
        self.servers = servers
        self.history = history
        self.sessions = 0
        #: Per server, its connection and that connection's session number.
        self.connections: dict[int, tuple[FTN3Client, int]] = {}
        self.holder = -1
        self.last_id = 0

    async def take(self, server: int) -> None:
        """A new connection to ``server`` takes the consumer over (its readyToReceive)."""
        old = self.connections.pop(server, None)
        if old is not None:
            await old[0].close()
        client = await FTN3Client.connect(self.servers[server].url, credentials=CREDENTIALS)
        self.sessions += 1
        session = self.sessions
        self.connections[server] = (client, session)

        async def on_events(params: dict[str, Any]) -> bool:
            events = [Event.from_wire(raw) for raw in params["events"]]
            if events:
                seen = tuple((e.id, e.data["t"]) for e in events)
                self.history.reads.append(Read(PUSH, session, time.monotonic(), seen))
                if session == self.connections.get(self.holder, (None, 0))[1]:
                    self.last_id = max(self.last_id, events[-1].id)
            return True

        client.on_request(RECEIVER, "onEvents", on_events)
        async with asyncio.timeout(DEADLINE):
            await client.call(PUSH_IFACE, "registerConsumer", {"component": PUSH})
            await client.call(PUSH_IFACE, "readyToReceive", {"component": PUSH, "want": None})
        self.history.claims.append(Claim(PUSH, session, time.monotonic()))
        self.holder = server

    def session_on(self, server: int) -> int | None:
        connection = self.connections.get(server)
        return None if connection is None else connection[1]

    async def close(self) -> None:
        for client, _session in self.connections.values():
            await client.close()


async def prepare(url: str) -> None:
    """The user, and the aggregate of ``events``."""
    async with await PostgresStore.open(url, pool=PoolLimits(size=2)) as store:
        user_id = await store.add_user(USER, hash_password(PASSWORD))
        await store.grant(user_id, "*", int(Right.READ | Right.WRITE))
        await store.add_stream(AGGREGATE, 1, aggregate_of="events")


class Watch:
    """What the run reads from the database itself, outside the servers: the push
    consumer's stored position (each read is a confirmed position), the lease's holder."""

    def __init__(self, url: str, history: History) -> None:
        self.url, self.history = url, history

    async def positions(self, stopping: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not stopping.is_set():
                cursor = await conn.execute(
                    "SELECT position FROM consumers WHERE partition_key = 0 AND component = %s",
                    (PUSH,),
                )
                row = await cursor.fetchone()
                if row is not None:
                    self.history.acks.append(Ack(PUSH, time.monotonic(), int(row[0])))
                await asyncio.sleep(0.1)  # a sample of the stored position, ten a second

    async def lease_holder(self) -> int | None:
        """The pid of the process holding the aggregate's lease, if any."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT holder FROM aggregate_leases WHERE expires_at > extract(epoch FROM now())"
            )
            row = await cursor.fetchone()
        return None if row is None else int(str(row[0]).split(":")[1])

    async def copied(self) -> tuple[list[tuple[int, str]], list[int]]:
        """The aggregate's events (id, token), and its sources' positions."""
        async with await PostgresStore.open(self.url, pool=PoolLimits(size=2)) as store:
            info = await store.stream(AGGREGATE)
            assert info is not None
            partition = info.partitions[0]
            rows = await store.partition_log(partition).read_rows(0, limit=10**9)
            positions = [p for _key, p in await store.aggregate_sources(partition)]
        return [(row[0], json.loads(row[2])["t"]) for row in rows], positions


class Run:
    def __init__(
        self, schedule: Schedule, net: NetHosts, pg: Postgres, servers: list[Server]
    ) -> None:
        self.schedule, self.net, self.pg, self.servers = schedule, net, pg, servers
        self.rng = random.Random(schedule.seed)
        self.history = History(reliable={POLL, PUSH})
        self.load = Load(
            [server.url for server in servers],
            self.history,
            producers=schedule.producers,
            in_flight=schedule.in_flight,
            call_timeout=schedule.call_timeout,
        )
        self.push = PushSide(servers, self.history)
        self.watch = Watch(pg.url(net.hosts[0].gateway), self.history)
        self._probes = itertools.count(1)

    async def serving_again(self, server: int) -> float:
        """Seconds until an add through ``server`` is acknowledged (the probes are adds of
        the history like the producers')."""
        began = time.monotonic()
        async with asyncio.timeout(DEADLINE):
            while True:
                token = f"probe-{next(self._probes)}"
                invoked = time.monotonic()
                try:
                    async with await EventStreamClient.connect(
                        self.servers[server].url, credentials=CREDENTIALS
                    ) as client:
                        async with asyncio.timeout(2):
                            event_id = await client.add_event("PROBE", {"t": token})
                except (CommError, RemoteError, OSError, TimeoutError):
                    self.history.adds.append(Add(token, invoked, None, "unknown"))
                    await asyncio.sleep(0.05)  # the server, seen from outside: nothing signals
                    continue
                done = time.monotonic()
                self.history.adds.append(Add(token, invoked, done, "ok", event_id))
                return done - began

    async def fault(self, number: int) -> Fault:
        schedule = self.schedule
        await asyncio.sleep(self.rng.uniform(*schedule.load))
        holder = self.push.holder
        other = 1 - holder
        if schedule.kind == "pause" and number % 2 == 1:
            pid = await self.watch.lease_holder()
            target = next((n for n, s in enumerate(self.servers) if s.pid == pid), holder)
            held = "lease" if pid is not None else "push"
        else:
            target, held = holder, "push"
        host = self.servers[target].host
        if schedule.kind == "slow":
            seconds = self.rng.uniform(*schedule.lasts)
            self.net.slow(host, self.pg.port, schedule.delay_ms, schedule.loss, number)
            self.history.cuts.append(time.monotonic())
            await asyncio.sleep(seconds)
            self.net.heal(host)
            return Fault("slow", target, "", seconds, await self.serving_again(target))
        if schedule.kind == "cut":
            seconds = self.rng.uniform(*schedule.lasts)
            self.net.cut(host, self.pg.port)
            self.history.cuts.append(time.monotonic())
            await asyncio.sleep(1.0)
            await self.push.take(other)
            await asyncio.sleep(max(0.0, seconds - 1.0))
            self.net.heal(host)
            return Fault("cut", target, held, seconds, await self.serving_again(target))
        seconds = self.rng.uniform(*schedule.pause_leases) * schedule.lease
        server = self.servers[target]
        session = self.push.session_on(target)
        server.pause()
        self.history.cuts.append(time.monotonic())
        if target == holder:
            await asyncio.sleep(min(0.5, seconds / 2))
            await self.push.take(1 - target)
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - self.history.cuts[-1])))
        pause = server.resume()
        if session is not None:
            self.history.paused.setdefault((PUSH, session), []).append(pause)
        return Fault("pause", target, held, seconds, await self.serving_again(target))

    async def aggregate_caught_up(self) -> tuple[list[tuple[int, str]], list[int]]:
        async with asyncio.timeout(DEADLINE):
            while True:
                copied, positions = await self.watch.copied()
                head = max((e for e, _t in self.history.final.get("events/0", [])), default=0)
                if min(positions, default=0) >= head:
                    return copied, positions
                await asyncio.sleep(0.2)  # the copier works on its own: nothing signals


async def run(
    schedule: Schedule, workdir: Path, say: Callable[[str], None] = lambda _line: None
) -> Result:
    """Run ``schedule`` (``workdir`` keeps the servers' logs)."""
    began = time.monotonic()
    with NetHosts(2) as net, Postgres([h.gateway for h in net.hosts]) as pg:
        await prepare(pg.url(net.hosts[0].gateway))
        logs = [(workdir / f"server{n}.log").open("w+") for n in range(2)]
        servers = [
            Server(host, pg.url(host.gateway), schedule, log)
            for host, log in zip(net.hosts, logs, strict=True)
        ]
        state = Run(schedule, net, pg, servers)
        outcome = Result(schedule, state.history, Verdicts())
        watching = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        try:
            for server in servers:
                await server.start()
            await state.push.take(0)
            state.load.start()
            tasks.append(asyncio.create_task(state.watch.positions(watching)))
            for number in range(schedule.faults):
                await state.load.acknowledged_again()
                fault = await state.fault(number)
                outcome.faults.append(fault)
                say(
                    f"{fault.kind} {number + 1}/{schedule.faults} of server {fault.server}"
                    f"{' (holding the ' + fault.held + ')' if fault.held else ''}"
                    f" for {fault.seconds:.1f} s; serving again "
                    f"{fault.serving_again:.2f} s after"
                )
            await state.load.acknowledged_again()
            await state.load.stop_producing()
            say("producers stopped")
            await state.load.caught_up(lambda: state.push.last_id)
            say("consumers caught up")
            final, end = await state.load.final_read()
            state.load.record_final(final, end)
            outcome.events = len(final)
            copied, _positions = await state.aggregate_caught_up()
            state.history.copies[AGGREGATE] = (["events/0"], copied)
            outcome.copies = len(copied)
            say("aggregate read")
        except (RuntimeError, TimeoutError) as exc:
            outcome.failed = f"{type(exc).__name__}: {exc}"
        finally:
            watching.set()
            await state.load.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.push.close()
            for server in servers:
                await server.stop()
            for log in logs:
                log.seek(0)
                for last_id in late_writes(log.read(), PUSH):
                    state.history.late_writes.setdefault(PUSH, set()).add(last_id)
                log.close()
    outcome.verdicts = check(state.history)
    outcome.seconds = time.monotonic() - began
    return outcome


#: A server's report of a push group written after its claim lapsed (ftn18/push.py).
_LATE_WRITE: Final = re.compile(
    r"onEvents seq [0-9]+ \(events to id ([0-9]+)\) to user [0-9]+ (\S+) was written"
)


def late_writes(log: str, component: str) -> list[int]:
    """The last ids of the groups to ``component`` that a server's ``log`` says it wrote
    after its claim had lapsed."""
    return [int(m[1]) for m in _LATE_WRITE.finditer(log) if m[2] == component]


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="bench-netfaults-"))
