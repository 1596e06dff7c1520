"""The Spark consumer against a real server process: one shared local Spark session, plus a
job killed with SIGKILL and a standalone cluster started from the pip-installed pyspark."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from futoin_evt.client.aio import OPS
from futoin_evt.client.sync import BlockingClient
from futoin_evt.storage.native import add_event

from .conftest import ServerProcess, free_port

pytestmark = [pytest.mark.functional, pytest.mark.spark]

pyspark = pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from pyspark.sql import SparkSession  # noqa: E402

from spark_consumer.jobs import (  # noqa: E402
    ArchiveJob,
    aggregate,
    read_archive,
    register_source,
    start_archive,
    write_aggregates,
)

USER, PASSWORD = "archivist", "archivist-pw"
SPARK_ENV = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.update(SPARK_ENV)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("futoin-evt tests")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register_source(session)
    yield session
    session.stop()


@pytest.fixture
def evt(tmp_path: Path) -> Iterator[ServerProcess]:
    db = tmp_path / "events.sqlite"
    subprocess.run(
        [sys.executable, "-m", "futoin_evt", "user", "add", USER, "--db", str(db),
         "--password-stdin"],
        input=PASSWORD, text=True, check=True, capture_output=True,
    )  # fmt: skip
    server = ServerProcess(db, 0, "--discard-interval", "0.2")
    yield server
    server.stop()


def add_natively(
    db: str | Path, count: int, types: tuple[str, ...] = ("ORDER", "PAYMENT", "REFUND")
) -> list[int]:
    """Add events in one transaction of the application's own (FTN18's native extension)."""
    with sqlite3.connect(db) as conn:
        return [add_event(conn, types[i % len(types)], {"n": i, "who": "ü"}) for i in range(count)]


def options(server: ServerProcess, component: str, **extra: str) -> dict[str, str]:
    return {"endpoint": server.url, "user": USER, "password": PASSWORD, "component": component,
            **extra}  # fmt: skip


def archive_once(spark: SparkSession, job: ArchiveJob) -> None:
    query = start_archive(spark, job)
    query.awaitTermination()
    assert query.exception() is None


def archived_ids(spark: SparkSession, out: Path) -> list[int]:
    return sorted(row.id for row in read_archive(spark, str(out)).select("id").collect())


def position(server: ServerProcess, component: str) -> int:
    with BlockingClient(server.url, credentials=f"{USER}:{PASSWORD}") as client:
        return client.consumer_state(component)[0]


def wait_until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


def test_archive_writes_every_event_once_and_lets_the_server_discard(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    ids = add_natively(evt.db, 200_000)
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    job = ArchiveJob(options(evt, "ARCHIVE", maxEventsPerBatch="50000"), str(out),
                     str(checkpoint), once=True)  # fmt: skip
    archive_once(spark, job)

    archive = read_archive(spark, str(out))
    assert archived_ids(spark, out) == ids
    sample = archive.where(archive.id == ids[4]).collect()[0]
    assert (sample.type, json.loads(sample.data)) == ("PAYMENT", {"n": 4, "who": "ü"})
    assert sample.date == sample.ts.date()
    # partitioned by date and type
    partitions = {p.relative_to(out).as_posix() for p in out.glob("date=*/type=*")}
    assert partitions == {f"date={sample.date}/type={t}" for t in ("ORDER", "PAYMENT", "REFUND")}
    # acknowledged up to the last id, so the server discards what is archived
    assert position(evt, "ARCHIVE") == ids[-1]
    with BlockingClient(evt.url, credentials=f"{USER}:{PASSWORD}") as client:
        wait_until(lambda: client.stream_info()["events"] == 0, "the archived events are discarded")

    # A crash between the checkpoint's commit and the acknowledgement (here: the position
    # moved back by an operator's seek): the next run, with nothing new to read,
    # acknowledges what the checkpoint says is done, and writes nothing.
    with BlockingClient(evt.url, credentials=f"{USER}:{PASSWORD}") as client:
        client.call(OPS, "seekConsumer", {"component": "ARCHIVE", "ts": "2000-01-01T00:00:00Z"})
        assert client.consumer_state("ARCHIVE")[0] == 0
    archive_once(spark, job)
    assert archived_ids(spark, out) == ids
    assert position(evt, "ARCHIVE") == ids[-1]

    report = write_aggregates(aggregate(spark, str(out)), str(tmp_path / "aggregates"))
    assert [(r.type, r.events, r.first_id, r.last_id) for r in report] == [
        ("ORDER", 66_667, ids[0], ids[-2]),
        ("PAYMENT", 66_667, ids[1], ids[-1]),
        ("REFUND", 66_666, ids[2], ids[-3]),
    ]
    per_minute = spark.read.parquet(str(tmp_path / "aggregates" / "per_minute"))
    assert per_minute.groupBy().sum("events").collect()[0][0] == 200_000


def test_a_batch_that_fails_after_writing_its_files_is_replayed_once(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    """Batch 1 fails after writing its files, before the sink logs them as part of the archive:
    a directory where the sink's log entry for batch 1 goes makes that write fail."""
    ids = add_natively(evt.db, 30_000)
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    blocked = out / "_spark_metadata" / "1"
    blocked.mkdir(parents=True)
    job = ArchiveJob(options(evt, "ARCHIVE", maxEventsPerBatch="10000"), str(out),
                     str(checkpoint), once=True)  # fmt: skip
    query = start_archive(spark, job)
    with pytest.raises(Exception, match="STREAM_FAILED"):
        query.awaitTermination()
    written = set(out.glob("date=*/type=*/*.parquet"))
    assert written  # batch 0's and batch 1's files
    assert position(evt, "ARCHIVE") == ids[9_999]  # batch 0 only

    blocked.rmdir()
    archive_once(spark, job)
    assert archived_ids(spark, out) == ids  # batch 1's first files are not part of it
    assert set(out.glob("date=*/type=*/*.parquet")) > written
    assert position(evt, "ARCHIVE") == ids[-1]


def test_killed_job_resumes_exactly_once(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    ids = add_natively(evt.db, 60_000)
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    job = subprocess.Popen(
        [sys.executable, "-m", "spark_consumer", "archive", "--endpoint", evt.url,
         "--component", "ARCHIVE", "--out", str(out), "--checkpoint", str(checkpoint),
         "--master", "local[2]", "--once", "--max-events-per-batch", "3000"],
        env={**os.environ, **SPARK_ENV, "FUTOIN_EVT_USER": USER, "FUTOIN_EVT_PASSWORD": PASSWORD},
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    assert job.stderr is not None
    try:
        wait_for_line(job.stderr, r"batch 1, \d+ events")
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the driver JVM and its Python workers too
        job.communicate()

    # The position never passes what the checkpoint has committed.
    committed = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    offsets = (checkpoint / "offsets" / str(committed)).read_text().splitlines()
    assert position(evt, "ARCHIVE") <= json.loads(offsets[-1])["id"] < ids[-1]

    archive_once(spark, ArchiveJob(options(evt, "ARCHIVE"), str(out), str(checkpoint), once=True))
    assert archived_ids(spark, out) == ids
    assert position(evt, "ARCHIVE") == ids[-1]


def test_streaming_picks_up_events_added_while_it_runs(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "archive"
    job = ArchiveJob(options(evt, "STREAM", want="ORDER"), str(out), str(tmp_path / "cp"),
                     interval="200 milliseconds")  # fmt: skip
    with BlockingClient(evt.url, credentials=f"{USER}:{PASSWORD}") as client:
        client.register_consumer("STREAM")
        query = start_archive(spark, job)
        try:
            added: list[int] = []
            for wave in range(3):
                for i in range(300):
                    event_id = client.add_event("ORDER" if i % 2 else "OTHER", {"wave": wave})
                    if i % 2:
                        added.append(event_id)
                query.processAllAvailable()
                assert archived_ids(spark, out) == added
            assert query.isActive
        finally:
            query.stop()
        # acknowledged as far as the last batch Spark committed and then planned past
        assert client.consumer_state("STREAM")[0] >= added[-301]


def test_options_are_checked_and_the_password_stays_out_of_plans(
    spark: SparkSession, evt: ServerProcess
) -> None:
    frame = spark.read.format("futoin-evt").options(**options(evt, "PLAN")).load()
    assert frame.count() == 0
    plan = frame._jdf.queryExecution().toString()
    assert PASSWORD not in plan
    with pytest.raises(Exception, match="needs the option 'component'"):
        spark.read.format("futoin-evt").options(endpoint=evt.url, user=USER,
                                                 password=PASSWORD).load().count()  # fmt: skip
    with pytest.raises(Exception, match="SecurityError"):
        spark.read.format("futoin-evt").options(**{**options(evt, "PLAN"),
                                                   "password": "wrong"}).load().count()  # fmt: skip


def wait_for_line(stream: IO[str], pattern: str, timeout: float = 240.0) -> str:
    """Read a process's output until a line matches (no sleeping)."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    for line in stream:
        seen.append(line)
        if re.search(pattern, line):
            return line
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen[-30:])}")


class Cluster:
    """A standalone Spark master and one worker on loopback, from the pip-installed pyspark."""

    def __init__(self, work: Path) -> None:
        self.port = free_port()
        env = {**os.environ, **SPARK_ENV, "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work)}
        spark_class = Path(sys.executable).parent / "spark-class"
        self.processes: list[subprocess.Popen[str]] = []
        master = self._start(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(free_port())], env)  # fmt: skip
        wait_for_line(master.stderr, r"I have been elected leader")  # type: ignore[arg-type]
        self.url = f"spark://127.0.0.1:{self.port}"
        worker = self._start(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", self.url, "--host",
             "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
             "--work-dir", str(work)], env)  # fmt: skip
        wait_for_line(worker.stderr, r"Successfully registered with master")  # type: ignore[arg-type]

    def _start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                text=True, start_new_session=True)  # fmt: skip
        self.processes.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.processes):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=60)


def test_spark_submit_to_a_standalone_cluster_archives_the_same(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    ids = add_natively(evt.db, 20_000)
    with BlockingClient(evt.url, credentials=f"{USER}:{PASSWORD}") as client:
        client.register_consumer("CLUSTER")  # holds the events back until it has them too
    local_out = tmp_path / "local"
    archive_once(spark, ArchiveJob(options(evt, "LOCAL"), str(local_out), str(tmp_path / "cp1"),
                                   once=True))  # fmt: skip
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "spark_consumer", "package", "--out", str(dist)],
                   check=True, capture_output=True)  # fmt: skip
    shipped = zipfile.ZipFile(dist / "futoin-evt-spark.zip").namelist()
    assert {"spark_consumer/source.py", "futoin_evt/ifaces/futoin.evt.types-1.0-iface.json"} <= set(
        shipped
    )
    cluster = Cluster(tmp_path / "cluster")
    cluster_out = tmp_path / "cluster-archive"
    try:
        submit = subprocess.run(
            [str(Path(sys.executable).parent / "spark-submit"), "--master", cluster.url,
             "--py-files", str(dist / "futoin-evt-spark.zip"),
             str(dist / "futoin_evt_spark_main.py"),
             "archive", "--endpoint", evt.url, "--component", "CLUSTER", "--out", str(cluster_out),
             "--checkpoint", str(tmp_path / "cp2"), "--once", "--events-per-partition", "5000"],
            env={**os.environ, **SPARK_ENV, "FUTOIN_EVT_USER": USER,
                 "FUTOIN_EVT_PASSWORD": PASSWORD},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        cluster.stop()
    assert submit.returncode == 0, submit.stderr[-3000:]
    assert list((tmp_path / "cluster").glob("app-*/*/stderr")), "no executor ran on the worker"
    columns = ["id", "type", "data", "ts", "date"]
    local_rows = read_archive(spark, str(local_out)).select(*columns).orderBy("id").collect()
    cluster_rows = read_archive(spark, str(cluster_out)).select(*columns).orderBy("id").collect()
    assert [r.id for r in cluster_rows] == ids
    assert cluster_rows == local_rows
    assert position(evt, "CLUSTER") == ids[-1]


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--endpoint", "ws://127.0.0.1:1/"], {"FUTOIN_EVT_USER": USER,
          "FUTOIN_EVT_PASSWORD": PASSWORD}, "cannot connect to ws://127.0.0.1:1/"),
        ([], {"FUTOIN_EVT_USER": USER}, "no password given"),
        ([], {"FUTOIN_EVT_PASSWORD": PASSWORD}, "no user given"),
        ([], {"FUTOIN_EVT_USER": USER, "FUTOIN_EVT_PASSWORD": "wrong"}, "SecurityError"),
        (["--component", "LIVE"], {"FUTOIN_EVT_USER": USER, "FUTOIN_EVT_PASSWORD": PASSWORD},
         "LiveNotAllowed"),
    ],
)  # fmt: skip
def test_archive_command_fails_early_with_one_sentence(
    evt: ServerProcess, tmp_path: Path, argv: list[str], env: dict[str, str], message: str
) -> None:
    """Bad settings are reported before Spark starts, on one line, with a non-zero exit."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FUTOIN_EVT_")}
    result = subprocess.run(
        [sys.executable, "-m", "spark_consumer", "archive", "--endpoint", evt.url,
         "--out", str(tmp_path / "a"), "--checkpoint", str(tmp_path / "c"), *argv],
        env={**base, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("futoin-evt-spark: ")
    assert message in line
    assert PASSWORD not in result.stderr
