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
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from futoin_evt.client.aio import OPS
from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.stream import encode_event_data, utc_timestamp
from futoin_evt.storage.sqlite.native import add_event
from futoin_evt.storage.tables import Tables

from .support.servers import ServerProcess, free_port
from .support.waiting import Deadline, until_blocking

pytestmark = [pytest.mark.functional, pytest.mark.spark]

pyspark = pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from pyspark.sql import SparkSession  # noqa: E402

from spark_consumer.jobs import (  # noqa: E402
    ArchiveJob,
    aggregate,
    describe_range,
    read_archive,
    register_source,
    start_archive,
    write_aggregates,
)
from spark_consumer.source import dump_offset, load_offset, share_rows  # noqa: E402

USER, PASSWORD = "archivist", "archivist-pw"
#: What a wait on the server or on Spark allows.
WITHIN = 60.0
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
    subprocess.run(
        [sys.executable, "-m", "futoin_evt", "grant", USER, "read,write,manage", "*", "--db",
         str(db)],
        check=True, capture_output=True,
    )  # fmt: skip
    # no HTTP feed: the source needs only the WebSocket
    server = ServerProcess(db, 0, "--discard-interval", "0.2", "--no-feed")
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
        until_blocking(
            lambda: client.stream_info()["events"] == 0, "the archived events are discarded", WITHIN
        )

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


def archive_killed_after_batch_1(
    evt: ServerProcess, out: Path, checkpoint: Path, batch: str, *extra: str
) -> dict[str, int]:
    """Run the archive command with micro-batches of ``batch`` events; SIGKILL it once it has
    logged batch 1. The source's offsets of the last batch its checkpoint committed."""
    job = subprocess.Popen(
        [sys.executable, "-m", "spark_consumer", "archive", "--endpoint", evt.url,
         "--component", "ARCHIVE", "--out", str(out), "--checkpoint", str(checkpoint),
         "--master", "local[2]", "--once", "--max-events-per-batch", batch, *extra],
        env={**os.environ, **SPARK_ENV, "FUTOIN_EVT_USER": USER, "FUTOIN_EVT_PASSWORD": PASSWORD},
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    assert job.stderr is not None
    try:
        wait_for_line(job.stderr, r"batch 1, [1-9]\d* events")
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the driver JVM and its Python workers too
        job.communicate()
    committed = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    offsets: dict[str, int] = json.loads(
        (checkpoint / "offsets" / str(committed)).read_text().splitlines()[-1]
    )
    return offsets


def test_killed_job_resumes_exactly_once(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    ids = add_natively(evt.db, 60_000)
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    offsets = archive_killed_after_batch_1(evt, out, checkpoint, "3000")

    # The position never passes what the checkpoint has committed.
    assert position(evt, "ARCHIVE") <= offsets["id"] < ids[-1]

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
    deadline = Deadline(timeout)
    seen: list[str] = []
    for line in stream:
        seen.append(line)
        if re.search(pattern, line):
            return line
        if not deadline.left():
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


# -- a stream of several partitions ----------------------------------------------------------

STREAM = "orders"


def stream_command(db: str | Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "futoin_evt", "stream", *args, "--db", str(db)],
                   check=True, capture_output=True, text=True)  # fmt: skip


def add_to_partitions(db: str | Path, counts: list[int]) -> dict[int, list[int]]:
    """``counts[p]`` events on partition ``p`` of the stream, by an application writing to the
    database, in one transaction; their ids by partition."""
    ts = utc_timestamp()
    ids: dict[int, list[int]] = {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT number, key FROM partitions WHERE stream = ?", (STREAM,))
        keys = dict(rows.fetchall())
        for number, count in enumerate(counts):
            table = Tables.of(keys[number]).events
            ids[number] = []
            for i in range(count):
                data = encode_event_data("ORDER", {"p": number, "n": i})
                cursor = conn.execute(
                    f"INSERT INTO {table} (type, data, ts) VALUES (?, ?, ?)", ("ORDER", data, ts)
                )
                assert cursor.lastrowid is not None
                ids[number].append(cursor.lastrowid)
    return ids


def partition_url(server: ServerProcess, number: int) -> str:
    return f"{server.url.rstrip('/')}/{STREAM}/{number}"


def partition_position(server: ServerProcess, number: int, component: str) -> int:
    with BlockingClient(partition_url(server, number), credentials=f"{USER}:{PASSWORD}") as client:
        return client.consumer_state(component)[0]


def archived_by_partition(spark: SparkSession, out: Path) -> dict[int, list[int]]:
    """Each partition's archived ids, sorted (a repeat would show twice)."""
    rows = read_archive(spark, str(out)).select("stream", "partition", "id").collect()
    assert {row.stream for row in rows} == {STREAM}
    found: dict[int, list[int]] = {}
    for row in rows:
        found.setdefault(row.partition, []).append(row.id)
    return {p: sorted(ids) for p, ids in sorted(found.items())}


def test_offsets_and_the_rows_shared_by_partitions() -> None:
    assert load_offset({"id": 7}) == {None: 7}
    assert load_offset({"0": 3, "2": 9}) == {0: 3, 2: 9}
    assert dump_offset({None: 7}) == {"id": 7}
    assert dump_offset({2: 9, 0: 3}) == {"0": 3, "2": 9}
    # the partitions with less take all of it; the others share the rest evenly
    assert share_rows({0: 0, 1: 10, 2: 5}, {0: 100, 1: 12, 2: 105}, 60) == {0: 29, 1: 12, 2: 34}
    assert share_rows({0: 0, 1: 0}, {0: 10, 1: 10}, 1) == {0: 0, 1: 1}
    assert share_rows({None: 5}, {None: 50}, 1000) == {None: 50}
    assert describe_range('{"id":10}', '{"id":20}') == "ids 11..20"
    assert describe_range('{"0":0,"1":4}', '{"0":3,"1":4,"2":0}') == "partition 0 ids 1..3"


@pytest.mark.timeout(600)  # two Spark drivers, one after the other, on a loaded machine
def test_a_stream_of_four_partitions_is_archived_once_per_partition_across_a_kill(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    stream_command(evt.db, "add", STREAM, "--partitions", "4")
    until_blocking(lambda: _serves(evt, 3), "the server serves the stream", WITHIN)
    ids = add_to_partitions(evt.db, [12_000, 8_000, 3_000, 1])
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    offsets = archive_killed_after_batch_1(evt, out, checkpoint, "2000", "--stream", STREAM)

    # On every partition, the position never passes what the checkpoint has committed.
    assert set(offsets) == {"0", "1", "2", "3"}
    for number in range(4):
        assert partition_position(evt, number, "ARCHIVE") <= offsets[str(number)]
    assert offsets["0"] < ids[0][-1]

    options_ = {**options(evt, "ARCHIVE"), "stream": STREAM}
    archive_once(spark, ArchiveJob(options_, str(out), str(checkpoint), once=True))
    assert archived_by_partition(spark, out) == ids
    for number in range(4):
        assert partition_position(evt, number, "ARCHIVE") == ids[number][-1]
    sample = read_archive(spark, str(out)).where("partition = 2 AND id = 5").collect()[0]
    assert json.loads(sample.data) == {"p": 2, "n": 4}


def _serves(server: ServerProcess, number: int) -> bool:
    """Whether the server already serves partition ``number`` of the stream (it follows the
    registry by polling): its ``listStreams`` shows that many partitions."""
    with BlockingClient(server.url, credentials=f"{USER}:{PASSWORD}") as client:
        streams = client.call(OPS, "listStreams", {})
    return any(s["name"] == STREAM and s["partitions"] > number for s in streams)


def test_streaming_a_stream_follows_its_growth(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    stream_command(evt.db, "add", STREAM, "--partitions", "2")
    until_blocking(lambda: _serves(evt, 1), "the server serves the stream", WITHIN)
    out = tmp_path / "archive"
    job = ArchiveJob({**options(evt, "STREAM"), "stream": STREAM}, str(out), str(tmp_path / "cp"),
                     interval="200 milliseconds")  # fmt: skip
    query = start_archive(spark, job)
    added: dict[int, list[int]] = {}
    try:
        for wave in range(2):
            for number in (0, 1):
                with BlockingClient(partition_url(evt, number),
                                    credentials=f"{USER}:{PASSWORD}") as client:  # fmt: skip
                    added.setdefault(number, []).extend(
                        client.add_event("ORDER", {"wave": wave}) for _ in range(50 * (number + 1))
                    )
            query.processAllAvailable()
            assert archived_by_partition(spark, out) == added
        stream_command(evt.db, "grow", STREAM, "--partitions", "3")
        until_blocking(lambda: _serves(evt, 2), "the server serves the new partition", WITHIN)
        with BlockingClient(partition_url(evt, 2), credentials=f"{USER}:{PASSWORD}") as client:
            added[2] = [client.add_event("ORDER", {"new": i}) for i in range(30)]
        query.processAllAvailable()  # the partition joins, then its events are read
        query.processAllAvailable()
        assert archived_by_partition(spark, out) == added
        assert query.isActive
    finally:
        query.stop()


def test_a_batch_read_of_a_stream_and_its_errors(spark: SparkSession, evt: ServerProcess) -> None:
    stream_command(evt.db, "add", STREAM, "--partitions", "3")
    until_blocking(lambda: _serves(evt, 2), "the server serves the stream", WITHIN)
    ids = add_to_partitions(evt.db, [5, 0, 7])
    frame = spark.read.format("futoin-evt").options(**options(evt, "BATCH"), stream=STREAM).load()
    assert frame.columns == ["id", "type", "data", "ts", "date", "stream", "partition"]
    rows = frame.orderBy("partition", "id").collect()
    assert [(r.partition, r.id) for r in rows] == [(p, i) for p in (0, 2) for i in ids[p]]
    for stream, message in [("nosuch", "has no stream nosuch"), ("Bad!", "invalid stream name")]:
        with pytest.raises(Exception, match=message):
            spark.read.format("futoin-evt").options(
                **options(evt, "BATCH"), stream=stream).load().count()  # fmt: skip
    with pytest.raises(Exception, match="leave them out with 'stream'"):
        spark.read.format("futoin-evt").options(
            **options(evt, "BATCH"), stream=STREAM, afterId="3").load().count()  # fmt: skip


ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "integer"},
        "total": {"type": "number"},
        "lines": {"type": "array", "items": {"type": "object",
                                             "properties": {"sku": {"type": "string"}}}},
        "meta": {"oneOf": [{"type": "string"}, {"type": "object"}]},
    },
    "required": ["order"],
}  # fmt: skip


def test_event_type_reads_data_as_typed_columns_from_the_registry(
    spark: SparkSession, evt: ServerProcess, tmp_path: Path
) -> None:
    with sqlite3.connect(evt.db) as conn:  # stored before the schema: it does not fit
        early = add_event(conn, "ORDER", {"order": "first"})
    registry = evt.url.replace("ws://", "http://").rstrip("/") + "/schemas"
    registered = httpx.post(
        f"{registry}/subjects/events-ORDER/versions",
        json={"schemaType": "JSON", "schema": json.dumps(ORDER_SCHEMA)},
        auth=(USER, PASSWORD),
    )
    assert registered.status_code == 200, registered.text
    with sqlite3.connect(evt.db) as conn:
        ids = [
            add_event(conn, "ORDER", {"order": 7, "total": 9.5, "lines": [{"sku": "ü"}],
                                      "meta": {"a": 1}, "extra": True}),
            add_event(conn, "PAYMENT", {"order": 7}),
            add_event(conn, "ORDER", {"order": 8, "meta": "m"}),
        ]  # fmt: skip

    frame = (
        spark.read.format("futoin-evt").options(**options(evt, "TYPED"), eventType="ORDER").load()
    )
    assert frame.schema["data"].dataType.simpleString() == (
        "struct<order:bigint,total:double,lines:array<struct<sku:string>>,meta:string>"
    )
    rows = frame.orderBy("id").select("id", "data.order", "data.total", "data.lines",
                                      "data.meta", "data").collect()  # fmt: skip
    assert [(r.id, r.order, r.total, r.meta) for r in rows] == [
        (early, None, None, None),
        (ids[0], 7, 9.5, '{"a":1}'),
        (ids[2], 8, None, "m"),  # a string as it is, other values as their JSON text
    ]
    assert rows[0].data is None  # its required order is not an integer
    assert rows[1].lines[0].sku == "ü"

    with pytest.raises(Exception, match="the schema registry has no subject events-REFUND"):
        spark.read.format("futoin-evt").options(**options(evt, "TYPED"),
                                                 eventType="REFUND").load()  # fmt: skip

    refused = subprocess.run(
        [sys.executable, "-m", "spark_consumer", "archive", "--endpoint", evt.url,
         "--event-type", "REFUND", "--out", str(tmp_path / "no"), "--checkpoint",
         str(tmp_path / "no-cp"), "--once"],
        env={**os.environ, "FUTOIN_EVT_USER": USER, "FUTOIN_EVT_PASSWORD": PASSWORD},
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "the schema registry has no subject events-REFUND" in refused.stderr
    assert not (tmp_path / "no").exists()  # before Spark starts

    # the archive of one type: typed Parquet
    out = tmp_path / "archive"
    archive_once(spark, ArchiveJob(options(evt, "ARCHIVE", eventType="ORDER"), str(out),
                                   str(tmp_path / "cp"), once=True))  # fmt: skip
    archived = read_archive(spark, str(out))
    assert sorted(
        r.order for r in archived.where("data IS NOT NULL").select("data.order").collect()
    ) == [7, 8]
    assert {p.name for p in out.glob("date=*/type=*")} == {"type=ORDER"}
    assert position(evt, "ARCHIVE") == ids[-1]
