"""``python -m bench.dcb [--quick] [--transport ftn3|http] [--runs N] [--source DIR]
[--postgres ADMIN_URL]``: the
DCB API of futoin-evt beside UmaDB, in one run, on the same workloads; with ``--source``,
also the futoin-evt server of the source tree ``DIR`` (another version: before and after in
the same run).

Each server runs as a process of its own on 127.0.0.1 over a temporary directory, with a
log of 1,000,000 events (100,000 with ``--quick``) in place before the clock starts. Every
event of that log carries a tag ``student:sN`` that 10 events share. futoin-evt gets its log
written straight into the SQLite file before it starts (rows as its DCB append writes them);
UmaDB gets its log through its client in batches of 1000. Then, on each server:

- read by tag: reads of one ``student:sN`` each (10 matching events), one after the other
  from one client; the median and p99 of the latency;
- conditional appends, from 1 client and from 32 concurrent clients: each client appends
  one event tagged with a ``course:cK`` of its own, on the condition that no event with that
  tag came after the position of its last append (at first: the head its read returned). So
  every condition is checked against the index and holds. ``--runs`` times; the median.

With ``--postgres``, futoin-evt runs on a new database of that PostgreSQL (dropped at the
end), and only the appends are measured (from an empty log).

futoin-evt runs with ``--durability full``; UmaDB with its defaults (it syncs every commit
to disk). futoin-evt's clients call ``futoin.evt.dcb:1.0`` over FTN3/WebSocket, one
connection each (faster here than the HTTP API through httpx; ``--transport http`` measures
that instead). UmaDB's clients are its own Python package (Rust over gRPC), each in a thread
of its own. All clients run in this process, on the same cores as the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import httpx
import umadb

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.stream import utc_timestamp
from futoin_evt.ftn3.messages import encode_json

from . import postgres as pg
from .systems import PASSWORD, USER, System, free_port, prepare_futoin_evt_db, print_figures, serve

DCB: Final = "futoin.evt.dcb:1.0"
CLIENTS: Final = 32
#: Events of the log that share one ``student:sN`` tag: what a read by tag matches.
PER_TAG: Final = 10
LOG_TYPE: Final = "StudentRegistered"
APPEND_TYPE: Final = "StudentSubscribed"
WARM_UP_READS: Final = 10

READ_P50: Final = "read by tag, 10 of {log:,} events, p50 (µs)"
READ_P99: Final = "read by tag, 10 of {log:,} events, p99 (µs)"
APPEND_1: Final = "conditional append, 1 client (appends/s)"
APPEND_32: Final = f"conditional append, {CLIENTS} clients (appends/s)"


@dataclass(frozen=True)
class Sizes:
    log: int
    reads: int
    serial_appends: int
    #: Appends of each of the concurrent clients.
    appends_per_client: int
    runs: int


FULL: Final = Sizes(1_000_000, 200, 2_000, 300, 3)
QUICK: Final = Sizes(100_000, 200, 500, 50, 1)


def log_tag(i: int, log: int) -> str:
    """The tag of event ``i`` (0-based) of a log of ``log`` events."""
    return f"student:s{i % (log // PER_TAG)}"


def log_data(i: int) -> dict[str, object]:
    return {"student": f"s-{i:07d}", "name": "benchmark student", "year": 2026}


def course_tag(client: int) -> str:
    return f"course:c{client}"


def tag_query(tag: str) -> dict[str, Any]:
    return {"items": [{"tags": [tag]}]}


def append_data(client: int, i: int) -> dict[str, object]:
    return {"course": f"c{client}", "student": f"s-{i:07d}"}


def read_tags(sizes: Sizes) -> list[str]:
    """The tags the reads ask for: the same on every system, spread over the log."""
    picks = random.Random(14).sample(range(sizes.log // PER_TAG), WARM_UP_READS + sizes.reads)
    return [log_tag(i, sizes.log) for i in picks]


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@dataclass
class Measured:
    read_us: list[float]
    serial: list[float]
    concurrent: list[float]

    def figures(self, log: int) -> dict[str, float]:
        """The rows; without reads (``--postgres``), the appends' only."""
        reads = {}
        if self.read_us:
            reads[READ_P50.format(log=log)] = statistics.median(self.read_us)
            reads[READ_P99.format(log=log)] = p99(self.read_us)
        return {
            **reads,
            APPEND_1: statistics.median(self.serial),
            APPEND_32: statistics.median(self.concurrent),
        }


# -- futoin-evt ----------------------------------------------------------------------------------


def prepare_futoin_evt_log(path: Path, log: int) -> None:
    """The schema, the bench user, and ``log`` DCB events written as the store writes them."""
    prepare_futoin_evt_db(path, 0)
    ts = utc_timestamp()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (id, type, data, ts) VALUES (?, ?, ?, ?)",
            ((i + 1, LOG_TYPE, encode_json(log_data(i)), ts) for i in range(log)),
        )
        conn.executemany(
            "INSERT INTO dcb_events (event_id, tags) VALUES (?, ?)",
            ((i + 1, encode_json([log_tag(i, log)])) for i in range(log)),
        )
        conn.executemany(
            "INSERT INTO event_tags (tag, event_id) VALUES (?, ?)",
            ((log_tag(i, log), i + 1) for i in range(log)),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def start_futoin_evt_server(db: Path | str, source: Path | None = None) -> System:
    """The server of this tree, or of the source tree ``source``."""
    return await serve(db, "--durability", "full", source=source)


class DcbCaller(Protocol):
    """One client connection to futoin-evt's DCB API."""

    async def read_tag(self, tag: str) -> tuple[int, int]:
        """(events matched, head)."""
        ...

    async def append_tagged(self, tag: str, data: dict[str, object], after: int) -> int:
        """The position of the event; the condition: nothing tagged ``tag`` after ``after``."""
        ...

    async def close(self) -> None: ...


def append_params(tag: str, data: dict[str, object], after: int) -> dict[str, Any]:
    return {
        "events": [{"type": APPEND_TYPE, "data": data, "tags": [tag]}],
        "condition": {"failIfEventsMatch": tag_query(tag), "after": after},
    }


class Ftn3Caller:
    def __init__(self, client: EventStreamClient) -> None:
        self._client = client

    @classmethod
    async def connect(cls, url: str) -> Ftn3Caller:
        return cls(await EventStreamClient.connect(url, credentials=f"{USER}:{PASSWORD}"))

    async def read_tag(self, tag: str) -> tuple[int, int]:
        result = await self._client.ftn3.call(DCB, "read", {"query": tag_query(tag)})
        return len(result["events"]), int(result["head"])

    async def append_tagged(self, tag: str, data: dict[str, object], after: int) -> int:
        return int(await self._client.ftn3.call(DCB, "append", append_params(tag, data, after)))

    async def close(self) -> None:
        await self._client.close()


class HttpCaller:
    """``POST /dcb/v1/...`` over one kept-alive connection."""

    def __init__(self, url: str) -> None:
        base = url.replace("ws://", "http://", 1).rstrip("/") + "/dcb/v1"
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._http = httpx.AsyncClient(base_url=base, auth=(USER, PASSWORD), limits=limits)

    @classmethod
    async def connect(cls, url: str) -> HttpCaller:
        return cls(url)

    async def read_tag(self, tag: str) -> tuple[int, int]:
        answer = await self._post("/read", {"query": tag_query(tag)})
        return len(answer["events"]), int(answer["head"])

    async def append_tagged(self, tag: str, data: dict[str, object], after: int) -> int:
        return int((await self._post("/append", append_params(tag, data, after)))["position"])

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._http.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text}")
        return response.json()

    async def close(self) -> None:
        await self._http.aclose()


Connect = Callable[[str], Awaitable[DcbCaller]]
TRANSPORTS: Final[dict[str, tuple[str, Connect]]] = {
    "ftn3": ("FTN3 futoin.evt.dcb:1.0 over WebSocket", Ftn3Caller.connect),
    "http": ("HTTP /dcb/v1 through httpx, kept-alive", HttpCaller.connect),
}


async def futoin_evt_reads(caller: DcbCaller, tags: list[str]) -> list[float]:
    latencies: list[float] = []
    for n, tag in enumerate(tags):
        start = time.perf_counter()
        matched, _head = await caller.read_tag(tag)
        elapsed = time.perf_counter() - start
        assert matched == PER_TAG, f"{tag}: {matched} events"
        if n >= WARM_UP_READS:
            latencies.append(elapsed * 1e6)
    return latencies


async def futoin_evt_appends(url: str, connect: Connect, first: int, clients: int, n: int) -> float:
    """Appends/s of ``clients`` concurrent clients, ``n`` conditional appends each; client
    ``k`` appends with the tag of ``first + k``."""
    callers = [await connect(url) for _ in range(clients)]
    try:
        heads = [(await c.read_tag(course_tag(first + k)))[1] for k, c in enumerate(callers)]

        async def appender(k: int) -> None:
            tag, after = course_tag(first + k), heads[k]
            for i in range(n):
                after = await callers[k].append_tagged(tag, append_data(first + k, i), after)

        start = time.perf_counter()
        await asyncio.gather(*(appender(k) for k in range(clients)))
        elapsed = time.perf_counter() - start
    finally:
        for caller in callers:
            await caller.close()
    return clients * n / elapsed


async def measure_futoin_evt(
    sizes: Sizes, connect: Connect, source: Path | None = None, postgres: str | None = None
) -> Measured:
    """``postgres``: an admin URL; the server runs on a new database there, the appends
    only (its log starts empty)."""
    async with contextlib.AsyncExitStack() as stack:
        if postgres is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dcb-"))
            db: Path | str = Path(tmp) / "futoin-evt.sqlite"
            prepare_futoin_evt_log(Path(db), sizes.log)
        else:
            db = await stack.enter_async_context(pg.database(postgres))
            await pg.prepare(db, 0)
        system = await start_futoin_evt_server(db, source)
        stack.push_async_callback(system.stop)
        read_us: list[float] = []
        if postgres is None:
            reader = await connect(system.url)
            try:
                read_us = await futoin_evt_reads(reader, read_tags(sizes))
            finally:
                await reader.close()
        measured = Measured(read_us, [], [])
        for run in range(sizes.runs):
            first = run * (CLIENTS + 1)
            measured.serial.append(
                await futoin_evt_appends(system.url, connect, first, 1, sizes.serial_appends)
            )
            measured.concurrent.append(
                await futoin_evt_appends(
                    system.url, connect, first + 1, CLIENTS, sizes.appends_per_client
                )
            )
    return measured


# -- UmaDB ---------------------------------------------------------------------------------------


class UmaDbServer:
    """The server the ``umadb`` package ships, on a port of its own over ``db_dir``."""

    def __init__(self, db_dir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from umadb.umadb_server_cli import main; main()",
             "--listen", self.url.removeprefix("http://"), "--db-path", str(db_dir / "uma.db")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self._process.stdout is not None
        self._output: list[str] = []
        for line in self._process.stdout:
            self._output.append(line)
            if "is listening on" in line:
                break
        else:
            self._process.wait()
            raise RuntimeError("the UmaDB server did not start:\n" + "".join(self._output))
        # whatever it prints later must not fill the pipe
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self._process.stdout is not None
        for _line in self._process.stdout:
            pass

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def uma_event(event_type: str, tag: str, data: dict[str, object]) -> umadb.Event:
    return umadb.Event(event_type, encode_json(data).encode(), [tag])


def uma_query(tag: str) -> umadb.Query:
    return umadb.Query([umadb.QueryItem(tags=[tag])])


def fill_umadb(client: umadb.Client, log: int, batch: int = 1000) -> None:
    for first in range(0, log, batch):
        last = min(first + batch, log)
        client.append(
            [uma_event(LOG_TYPE, log_tag(i, log), log_data(i)) for i in range(first, last)]
        )
    head = client.head()
    assert head == log, f"UmaDB holds {head} events, not {log}"


def umadb_reads(client: umadb.Client, tags: list[str]) -> list[float]:
    latencies: list[float] = []
    for n, tag in enumerate(tags):
        start = time.perf_counter()
        events, _head = client.read(uma_query(tag)).collect_with_head()
        elapsed = time.perf_counter() - start
        assert len(events) == PER_TAG, f"{tag}: {len(events)} events"
        if n >= WARM_UP_READS:
            latencies.append(elapsed * 1e6)
    return latencies


def umadb_appends(url: str, first: int, clients: int, n: int) -> float:
    """As :func:`futoin_evt_appends`: one thread and one client each."""
    start_line = threading.Barrier(clients + 1)
    failures: list[BaseException] = []

    def appender(k: int) -> None:
        try:
            with umadb.Client(url) as client:
                tag = course_tag(first + k)
                after = client.read(uma_query(tag)).collect_with_head()[1] or 0
                start_line.wait()
                for i in range(n):
                    condition = umadb.AppendCondition(uma_query(tag), after)
                    event = uma_event(APPEND_TYPE, tag, append_data(first + k, i))
                    after = client.append([event], condition)
        except BaseException as exc:
            failures.append(exc)
            start_line.abort()

    threads = [threading.Thread(target=appender, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start_line.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    return clients * n / elapsed


def measure_umadb(sizes: Sizes) -> Measured:
    with tempfile.TemporaryDirectory(prefix="bench-dcb-") as tmp:
        server = UmaDbServer(Path(tmp))
        try:
            with umadb.Client(server.url) as client:
                fill_umadb(client, sizes.log)
                measured = Measured(umadb_reads(client, read_tags(sizes)), [], [])
            for run in range(sizes.runs):
                first = run * (CLIENTS + 1)
                measured.serial.append(umadb_appends(server.url, first, 1, sizes.serial_appends))
                measured.concurrent.append(
                    umadb_appends(server.url, first + 1, CLIENTS, sizes.appends_per_client)
                )
        finally:
            server.stop()
    return measured


# -- the report ----------------------------------------------------------------------------------


def side_by_side(
    ours: dict[str, float], theirs: dict[str, float], before: dict[str, float] | None = None
) -> Iterator[tuple[str, float]]:
    """Per workload: futoin-evt, UmaDB, and futoin-evt/UmaDB in percent; with ``before``
    (the server of ``--source``), its figure and its ratio to UmaDB too."""
    for name, value in ours.items():
        other = theirs[name]
        yield f"{name}: futoin-evt", value
        if before is not None:
            yield f"{name}: futoin-evt --source", before[name]
        yield f"{name}: UmaDB", other
        yield f"{name}: futoin-evt/UmaDB (%)", 100 * value / other
        if before is not None:
            yield f"{name}: futoin-evt --source/UmaDB (%)", 100 * before[name] / other


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dcb", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a log of 100,000; fewer appends")
    parser.add_argument("--transport", choices=sorted(TRANSPORTS), default="ftn3")
    parser.add_argument("--runs", type=int, help="append runs (the median is shown)")
    parser.add_argument(
        "--source", type=Path, help="also measure the futoin-evt server of this source tree"
    )
    parser.add_argument(
        "--postgres",
        metavar="ADMIN_URL",
        help="futoin-evt on a new database of this PostgreSQL instead (the appends only)",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.runs is not None:
        sizes = dataclasses.replace(sizes, runs=args.runs)
    transport, connect = TRANSPORTS[args.transport]
    started = time.perf_counter()
    ours = asyncio.run(measure_futoin_evt(sizes, connect, None, args.postgres)).figures(sizes.log)
    before = None
    if args.source is not None:
        before = asyncio.run(
            measure_futoin_evt(sizes, connect, args.source, args.postgres)
        ).figures(sizes.log)
    theirs = {k: v for k, v in measure_umadb(sizes).figures(sizes.log).items() if k in ours}
    print_figures(
        f"DCB: futoin-evt ({transport}; --durability full) beside UmaDB"
        f" {importlib.metadata.version('umadb')} (its Python client over gRPC);"
        f" {sizes.reads} reads, appends {sizes.serial_appends:,} from 1 client and"
        f" {CLIENTS} x {sizes.appends_per_client:,}, median of {sizes.runs} run(s);"
        " for latencies a lower % is better",
        dict(side_by_side(ours, theirs, before)),
    )
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
