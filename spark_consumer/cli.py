"""``futoin-evt-spark``: run the archive and aggregate jobs, or package them for spark-submit.

The only module here that reads argv and the environment and sets up logging.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

from futoin_evt.cli.common import (
    ENV_PASSWORD,
    ENV_USER,
    CliError,
    configure_logging,
    read_credentials,
)
from futoin_evt.client.aio import CommError, RemoteError
from futoin_evt.ftn3.ifaces import default_iface_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_ENDPOINT: Final = "ws://127.0.0.1:8480/"
PACKAGE_ZIP: Final = "futoin-evt-spark.zip"
MAIN_SCRIPT: Final = "futoin_evt_spark_main.py"

logger = logging.getLogger("spark_consumer")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        result: int = args.run(args)
    except CliError as exc:
        print(f"futoin-evt-spark: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="futoin-evt-spark",
        description="Bulk-process a futoin-evt event stream with Spark.",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    archive = commands.add_parser(
        "archive",
        help="archive events to Parquet as a reliable consumer",
        description="Archive events to Parquet partitioned by date and type, as the reliable"
        " consumer COMPONENT. The server's position for it moves only past events whose"
        f" micro-batch is committed. Credentials: --user or ${ENV_USER}, and ${ENV_PASSWORD}"
        " or --password-stdin.",
    )
    archive.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="the server's ws:// URL")
    archive.add_argument("--component", default="ARCHIVE", help="the consumer's name")
    archive.add_argument(
        "--stream",
        metavar="NAME",
        help="archive every partition of this stream (the consumer is registered on each;"
        " --endpoint is then the server's base URL); default: the log --endpoint serves",
    )
    archive.add_argument("--out", required=True, help="the archive's directory")
    archive.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    archive.add_argument("--master", help="Spark master URL (default: local[*])")
    archive.add_argument("--once", action="store_true", help="archive what is there, then stop")
    archive.add_argument("--interval", default="10 seconds", help="micro-batch interval")
    archive.add_argument("--want", help="only these event types, comma-separated")
    archive.add_argument(
        "--event-type",
        metavar="TYPE",
        help="only this event type, its data as typed columns from the newest schema of the"
        " subject STREAM-TYPE in the server's schema registry (not with --want)",
    )
    archive.add_argument(
        "--max-events-per-batch", type=_positive_int, help="default: 1000000 (id range)"
    )
    archive.add_argument(
        "--events-per-partition", type=_positive_int, help="default: 50000 (id range)"
    )
    archive.add_argument("--user", default=os.environ.get(ENV_USER))
    archive.add_argument("--password-stdin", action="store_true")
    archive.set_defaults(run=_archive)

    agg = commands.add_parser(
        "aggregate",
        help="aggregate an archive: events per type per minute, first and last id per type",
    )
    agg.add_argument("--archive", required=True, help="the archive job's --out")
    agg.add_argument("--out", required=True, help="directory for per_minute/ and per_type/")
    agg.add_argument("--master", help="Spark master URL (default: local[*])")
    agg.set_defaults(run=_aggregate)

    package = commands.add_parser(
        "package",
        help="write the package zip and main script for spark-submit",
        description=f"Write {PACKAGE_ZIP} (for --py-files) and {MAIN_SCRIPT} (the application"
        " to submit) into OUT, and print a spark-submit command line.",
    )
    package.add_argument("--out", required=True, type=Path)
    package.set_defaults(run=_package)
    return parser


def _positive_int(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {raw!r}")
    return int(raw)


def _archive(args: argparse.Namespace) -> int:
    from .jobs import ArchiveJob, ProgressLog, flush_listeners, start_archive

    user, password = read_credentials(args)
    options = {
        "endpoint": args.endpoint,
        "user": user,
        "password": password,
        "component": args.component,
    }
    if args.max_events_per_batch:
        options["maxEventsPerBatch"] = str(args.max_events_per_batch)
    if args.events_per_partition:
        options["eventsPerPartition"] = str(args.events_per_partition)
    if args.want:
        options["want"] = args.want
    if args.stream:
        options["stream"] = args.stream
    if args.event_type:
        options["eventType"] = args.event_type
    _check_consumer(options)
    job = ArchiveJob(options, args.out, args.checkpoint, once=args.once, interval=args.interval)
    spark = _session(args.master, job.query_name)
    progress = ProgressLog()
    spark.streams.addListener(progress)
    query = start_archive(spark, job)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        logger.info("stopping; the batch in progress is done again on the next run")
        query.stop()
        raise
    except Exception as exc:  # Spark's StreamingQueryException and Py4J errors
        raise CliError(f"the archive query failed: {_first_line(exc)}") from exc
    finally:
        flush_listeners(spark)
        spark.streams.removeListener(progress)
    logger.info("archived into %s", args.out)
    spark.stop()
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    from .jobs import aggregate, format_report, write_aggregates

    spark = _session(args.master, "futoin-evt aggregate")
    try:
        rows = write_aggregates(aggregate(spark, args.archive), args.out)
    except Exception as exc:  # AnalysisException for a missing archive, among others
        raise CliError(f"cannot aggregate {args.archive}: {_first_line(exc)}") from exc
    print(format_report(rows))
    return 0


def _package(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    archive = build_package_zip(args.out / PACKAGE_ZIP)
    script = args.out / MAIN_SCRIPT
    script.write_text(
        "from spark_consumer.cli import main\n\nraise SystemExit(main())\n", encoding="utf-8"
    )
    print(f"spark-submit --master spark://HOST:7077 --py-files {archive} {script} archive ...")
    return 0


def build_package_zip(path: Path) -> Path:
    """futoin_evt (with its ifaces) and spark_consumer, importable from the zip on workers."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("futoin_evt", "spark_consumer"):
            for name, data in _package_files(package):
                archive.writestr(name, data)
    return path


def _package_files(package: str) -> Iterator[tuple[str, bytes]]:
    root = resources.files(package)
    stack = [(root, package)]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name != "__pycache__" and f"{prefix}/{entry.name}" != "futoin_evt/ifaces":
                    stack.append((entry, f"{prefix}/{entry.name}"))
            elif entry.name.endswith((".py", ".json", "py.typed")):
                yield f"{prefix}/{entry.name}", entry.read_bytes()
    if package == "futoin_evt":  # package_dir maps futoin_evt.ifaces to the top-level ifaces/
        for entry in default_iface_dir().iterdir():
            if entry.name.endswith((".py", ".json")):
                yield f"futoin_evt/ifaces/{entry.name}", entry.read_bytes()


def _check_consumer(options: dict[str, str]) -> None:
    """Fail early with a clear message, before Spark starts, if the server cannot serve us."""
    from .source import SourceError, SourceOptions, consumer_states

    try:
        parsed = SourceOptions.parse(options)
        parsed.schema()  # with eventType: the schema is there and maps
        states = consumer_states(parsed)
    except (CommError, SourceError) as exc:
        raise CliError(str(exc)) from None
    except RemoteError as exc:
        raise CliError(f"the server refused: {exc}.") from None
    for partition, (position, head_id) in states.items():
        logger.info(
            "consumer %s%s: acknowledged up to %d, newest event %d",
            options["component"],
            "" if partition is None else f" on {options['stream']}/{partition}",
            position,
            head_id,
        )


def _session(master: str | None, app_name: str) -> SparkSession:
    from pyspark.sql import SparkSession

    # Workers run the interpreter that runs this, unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit set the master
    if master:
        builder = builder.master(master)
    elif not under_submit:
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if master and not master.startswith("local") and not under_submit:
        # A cluster's workers import the package from this zip.
        zip_path = Path(tempfile.mkdtemp(prefix="futoin-evt-spark-")) / PACKAGE_ZIP
        spark.sparkContext.addPyFile(str(build_package_zip(zip_path)))
    return spark


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
