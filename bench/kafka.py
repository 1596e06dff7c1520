"""``python -m bench.kafka [--quick] [--runs N] [--profile]``: the Kafka door beside FTN18 and
the raw limits of the store, at ``--durability normal``.

One server (``serve --kafka 127.0.0.1:0``, a process of its own) runs, each run:

- produce: confluent-kafka (librdkafka) sends N records of 100 bytes to ``events`` with
  ``acks=all``, ``linger.ms=5`` and idempotence on, until all are acknowledged;
- fetch: a consumer of a new group reads them from the beginning (timed from its
  assignment until it has read N);
- FTN18 addEvent with 32 calls in flight on one connection, on the same server;
- group settling: 4 members of a group on a topic of 8 partitions (``heartbeat.interval.ms``
  100); a 5th joins (timed from making its client), then leaves cleanly (LeaveGroup); each
  time, how long until every member has its new assignment (librdkafka's ``on_assign``),
  the median of a few repeats;

with the server's CPU time per record (``/proc/PID/stat``). Beside them, the raw limits of
the same store at the same durability, as ``python -m bench`` has them
(:class:`bench.others.RawLimits`): write, the slower of a websockets echo's round trips and
SQLite commits of 32 rows, with 32 in flight; read, groups read from a SQLite file and sent
as a push catch-up's; and SQLite commits of 1,000 rows alone, the store's own limit for
large batches (shown, no target). Printed with the door's targets (:data:`TARGETS`,
:data:`BOUNDS`); a missed target fails nothing.

``--profile``: instead, py-spy samples of the server while the producer, then the consumer,
run, to ``bench/profiles/kafka-produce.*`` and ``kafka-fetch.*``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from . import workloads
from .others import RawLimits, sqlite_commits
from .profile import OUT, summary
from .systems import PASSWORD, USER, System, payload, running, start_futoin_evt

DURABILITY: Final = "normal"
TOPIC: Final = "events"
#: The topic of the group rows, and its partition count.
GROUP_TOPIC: Final = "settle"
GROUP_PARTITIONS: Final = 8
GROUP_MEMBERS: Final = 4
VALUE_BYTES: Final = 100
RAW_BATCH: Final = 1000

PRODUCE: Final = "Kafka produce, acks=all, linger.ms=5, idempotent (records/s)"
FETCH: Final = "Kafka fetch, 1 group member from the beginning (records/s)"
ADD_32: Final = "FTN18 addEvent, 32 in flight on 1 connection (calls/s)"
#: The raw limit of addEvent-32 (``python -m bench``'s): the slower of the round trips of a
#: websockets echo and SQLite commits of 32 rows.
RAW_ADD_32: Final = "raw limit of addEvent-32: commits of 32 rows, ws echo (rows/s)"
#: The store's write limit for a producer's batches: SQLite commits of 1,000 rows each.
RAW_WRITE: Final = f"raw write limit: SQLite commits of {RAW_BATCH:,} rows (rows/s)"
RAW_READ: Final = "raw read limit: SQLite groups read and sent (events/s)"
SETTLE_JOIN: Final = "Kafka group of 4 on 8 partitions, a 5th joins: settled (ms)"
SETTLE_LEAVE: Final = "Kafka group of 5 on 8 partitions, 1 leaves: settled (ms)"
CPU_SUFFIX: Final = ": server CPU (µs/op)"


#: The door's targets, as ratios to what the door is compared with; not floors: nothing fails
#: when one is missed. Label, row, what it is compared with, at least this ratio. The raw
#: write limit is ``python -m bench``'s (that of addEvent-32), as for the FTN18 floors.
TARGETS: Final = (
    ("produce / FTN18 addEvent-32", PRODUCE, ADD_32, 3.0),
    ("produce / raw write limit", PRODUCE, RAW_ADD_32, 0.5),
    ("fetch / raw read limit", FETCH, RAW_READ, 0.8),
)
#: Targets given as bounds (ms): row, at most this.
BOUNDS: Final = ((SETTLE_JOIN, 1000.0), (SETTLE_LEAVE, 1000.0))


@dataclass(frozen=True)
class Sizes:
    records: int
    add_in_flight: int
    #: Joins and leaves of the group rows, each timed.
    settle_repeats: int


QUICK: Final = Sizes(20_000, 3_000, 3)
FULL: Final = Sizes(200_000, 30_000, 5)


def cpu_row(row: str) -> str:
    return row.rpartition(" (")[0] + CPU_SUFFIX


# -- the server --------------------------------------------------------------------------------


async def start(workdir: Path, source: Path | None = None) -> tuple[System, str]:
    """The server at :data:`DURABILITY` with the Kafka door and the topic
    :data:`GROUP_TOPIC` (``source``: from that source tree); and the door's ``HOST:PORT``."""
    system = await start_futoin_evt(
        workdir,
        "--kafka",
        "127.0.0.1:0",
        durability=DURABILITY,
        source=source,
        streams={GROUP_TOPIC: GROUP_PARTITIONS},
    )
    try:
        return system, await kafka_address(system)
    except BaseException:
        await system.stop()
        raise


async def kafka_address(system: System) -> str:
    """The Kafka door's ``HOST:PORT``, from the lines the server prints under its start-up
    line (each door and its address; :func:`bench.systems.serve` reads the first)."""
    assert system.process.stdout is not None
    async with asyncio.timeout(30):
        while line := (await system.process.stdout.readline()).decode():
            found = re.search(r"kafka://(\S+)", line)
            if found:
                return found.group(1)
    raise RuntimeError("the server did not say where its Kafka door listens")


def login(bootstrap: str) -> dict[str, Any]:
    """A client's settings: SASL PLAIN as :data:`USER`."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": USER,
        "sasl.password": PASSWORD,
    }


# -- produce and fetch -------------------------------------------------------------------------


def values(count: int) -> list[bytes]:
    """Record values of :data:`VALUE_BYTES` each (the benchmark payload's JSON, cut or
    padded), made before the clock starts; no content type, so the door keeps them as
    opaque bytes, as most Kafka producers send theirs."""
    return [json.dumps(payload(i)).encode()[:VALUE_BYTES].ljust(VALUE_BYTES) for i in range(count)]


def produce(bootstrap: str, count: int) -> float:
    """Records/s of one idempotent producer sending ``count`` records to partition 0 of
    :data:`TOPIC`, until the last is acknowledged by all (``acks=all``)."""
    producer = Producer(
        {**login(bootstrap), "acks": "all", "linger.ms": 5, "enable.idempotence": True}
    )
    failed: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failed.append(str(error))

    records = values(count)
    producer.produce(TOPIC, records[0], partition=0, on_delivery=delivered)
    if producer.flush(60):  # connected, logged in, a producer id: before the clock starts
        raise RuntimeError("the first record was not acknowledged in 60 s")
    started = time.perf_counter()
    for value in records:
        while True:
            try:
                producer.produce(TOPIC, value, partition=0, on_delivery=delivered)
                break
            except BufferError:  # librdkafka's queue is full: serve the acknowledgements
                producer.poll(0.005)
        producer.poll(0)
    left = producer.flush(300)
    elapsed = time.perf_counter() - started
    if left or failed:
        raise RuntimeError(f"{left} records unacknowledged, {len(failed)} failed: {failed[:3]}")
    return count / elapsed


_groups = itertools.count(1)


def fetch(bootstrap: str, count: int) -> float:
    """Records/s a consumer of a new group reads from the beginning of :data:`TOPIC`, from
    its assignment until it has ``count`` records."""
    consumer = Consumer(
        {
            **login(bootstrap),
            "group.id": f"bench-fetch-{next(_groups)}",
            "auto.offset.reset": "earliest",
        }
    )
    started: list[float] = []

    def on_assign(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        started.append(time.perf_counter())

    consumer.subscribe([TOPIC], on_assign=on_assign)
    seen = 0
    deadline = time.monotonic() + 600
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fetched {seen} of {count} records in 600 s")
            for message in consumer.consume(1000, 1.0):
                if message.error() is not None:
                    raise RuntimeError(f"fetch failed: {message.error()}")
                seen += 1
        return seen / (time.perf_counter() - started[0])
    finally:
        consumer.close()


# -- group settling ----------------------------------------------------------------------------

Assignment = tuple[float, frozenset[int]]


class Member:
    """A consumer of a group on :data:`GROUP_TOPIC`, polled on a thread of its own; keeps
    the time and partitions of each assignment and revocation (none), and tells ``changed``."""

    def __init__(self, bootstrap: str, group: str, changed: threading.Condition) -> None:
        self.consumer = Consumer(
            {
                **login(bootstrap),
                "group.id": group,
                "heartbeat.interval.ms": 100,
                "session.timeout.ms": 6000,
            }
        )
        self.changed = changed
        self.assigned: list[Assignment] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.consumer.subscribe(
            [GROUP_TOPIC],
            on_assign=lambda _c, partitions: self._note(partitions),
            on_revoke=lambda _c, _partitions: self._note([]),
        )
        self._thread.start()

    def _note(self, partitions: list[TopicPartition]) -> None:
        with self.changed:
            self.assigned.append((time.perf_counter(), frozenset(p.partition for p in partitions)))
            self.changed.notify_all()

    def _poll(self) -> None:  # the callbacks run in poll
        while not self._stop.is_set():
            message = self.consumer.poll(0.05)
            if message is not None and message.error() is not None:
                with self.changed:
                    self.errors.append(str(message.error()))

    def stop_polling(self) -> None:
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        """Leaves the group cleanly (LeaveGroup)."""
        self.stop_polling()
        self.consumer.close()


def settled_after(
    members: list[Member], moment: float, changed: threading.Condition, timeout: float = 30.0
) -> float:
    """Seconds from ``moment`` until each member has been assigned anew since, the
    assignments together covering every partition once."""

    def latest() -> list[Assignment]:
        return [m.assigned[-1] if m.assigned else (0.0, frozenset()) for m in members]

    def settled() -> bool:
        now = latest()
        parts = sorted(p for _, a in now for p in a)
        return all(t > moment for t, _ in now) and parts == list(range(GROUP_PARTITIONS))

    with changed:
        if not changed.wait_for(settled, timeout):
            errors = [e for m in members for e in m.errors]
            raise RuntimeError(f"the group did not settle in {timeout:.0f} s: {errors[:3]}")
        return max(t for t, _ in latest()) - moment


def group_settling(bootstrap: str, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds until a group of :data:`GROUP_MEMBERS` is settled after another member joins,
    and after it leaves, ``repeats`` times each."""
    group = f"bench-settle-{next(_groups)}"
    changed = threading.Condition()
    members = [Member(bootstrap, group, changed) for _ in range(GROUP_MEMBERS)]
    joins: list[float] = []
    leaves: list[float] = []
    try:
        settled_after(members, 0.0, changed, timeout=60.0)  # the group has formed
        for _ in range(repeats):
            moment = time.perf_counter()
            joining = Member(bootstrap, group, changed)
            members.append(joining)
            joins.append(settled_after(members, moment, changed))
            members.remove(joining)
            joining.stop_polling()
            moment = time.perf_counter()
            joining.close()
            leaves.append(settled_after(members, moment, changed))
    finally:
        for member in members:
            member.close()
    return joins, leaves


# -- the run -----------------------------------------------------------------------------------

Results = dict[str, list[float]]
Record = Callable[[str, float], None]
Timed = Callable[[str, int, Awaitable[float], Callable[[], float]], Awaitable[None]]


def recorder(results: Results) -> tuple[Record, Timed]:
    """Records a row's figure; and a workload's rate with the CPU time per operation of the
    process that ``cpu_seconds`` reads."""

    def record(row: str, value: float) -> None:
        results.setdefault(row, []).append(value)

    async def timed(
        row: str, operations: int, work: Awaitable[float], cpu_seconds: Callable[[], float]
    ) -> None:
        before = cpu_seconds()
        record(row, await work)
        record(cpu_row(row), (cpu_seconds() - before) / operations * 1e6)

    return record, timed


async def measure_door(
    sizes: Sizes, runs: int, *, add_32: bool = True, source: Path | None = None
) -> Results:
    """The Kafka rows of each run on one server (``add_32``: and FTN18 addEvent-32 there;
    ``source``: the server of that source tree)."""
    results: Results = {}
    record, timed = recorder(results)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        system, bootstrap = await start(Path(tmp), source)
        async with running(system):
            cpu = system.cpu_seconds
            for _ in range(runs):
                count = sizes.records
                await timed(PRODUCE, count, asyncio.to_thread(produce, bootstrap, count), cpu)
                await timed(FETCH, count, asyncio.to_thread(fetch, bootstrap, count), cpu)
                if add_32:
                    add = sizes.add_in_flight
                    await timed(ADD_32, add, workloads.add_in_flight(system, add), cpu)
                joins, leaves = await asyncio.to_thread(
                    group_settling, bootstrap, sizes.settle_repeats
                )
                record(SETTLE_JOIN, statistics.median(joins) * 1000)
                record(SETTLE_LEAVE, statistics.median(leaves) * 1000)
    return results


async def measure_raw(sizes: Sizes, runs: int) -> Results:
    """The raw limits of the store at :data:`DURABILITY`, with their CPU per row."""
    results: Results = {}
    record, timed = recorder(results)
    async with RawLimits(DURABILITY) as raw:
        for _ in range(runs):
            count = sizes.records
            await timed(RAW_ADD_32, count, raw.add_in_flight(count), raw.cpu_seconds)
            rate, seconds = await asyncio.to_thread(sqlite_commits, count, RAW_BATCH, DURABILITY)
            record(RAW_WRITE, rate)
            record(cpu_row(RAW_WRITE), seconds / count * 1e6)
            await timed(RAW_READ, count, raw.push_catch_up(count), raw.cpu_seconds)
    return results


def medians(results: Results) -> dict[str, float]:
    return {row: statistics.median(values) for row, values in results.items()}


def target_lines(figures: dict[str, float]) -> list[str]:
    """Each target with the ratio or figure reached (``-``: a row was not measured)."""
    lines = []
    for label, row, theirs, at_least in TARGETS:
        reached = figures.get(row, math.nan) / figures.get(theirs, math.nan)
        shown = "-" if math.isnan(reached) else f"{reached:.2f}x"
        verdict = "" if math.isnan(reached) else ": met" if reached >= at_least else ": NOT MET"
        lines.append(f"# target {label}: {shown}, at least {at_least:g}x{verdict}")
    for row, at_most in BOUNDS:
        value = figures.get(row, math.nan)
        shown = "-" if math.isnan(value) else f"{value:,.0f}"
        verdict = "" if math.isnan(value) else ": met" if value < at_most else ": NOT MET"
        lines.append(f"# target {row}: {shown}, below {at_most:,.0f}{verdict}")
    return lines


def report(figures: dict[str, float]) -> list[str]:
    """The rows, then the targets, and the produce rate beside the store's large commits."""
    width = max(len(row) for row in figures)
    lines = [f"{row:<{width}}  {value:>12,.1f}" for row, value in figures.items()]
    lines += ["", *target_lines(figures)]
    commits = figures.get(PRODUCE, math.nan) / figures.get(RAW_WRITE, math.nan)
    lines.append(f"# produce / {RAW_WRITE.rpartition(' (')[0]}: {commits:.2f}x (no target)")
    return lines


# -- profiles ----------------------------------------------------------------------------------


async def profile(count: int) -> None:
    """py-spy samples of the server while the producer, then the consumer, run."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        system, bootstrap = await start(Path(tmp))
        async with running(system):
            for name, work in (("kafka-produce", produce), ("kafka-fetch", fetch)):
                folded = OUT / f"{name}.folded"
                spy = await asyncio.create_subprocess_exec(
                    py_spy, "record", "--pid", str(system.process.pid), "--rate", "1000",
                    "--gil", "--format", "raw", "--output", str(folded), "--nonblocking",
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                await asyncio.sleep(1.0)  # py-spy attaches (not synchronisation of the server)
                before = system.cpu_seconds()
                rate = await asyncio.to_thread(work, bootstrap, count)
                cpu = (system.cpu_seconds() - before) / count * 1e6
                spy.send_signal(signal.SIGINT)
                await spy.wait()
                head = (
                    f"{name}: {count:,} records, {rate:,.0f} records/s,"
                    f" server CPU {cpu:.1f} µs/record (load {_load()})"
                )
                (OUT / f"{name}.txt").write_text("\n".join([head, "", *summary(folded)]) + "\n")
                print(head, flush=True)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--runs", type=int, help="runs of each workload (default 3; --quick: 1)")
    parser.add_argument("--profile", action="store_true", help="py-spy profiles instead")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.profile:
        asyncio.run(profile(sizes.records))
        return 0
    runs = args.runs or (1 if args.quick else 3)
    started = time.perf_counter()
    results = asyncio.run(measure_door(sizes, runs))
    results.update(asyncio.run(measure_raw(sizes, runs)))
    figures = medians(results)
    print(f"Kafka door beside FTN18 and the raw limits, durability {DURABILITY}:"
          f" {sizes.records:,} records, median of {runs} run(s),"
          f" {time.perf_counter() - started:.0f} s, load {_load()}")  # fmt: skip
    print("\n".join(report(figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
