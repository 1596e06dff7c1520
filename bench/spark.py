"""``python -m bench.spark [--events N] [--cores N] [--runs N] [--source DIR]``: the Spark
source's and the archive job's throughput, beside a plain Python consumer of the same server
and beside Spark's own JSON reader of the same events, and the memory they use.

The server (a process of its own, discarding off) starts with ``--events`` events already
stored (about 100 bytes of JSON data each), with registered consumers that have read none of
them; the same events are written to a JSON-lines file, each line the FTN18 event as the server
sends it (``id`` a string, ``data`` its JSON value, ``ts``). Then, one after the other:

- plain poll: a BlockingClient polls pages of 1000 events and acknowledges each (the floor:
  what one Python process gets from the server with no output at all);
- plain Parquet: the same, writing the events to Parquet files of 100,000 events each with
  pyarrow (the same output as the archive, without Spark);
- Spark (``local[cores]``), in one session whose start-up is reported on its own: the archive
  job as the first query of the new JVM (a ``--once`` job), then ``--runs`` (3) times each of
  these (JIT-compiled, as in a long-running job; the medians are reported):
  - archive: the archive job (Trigger.AvailableNow) into Parquet partitioned by date and type,
    as a consumer of its own, from the query's start to its end;
  - JSON to Parquet: ``spark.read.json`` (the schema given, below) written as the archive is,
    partitioned by date and type;
  - batch: ``spark.read.format("futoin-evt")`` of every event, beside ``spark.read.json`` of
    the file with the source's columns and types (the schema given: ``id`` cast to a long,
    ``data`` kept as JSON text, ``date`` from ``ts``) and as it comes (the schema inferred,
    ``data`` a struct); each materialised whole by counting every column's values;
  - streaming: the source as a reliable consumer of its own, as the archive job reads it, into
    the noop sink with Trigger.AvailableNow; its position must reach the newest event.

The targets: the source's batch read at least as fast as ``spark.read.json`` (1x), the archive
at least 0.8x of JSON to Parquet. Memory: the peak RSS of the driver JVM and of the Python
workers Spark starts during the Spark workloads, and of this (driver) Python process.
``--source DIR`` imports ``spark_consumer`` from DIR (in the driver and the Spark workers),
the server and the rest from this tree: a before/after of the source alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from futoin_evt.client.sync import BlockingClient

from .systems import PASSWORD, USER, prepare_futoin_evt_db

RESULTS = Path(__file__).resolve().parent / "results" / "spark.json"


def start_server(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "futoin_evt", "--log-level", "warning", "serve", "--db", str(db),
         "--port", "0", "--discard-interval", "86400"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url = next(w for w in proc.stdout.readline().split() if w.startswith("ws://"))
    return proc, url


def plain_consumer(url: str, component: str, expected: int, parquet_dir: Path | None) -> float:
    """Events/s of a poll loop, optionally writing Parquet files of 100,000 events."""
    with BlockingClient(url, credentials=f"{USER}:{PASSWORD}") as client:
        client.register_consumer(component)
        rows: list[Any] = []
        files = 0
        received = 0
        last_id: int | None = None
        start = time.perf_counter()
        while received < expected:
            events = client.poll_events(component, last_id)
            if not events:
                break
            received += len(events)
            last_id = events[-1].id
            if parquet_dir is not None:
                rows.extend(events)
                if len(rows) >= 100_000 or received >= expected:
                    table = pa.table({
                        "id": [e.id for e in rows],
                        "type": [e.type for e in rows],
                        "data": [json.dumps(e.data, separators=(",", ":")) for e in rows],
                        "ts": [e.ts for e in rows],
                    })  # fmt: skip
                    pq.write_table(table, parquet_dir / f"part-{files:05d}.parquet")
                    files += 1
                    rows = []
        client.poll_events(component, last_id)  # acknowledge the last page
        elapsed = time.perf_counter() - start
    assert received == expected, f"received {received} of {expected}"
    return expected / elapsed


class PeakRss:
    """Samples the RSS of a process tree every 50 ms; keeps the peaks (MB)."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.jvm = 0.0
        self.python_workers = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            jvm, workers = 0.0, 0.0
            for pid, name, rss in _tree(self.root_pid):
                if name.startswith("python"):
                    workers += rss
                elif pid == self.root_pid or name == "java":
                    jvm += rss
            self.jvm = max(self.jvm, jvm)
            self.python_workers = max(self.python_workers, workers)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _tree(root: int) -> list[tuple[int, str, float]]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out = []
    for pid in parents:
        p = pid
        while p not in (0, 1, root) and p in parents:
            p = parents[p]
        if p == root:
            out.append((pid, _name(pid), _rss_mb(pid)))
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def write_jsonl(db: Path, path: Path) -> None:
    """The stored events as FTN18 events, one a line: ``data`` is stored as JSON text."""
    with sqlite3.connect(db) as conn, path.open("w") as out:
        rows = conn.execute("SELECT id, type, data, ts FROM events ORDER BY id")
        for event_id, event_type, data, ts in rows:
            out.write(f'{{"id":"{event_id}","type":{json.dumps(event_type)},"data":{data},')
            out.write(f'"ts":"{ts}"}}\n')


def register_consumers(url: str, path: Path, components: list[str]) -> None:
    """Register every consumer (none has read anything); check that the file's first lines
    are what the server sends for those events."""
    with BlockingClient(url, credentials=f"{USER}:{PASSWORD}") as client:
        for component in components:
            client.register_consumer(component)
        page = client.read_events(components[0], 0)
    with path.open() as lines:
        written = [json.loads(line) for line, _ in zip(lines, page, strict=False)]
    assert written == page, "the JSON-lines file differs from the server's events"


def source_options(url: str, component: str) -> dict[str, str]:
    return {"endpoint": url, "user": USER, "password": PASSWORD, "component": component}


def consumers(runs: int) -> list[str]:
    """The components: each archive run and each streaming run reads as a consumer of its
    own (the batch reads acknowledge nothing)."""
    archives = [f"SPARK{run}" for run in range(runs + 1)]
    return ["PLAIN", "PARQUET", "BATCH", *archives, *(f"NOOP{run}" for run in range(runs))]


def spark_workloads(
    url: str, cores: int, workdir: Path, jsonl: Path, expected: int, runs: int
) -> dict[str, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from spark_consumer.jobs import ARCHIVE_PARTITIONS, ArchiveJob, register_source, start_archive
    from spark_consumer.source import FORMAT

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("futoin-evt bench")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    session_seconds = time.perf_counter() - started
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    peaks = PeakRss(jvm_pid)
    register_source(spark)

    def rate(action: Callable[[], object]) -> float:
        start = time.perf_counter()
        action()
        return expected / (time.perf_counter() - start)

    def count_all(frame: DataFrame) -> None:
        """Count every column's values: each is read and parsed, none may be null."""
        counts = frame.agg(*[F.count(c) for c in frame.columns]).first()
        assert counts is not None
        assert set(counts) == {expected}, f"counted {counts}"

    written: list[str] = []  # Parquet directories, each checked once the timing is done

    def archive(run: int) -> None:
        component = f"SPARK{run}"
        job = ArchiveJob(
            source_options(url, component),
            str(workdir / f"archive-{component}"),
            str(workdir / f"checkpoint-{component}"),
            once=True,
        )
        start_archive(spark, job).awaitTermination()
        written.append(job.out)

    ftn18 = StructType([
        StructField("id", StringType()),
        StructField("type", StringType()),
        StructField("data", StringType()),  # an object read as a string: its JSON text
        StructField("ts", TimestampType()),
    ])  # fmt: skip

    def json_as_source() -> DataFrame:
        """The file read with the source's columns and types."""
        events = spark.read.schema(ftn18).json(str(jsonl))
        return events.select(
            F.col("id").cast("long").alias("id"),
            "type",
            "data",
            "ts",
            F.to_date("ts").alias("date"),
        )

    def json_to_parquet(run: int) -> None:
        out = str(workdir / f"json-parquet-{run}")
        json_as_source().write.partitionBy(*ARCHIVE_PARTITIONS).parquet(out)
        written.append(out)

    def stream_to_noop(run: int) -> None:
        component = f"NOOP{run}"
        events = spark.readStream.format(FORMAT).options(**source_options(url, component))
        query = (
            events.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(workdir / f"checkpoint-{component}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        with BlockingClient(url, credentials=f"{USER}:{PASSWORD}") as client:
            position, head_id = client.consumer_state(component)
        assert position == head_id, f"{component} acknowledged {position} of {head_id}"

    batch = spark.read.format(FORMAT).options(**source_options(url, "BATCH")).load()
    workloads: dict[str, Callable[[int], None]] = {
        "spark archive, second run (events/s)": archive,
        "spark.read.json -> Parquet, as the archive (events/s)": json_to_parquet,
        "source, batch read (events/s)": lambda _: count_all(batch),
        "spark.read.json, the source's schema (events/s)": lambda _: count_all(json_as_source()),
        "spark.read.json, schema inferred (events/s)": lambda _: count_all(
            spark.read.json(str(jsonl))
        ),
        "source, streaming to noop, acknowledged (events/s)": stream_to_noop,
    }
    first_archive = rate(lambda: archive(0))  # the first query of a new JVM, as a --once job
    figures: dict[str, list[float]] = {name: [] for name in workloads}
    for run in range(1, runs + 1):  # then JIT-compiled, as a long-running job's
        for name, workload in workloads.items():
            figures[name].append(rate(lambda: workload(run)))  # noqa: B023 - called at once
    peaks.stop()
    for out in written:
        stored = spark.read.parquet(out).count()
        assert stored == expected, f"{out} holds {stored} of {expected} events"
    driver_python = _rss_mb(os.getpid(), "VmHWM")
    spark.stop()
    return {
        "spark archive, first run in the JVM (events/s)": first_archive,
        "  the same incl. session start (events/s)": expected
        / (expected / first_archive + session_seconds),
        **{name: statistics.median(values) for name, values in figures.items()},
        "spark session start (s)": session_seconds,
        "peak RSS driver JVM (MB)": peaks.jvm,
        "peak RSS Python workers (MB)": peaks.python_workers,
        "peak RSS driver Python (MB)": driver_python,
    }


#: (ratio, numerator, denominator, target)
TARGETS = (
    ("source batch / read.json (source's schema)", "source, batch read (events/s)",
     "spark.read.json, the source's schema (events/s)", 1.0),
    ("source batch / read.json (schema inferred)", "source, batch read (events/s)",
     "spark.read.json, schema inferred (events/s)", 1.0),
    ("archive (second run) / read.json -> Parquet", "spark archive, second run (events/s)",
     "spark.read.json -> Parquet, as the archive (events/s)", 0.8),
    ("archive (first run) / read.json -> Parquet", "spark archive, first run in the JVM (events/s)",
     "spark.read.json -> Parquet, as the archive (events/s)", 0.8),
)  # fmt: skip


def ratios(results: dict[str, float]) -> dict[str, float]:
    return {name: results[num] / results[den] for name, num, den, _ in TARGETS}


def print_table(title: str, results: dict[str, float], got: dict[str, float]) -> None:
    width = max(len(k) for k in [*results, *got])
    print(title)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:>12,.1f}")
    for name, _, _, target in TARGETS:
        verdict = "met" if got[name] >= target else "NOT met"
        print(f"{name:<{width}}  {got[name]:>11.2f}x  target >= {target}x: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="runs of each warm Spark workload")
    parser.add_argument("--source", type=Path, help="import spark_consumer from this tree")
    args = parser.parse_args(argv)
    if args.source is not None:
        tree = str(args.source.resolve())
        sys.path.insert(0, tree)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [tree, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        workdir = Path(tmp)
        db = workdir / "events.sqlite"
        prepare_futoin_evt_db(db, args.events)
        jsonl = workdir / "events.jsonl"
        write_jsonl(db, jsonl)
        server, url = start_server(db)
        try:
            register_consumers(url, jsonl, consumers(args.runs))
            results["plain poll (events/s)"] = plain_consumer(url, "PLAIN", args.events, None)
            (workdir / "plain").mkdir()
            results["plain poll + Parquet (events/s)"] = plain_consumer(
                url, "PARQUET", args.events, workdir / "plain"
            )
            results.update(spark_workloads(url, args.cores, workdir, jsonl, args.events, args.runs))
        finally:
            server.terminate()
            server.wait()
    got = ratios(results)
    source = f", spark_consumer of {args.source}" if args.source else ""
    runs = f", medians of {args.runs} runs" if args.runs > 1 else ""
    title = f"{args.events:,} events, Spark local[{args.cores}]{runs}{source}"
    print_table(title, results, got)
    print(f"load average {Path('/proc/loadavg').read_text().strip()}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"events": args.events, "cores": args.cores, "runs": args.runs, **results, **got}
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
