"""What futoin-evt is measured against besides the reference: NATS JetStream with a durable
consumer, and the raw limits of the parts it builds on (batched SQLite commits, a bare
websockets echo, a bare websockets server sending pages read from SQLite, acked one by
one). Each method returns the same unit as the futoin-evt workload of that name;
``cpu_seconds`` gives the CPU time the server side has used so far."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

from futoin_evt.ftn18.push import PushConfig
from futoin_evt.ftn18.services import REPLY_ENVELOPE_BYTES

from . import workloads
from .systems import System, payload, prepare_futoin_evt_db, process_cpu_seconds

NATS_URL = "nats://127.0.0.1:4222"


def ensure_nats() -> None:
    """Start the machine's NATS server (with JetStream) if it is not running."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 4222), timeout=1):
        return
    subprocess.run(
        ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
         "/usr/sbin/nats-server", "--", "-a", "127.0.0.1", "-p", "4222", "-js", "-sd",
         "/var/lib/nats-server", "-l", "/var/log/nats-server.log"],
        check=True,
    )  # fmt: skip


def nats_server_pid() -> int:
    """The process listening as the machine's NATS server (its command is nats-server)."""
    for stat in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if stat.read_text().strip() == "nats-server":
                return int(stat.parent.name)
    raise RuntimeError("no nats-server process found")


def _payloads(count: int) -> list[bytes]:
    return [json.dumps({"type": "ORDER", "data": payload(i)}).encode() for i in range(count)]


class JetStream:
    """A stream per measurement, file storage, a durable consumer acknowledging what it read."""

    name = "JetStream"

    def __init__(self) -> None:
        self._pid = nats_server_pid()

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self._pid)

    @contextlib.asynccontextmanager
    async def _stream(self, prefill: int = 0) -> AsyncIterator[tuple[Any, Any, str]]:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        name = f"BENCH{uuid.uuid4().hex[:12].upper()}"
        subject = f"bench.{name.lower()}"
        await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE))
        try:
            if prefill:
                await self._publish(js, subject, _payloads(prefill), 32)
            yield nc, js, subject
        finally:
            await js.delete_stream(name)
            await nc.close()

    @staticmethod
    async def _publish(
        js: Any, subject: str, messages: list[bytes], window: int, *, keyed: bool = False
    ) -> float:
        """Publish all of ``messages``, ``window`` at a time, each waiting for its ack;
        ``keyed``: each with a message id (``Nats-Msg-Id``) of its own, which the stream
        deduplicates within its window (2 minutes)."""
        if keyed:
            producer = secrets.token_hex(8)
            ids = [{"Nats-Msg-Id": f"{producer}:{n + 1}"} for n in range(len(messages))]
        start = time.perf_counter()

        async def worker(w: int) -> None:
            if keyed:
                for n in range(w, len(messages), window):
                    await js.publish(subject, messages[n], headers=ids[n])
                return
            for m in messages[w::window]:
                await js.publish(subject, m)

        await asyncio.gather(*(worker(w) for w in range(window)))
        return len(messages) / (time.perf_counter() - start)

    async def add_serial(self, count: int, *, keyed: bool = False) -> float:
        async with self._stream() as (_nc, js, subject):
            return await self._publish(js, subject, _payloads(count), 1, keyed=keyed)

    async def add_in_flight(self, count: int, *, keyed: bool = False) -> float:
        async with self._stream() as (_nc, js, subject):
            return await self._publish(js, subject, _payloads(count), 32, keyed=keyed)

    async def add_from_connections(self, count: int) -> float:
        async with self._stream() as (_nc, _js, subject):
            conns = [await nats.connect(NATS_URL) for _ in range(8)]
            try:
                rates = await asyncio.gather(*(
                    self._publish(c.jetstream(), subject, _payloads(count // 8), 4) for c in conns
                ))  # fmt: skip
                return sum(rates)
            finally:
                for c in conns:
                    await c.close()

    async def poll_drain(self, count: int) -> float:
        async with self._stream(prefill=count) as (_nc, js, subject):
            config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
            sub = await js.pull_subscribe(subject, durable="drain", config=config)
            seen = 0
            start = time.perf_counter()
            while seen < count:
                msgs = await sub.fetch(1000, timeout=10)
                seen += len(msgs)
                await msgs[-1].ack()  # acknowledges the batch (AckPolicy.ALL)
            return seen / (time.perf_counter() - start)

    async def push_catch_up(self, count: int) -> float:
        async with self._stream(prefill=count) as (_nc, js, subject):
            done = asyncio.get_running_loop().create_future()
            seen = 0

            async def on_message(msg: Any) -> None:
                nonlocal seen
                seen += 1
                if seen % 1000 == 0 or seen == count:
                    await msg.ack()
                if seen >= count and not done.done():
                    done.set_result(None)

            config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
            start = time.perf_counter()
            sub = await js.subscribe(subject, durable="push", cb=on_message, config=config,
                                     pending_msgs_limit=-1)  # fmt: skip
            await asyncio.wait_for(done, 600)
            rate = seen / (time.perf_counter() - start)
            await sub.unsubscribe()
            return rate

    async def push_latency(self, count: int, rate: float = 1000.0) -> dict[str, float]:
        async with self._stream() as (_nc, js, subject):
            latencies: list[float] = []
            done = asyncio.get_running_loop().create_future()

            async def on_message(msg: Any) -> None:
                latencies.append((time.perf_counter() - json.loads(msg.data)["t"]) * 1000)
                await msg.ack()
                if len(latencies) >= count and not done.done():
                    done.set_result(None)

            sub = await js.subscribe(subject, durable="lat", cb=on_message)
            start = time.perf_counter()
            pending = set()
            for i in range(count):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the producer
                data = json.dumps({"t": time.perf_counter(), "i": i}).encode()
                task = asyncio.ensure_future(js.publish(subject, data))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.wait_for(done, 120)
            await sub.unsubscribe()
            ordered = sorted(latencies[:count])
            return {"p50": ordered[len(ordered) // 2], "p99": ordered[int(len(ordered) * 0.99)],
                    "max": ordered[-1]}  # fmt: skip


class RawLimits:
    """The parts alone, at one durability: round trips of the same load generator against a
    bare websockets echo server (:mod:`bench.echo`, a process of its own), and batched SQLite
    commits of the same rows in WAL mode, a batch per commit as the calls in flight allow.

    For one call at a time the limit is a round trip plus a one-row commit, one after the
    other. With calls in flight the two overlap (a server reads the next calls while a commit
    runs), so the limit is the slower of the two.

    The read limits (poll drain, push catch-up) read each group from a SQLite file of the
    same events with sqlite3 on a thread, then send it (:func:`read_groups`): the store read
    is part of the limit, as it is of futoin-evt's figure. Use it as ``async with``.
    """

    def __init__(self, durability: str = "full") -> None:
        self.durability = durability
        self.name = "raw limit" if durability == "full" else f"raw limit {durability}"
        self._echo: System | None = None
        self._reads: System | None = None
        self._commit_cpu = 0.0
        #: Prefilled files of the read limits, by event count.
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-raw-")
        self._files: dict[int, Path] = {}

    async def __aenter__(self) -> RawLimits:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.echo", stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        url = (await proc.stdout.readline()).decode().strip()
        self._echo = System("echo", url, "", "", Path(), proc)
        self._reads = await start_raw_reads()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for server in (self._echo, self._reads):
            if server is not None:
                await server.stop()
        self._tmp.cleanup()

    def cpu_seconds(self) -> float:
        """CPU time of the echo and read servers plus that of the commits so far."""
        assert self._echo is not None
        assert self._reads is not None
        return self._echo.cpu_seconds() + self._reads.cpu_seconds() + self._commit_cpu

    async def add_serial(self, count: int) -> float:
        assert self._echo is not None
        round_trips = await workloads.add_serial(self._echo, count)
        commits = await self._commits(count, 1)
        return 1 / (1 / round_trips + 1 / commits)

    async def add_in_flight(self, count: int) -> float:
        assert self._echo is not None
        return min(await workloads.add_in_flight(self._echo, count), await self._commits(count, 32))

    async def add_from_connections(self, count: int) -> float:
        assert self._echo is not None
        round_trips = await workloads.add_from_connections(self._echo, count)
        return min(round_trips, await self._commits(count, 32))

    async def _commits(self, count: int, batch: int) -> float:
        rate, cpu = await asyncio.to_thread(sqlite_commits, count, batch, self.durability)
        self._commit_cpu += cpu
        return rate

    async def poll_drain(self, count: int) -> float:
        return await self._store_groups(count, POLL_PAGE_BYTES, POLL_WINDOW)

    async def push_catch_up(self, count: int) -> float:
        return await self._store_groups(count, PUSH_GROUP_BYTES, PUSH_WINDOW)

    async def _store_groups(self, count: int, max_bytes: int, window: int) -> float:
        """Events/s of :func:`read_groups` from a file of ``count`` events (made once)."""
        path = self._files.get(count)
        if path is None:
            path = self._files[count] = Path(self._tmp.name) / f"read-{count}.sqlite"
            await asyncio.to_thread(prepare_futoin_evt_db, path, count)
        assert self._reads is not None
        return await read_groups(self._reads, path, count, max_bytes, window)

    async def prebuilt_groups(self, count: int) -> float:
        """The earlier read limit: groups of 1,000 events sent as frames built beforehand
        (no store read at all), the client acking each."""
        return await _ws_groups(count)


#: A pollEvents reply holds what fits its maxrspsize (8M in ifaces/futoin.evt.poll-1.1);
#: an FTN18 push group 1 MiB. Both hold 1000 events of the benchmark's.
POLL_PAGE_BYTES: Final = 8 * 1024 * 1024 - REPLY_ENVELOPE_BYTES
PUSH_GROUP_BYTES: Final = PushConfig().max_group_bytes


async def start_raw_reads() -> System:
    """The raw read limit's server (:mod:`bench.raw_reads`), a process of its own."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.raw_reads", stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    url = (await proc.stdout.readline()).decode().strip()
    return System("raw reads", url, "", "", Path(), proc)


#: Groups the raw limit has unacknowledged: one for a poll, a push stream's window.
POLL_WINDOW: Final = 1
PUSH_WINDOW: Final = PushConfig().window


async def read_groups(server: System, path: Path, count: int, max_bytes: int, window: int) -> float:
    """The read limit, like for like: events/s of ``count`` events of the SQLite file
    ``path`` (futoin-evt's schema) that ``server`` (:func:`start_raw_reads`) reads and sends
    a group at a time, with ``window`` groups at most unacknowledged."""
    async with ws_connect(server.url, compression=None, max_size=None) as ws:
        start = time.perf_counter()
        request = {"db": str(path), "count": count, "max_bytes": max_bytes, "window": window}
        await ws.send(json.dumps(request))
        seen = 0
        while seen < count:
            message = json.loads(await ws.recv())
            seen += len(message["p"]["events"])
            await ws.send(f'{{"r":true,"rid":"{message["rid"]}"}}')
        return seen / (time.perf_counter() - start)


async def _ws_groups(count: int, group: int = 1000) -> float:
    """A bare websockets server sends groups of events; the client acks each group."""
    events = [{"id": str(i), "type": "ORDER", "data": payload(i), "ts": "2026-01-01T00:00:00Z"}
              for i in range(group)]  # fmt: skip
    frame = json.dumps({"f": "x", "p": {"seq": 0, "events": events}, "rid": "S1"}).encode()
    groups = count // group

    async def handler(ws: ServerConnection) -> None:
        for _ in range(groups):
            await ws.send(frame)
            await ws.recv()

    async with ws_serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with ws_connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            start = time.perf_counter()
            for _ in range(groups):
                json.loads(await ws.recv())
                await ws.send(b'{"r":true,"rid":"S1"}')
            return groups * group / (time.perf_counter() - start)


def sqlite_commits(count: int, batch: int, durability: str) -> tuple[float, float]:
    """Rows/s and CPU seconds of multi-row INSERTs of ``batch`` rows, one transaction each,
    in WAL mode at ``durability`` (``synchronous=FULL`` syncs at each commit)."""
    count -= count % batch
    rows = [json.loads(p) for p in workloads.add_params(count)]
    values = [(r["type"], json.dumps(r["data"]), "2026-01-01T00:00:00.000Z") for r in rows]
    chunks = [[v for row in values[i : i + batch] for v in row] for i in range(0, count, batch)]
    insert = "INSERT INTO events (type, data, ts) VALUES " + ",".join(["(?, ?, ?)"] * batch)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "raw.sqlite", isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={durability.upper()}")
            conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                         " type TEXT NOT NULL, data TEXT, ts TEXT NOT NULL)")  # fmt: skip
            cpu = time.thread_time()
            start = time.perf_counter()
            for chunk in chunks:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(insert, chunk)
                conn.execute("COMMIT")
            rate = count / (time.perf_counter() - start)
            return rate, time.thread_time() - cpu
        finally:
            conn.close()
