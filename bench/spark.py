"""``python -m bench.spark [--events N] [--cores N]``: the Spark archive job's throughput
beside a plain Python consumer of the same server, and the memory each uses.

The server (a process of its own, discarding off) starts with ``--events`` events already
stored, with registered consumers that have read none of them. Then, one after the other:

- plain poll: a BlockingClient polls pages of 1000 events and acknowledges each (the floor:
  what one Python process gets from the server with no output at all);
- plain Parquet: the same, writing the events to Parquet files of 100,000 events each with
  pyarrow (the same output as the archive, without Spark);
- Spark: the archive job (``local[cores]``, Trigger.AvailableNow) into Parquet partitioned by
  date and type, timed from the query's start to its end, twice: as the first query of a new
  JVM (a ``--once`` job), then again as another consumer (a long-running job, JIT-compiled).
  The session start-up is reported on its own. Memory: the peak RSS of the driver JVM, of
  the Python workers Spark starts, and of this (driver) Python process.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.stream import utc_timestamp

from .systems import PASSWORD, USER, prepare_futoin_evt_db, print_figures

RESULTS = Path(__file__).resolve().parent / "results" / "spark.json"
SPARK_COMPONENTS = ("SPARK1", "SPARK2")


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


def spark_archive(url: str, cores: int, workdir: Path, expected: int) -> dict[str, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from spark_consumer.jobs import ArchiveJob, read_archive, start_archive

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
    elapsed: list[float] = []
    for component in SPARK_COMPONENTS:  # the first run in a fresh JVM, then a second one
        options = {"endpoint": url, "user": USER, "password": PASSWORD, "component": component}
        out = workdir / f"archive-{component}"
        job = ArchiveJob(options, str(out), str(workdir / f"checkpoint-{component}"), once=True)
        start = time.perf_counter()
        query = start_archive(spark, job)
        query.awaitTermination()
        elapsed.append(time.perf_counter() - start)
        archived = read_archive(spark, job.out).count()
        assert archived == expected, f"archived {archived} of {expected}"
    peaks.stop()
    driver_python = _rss_mb(os.getpid(), "VmHWM")
    spark.stop()
    return {
        "spark archive, first run in the JVM (events/s)": expected / elapsed[0],
        "  the same incl. session start (events/s)": expected / (elapsed[0] + session_seconds),
        "spark archive, second run (events/s)": expected / elapsed[1],
        "spark session start (s)": session_seconds,
        "peak RSS driver JVM (MB)": peaks.jvm,
        "peak RSS Python workers (MB)": peaks.python_workers,
        "peak RSS driver Python (MB)": driver_python,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args(argv)
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        workdir = Path(tmp)
        db = workdir / "events.sqlite"
        prepare_futoin_evt_db(db, args.events)
        with sqlite3.connect(db) as conn:  # consumers that have read nothing
            now = utc_timestamp()
            for component in ("PLAIN", "PARQUET", *SPARK_COMPONENTS):
                conn.execute(
                    "INSERT INTO consumers (user_id, component, position, registered_at,"
                    " last_seen_at) SELECT id, ?, 0, ?, ? FROM users WHERE name = ?",
                    (component, now, now, USER),
                )
        server, url = start_server(db)
        try:
            results["plain poll (events/s)"] = plain_consumer(url, "PLAIN", args.events, None)
            (workdir / "plain").mkdir()
            results["plain poll + Parquet (events/s)"] = plain_consumer(
                url, "PARQUET", args.events, workdir / "plain"
            )
            results.update(spark_archive(url, args.cores, workdir, args.events))
        finally:
            server.terminate()
            server.wait()
    print_figures(f"{args.events:,} events, Spark local[{args.cores}]", results)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"events": args.events, "cores": args.cores, **results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
