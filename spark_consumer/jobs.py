"""The Spark jobs: archive the stream to Parquet, and aggregate the archive.

The archive is Spark's Parquet file sink, partitioned by event date and type. The sink writes
a batch's files, then records them in ``OUT/_spark_metadata``; files of a batch that failed
before that are never read (``spark.read.parquet(OUT)`` goes by the metadata log), and a batch
the sink has recorded is not written again when it is replayed. With the source's
acknowledgement after the checkpoint commit, every event lands in the archive exactly once
across restarts and failures, and the server discards only archived events.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery

from .source import FORMAT, FutoinEvtDataSource, Positions, load_offset

logger = logging.getLogger("spark_consumer")

#: The archive's directories. With a stream, each row also has its stream and partition.
ARCHIVE_PARTITIONS: Final = ("date", "type")


@dataclass(frozen=True)
class ArchiveJob:
    source_options: dict[str, str]
    out: str
    checkpoint: str
    #: Trigger.AvailableNow: archive what is there now, then stop.
    once: bool = False
    #: The processing-time trigger's interval when not ``once``.
    interval: str = "10 seconds"

    @property
    def query_name(self) -> str:
        stream = self.source_options.get("stream")
        of = f" {stream}" if stream else ""
        return f"futoin-evt archive{of} {self.source_options['component']}"


def register_source(spark: SparkSession) -> None:
    spark.dataSource.register(FutoinEvtDataSource)


def start_archive(spark: SparkSession, job: ArchiveJob) -> StreamingQuery:
    register_source(spark)
    events = spark.readStream.format(FORMAT).options(**job.source_options).load()
    writer = (
        events.writeStream.format("parquet")
        .option("path", job.out)
        .option("checkpointLocation", job.checkpoint)
        .partitionBy(*ARCHIVE_PARTITIONS)
        .queryName(job.query_name)
    )
    if job.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=job.interval)
    return writer.start()


def read_archive(spark: SparkSession, archive: str) -> DataFrame:
    return spark.read.parquet(archive)


class ProgressLog(StreamingQueryListener):
    """Logs each micro-batch: events, the id range, and the rate."""

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        logger.info("query %r started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        for source in progress.sources:
            logger.log(
                logging.INFO if source.numInputRows else logging.DEBUG,
                "%s: batch %d, %d events, %s, %.0f events/s",
                progress.name,
                progress.batchId,
                source.numInputRows,
                describe_range(source.startOffset, source.endOffset),
                source.processedRowsPerSecond,
            )

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        if event.exception:
            logger.error("query %s failed: %s", event.id, event.exception)
        else:
            logger.info("query %s stopped", event.id)


def flush_listeners(spark: SparkSession) -> None:
    """Wait until listeners have seen every event so far: they are called asynchronously, and
    a query's last progress arrives after ``awaitTermination`` returns."""
    jsc: Any = spark.sparkContext._jsc
    jsc.sc().listenerBus().waitUntilEmpty()


def describe_range(start: str | None, end: str | None) -> str:
    """``ids 1..500`` for one log; ``partition 0 ids 1..120, partition 1 ids 1..80`` (those
    with events) for a stream's partitions."""
    starts, ends = _positions(start), _positions(end)
    if set(ends) <= {None}:
        return f"ids {starts.get(None, 0) + 1}..{ends.get(None, 0)}"
    spans = [
        f"partition {p} ids {starts.get(p, upto) + 1}..{upto}"
        for p, upto in sorted((p, upto) for p, upto in ends.items() if p is not None)
        if upto > starts.get(p, upto)
    ]
    return ", ".join(spans) or "no events"


def _positions(offset: str | None) -> Positions:
    try:
        parsed: Any = json.loads(offset) if offset else {}
        return load_offset(parsed) if isinstance(parsed, dict) else {}
    except ValueError:
        return {}


@dataclass(frozen=True)
class Aggregates:
    per_minute: DataFrame
    per_type: DataFrame


def aggregate(spark: SparkSession, archive: str) -> Aggregates:
    """Events per type per minute, and per type: count, first and last id and time."""
    events = read_archive(spark, archive)
    per_minute = events.groupBy("type", F.date_trunc("minute", "ts").alias("minute")).agg(
        F.count("*").alias("events")
    )
    per_type = events.groupBy("type").agg(
        F.count("*").alias("events"),
        F.min("id").alias("first_id"),
        F.max("id").alias("last_id"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
    )
    return Aggregates(per_minute, per_type)


def write_aggregates(aggregates: Aggregates, out: str) -> list[Row]:
    """Write both tables as Parquet under ``out`` (replacing earlier runs); return the
    per-type rows for a report."""
    aggregates.per_minute.write.mode("overwrite").parquet(f"{out}/per_minute")
    aggregates.per_type.write.mode("overwrite").parquet(f"{out}/per_type")
    return aggregates.per_type.orderBy("type").collect()


def format_report(rows: list[Row]) -> str:
    header = f"{'type':<16} {'events':>12} {'first id':>14} {'last id':>14}  first .. last"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['type']:<16} {row['events']:>12,} {row['first_id']:>14} {row['last_id']:>14}"
            f"  {row['first_ts']:%Y-%m-%d %H:%M:%S} .. {row['last_ts']:%Y-%m-%d %H:%M:%S}"
        )
    total = sum(int(row["events"]) for row in rows)
    lines.append(f"{len(rows)} types, {total:,} events")
    return "\n".join(lines)
