"""The PySpark data source ``futoin-evt``: a futoin-evt server's events as a table or a stream.

It reads as a registered reliable consumer of the server, through ``futoinevt.ops`` range
reads that never move the consumer's position. Offsets are event ids (``{"id": N}``: everything
up to N). A streaming query acknowledges a batch's end only once Spark has committed the batch
to its checkpoint, so the server may discard exactly what the checkpoint says is done:

- ``latestOffset(start)`` acknowledges ``start``: Spark asks for the next offset only after the
  batch ending at ``start`` is committed. That also covers the last batch of a run, which Spark
  never passes to ``commit``, and the checkpoint of an earlier run at start-up.
- ``commit(end)`` acknowledges ``end``.

With ``stream`` (a stream's name), the source reads every partition of that stream: the
consumer is registered on each partition (``ws://HOST:PORT/NAME/P``), the offsets hold a
position per partition (``{"0": N0, "1": N1, ...}``), each Spark input partition reads one
stream partition's id range, and the rows carry ``stream`` and ``partition`` columns. The
partitions are listed by the server (``listStreams`` of ``futoinevt.ops``) before each
micro-batch: a partition added by growing the stream
joins at its consumer's position, with an empty range in the batch that adds it.

Readers are pickled and sent to Spark's Python workers: connections are opened lazily and are
never part of the pickled state. ``read`` runs on the workers, one connection per partition.

Options: ``endpoint`` (ws:// URL; with ``stream``, the server's base URL), ``user`` and
``password`` (Spark redacts an option named ``password`` in plans and logs), ``component``,
``stream``, ``want`` (event types, comma-separated), ``eventType`` (one type, its ``data``
typed by its schema in the registry: see :mod:`spark_consumer.typed`), ``maxEventsPerBatch``
(default 1000000, shared by the partitions), ``eventsPerPartition`` (default 50000). A batch read
(``spark.read``) also takes ``afterId`` and ``uptoId`` (default: the consumer's position and
the newest event; not with ``stream``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from futoin_evt.client.aio import OPS, CommError, RemoteError, normalize_url
from futoin_evt.client.sync import BlockingClient
from futoin_evt.domain.partition import DEFAULT_STREAM, check_stream_name

from .typed import SchemaFetchError, latest_schema, spark_type, subject, typed_value

T = TypeVar("T")

FORMAT: Final = "futoin-evt"


def row_schema(data: DataType, stream: bool) -> StructType:
    """The source's columns: ``data`` of the given type (JSON text when untyped); with
    ``stream``, also the stream and partition columns. ``date`` is the event's UTC date, the
    archive's partition column beside ``type``."""
    columns = [
        StructField("id", LongType()),
        StructField("type", StringType()),
        StructField("data", data),
        StructField("ts", TimestampType()),
        StructField("date", DateType()),
    ]
    if stream:
        columns += [StructField("stream", StringType()), StructField("partition", IntegerType())]
    return StructType(columns)


SCHEMA: Final = row_schema(StringType(), stream=False)

ARROW_SCHEMA: Final = pa.schema([
    ("id", pa.int64()),
    ("type", pa.string()),
    ("data", pa.string()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("date", pa.date32()),
])  # fmt: skip

#: With the option ``stream``: which stream and partition each event is of.
STREAM_SCHEMA: Final = row_schema(StringType(), stream=True)

STREAM_ARROW_SCHEMA: Final = ARROW_SCHEMA.append(pa.field("stream", pa.string())).append(
    pa.field("partition", pa.int32())
)

DEFAULT_MAX_EVENTS_PER_BATCH: Final = 1_000_000
DEFAULT_EVENTS_PER_PARTITION: Final = 50_000


class SourceError(Exception):
    """What keeps the source from reading, in one sentence."""


class OptionError(SourceError, ValueError):
    """An option of the data source is missing or malformed."""


@dataclass(frozen=True)
class SourceOptions:
    endpoint: str
    user: str
    password: str = field(repr=False)
    component: str
    want: tuple[str, ...] | None
    max_events_per_batch: int
    events_per_partition: int
    after_id: int | None
    upto_id: int | None
    #: Every partition of this stream; None: the one log ``endpoint`` serves.
    stream: str | None = None
    #: Only events of this type, their ``data`` typed by its schema (``want`` is this type).
    event_type: str | None = None
    #: The type of ``data`` with ``event_type``, set from the schema Spark was given.
    data_type: DataType | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        # Spark hands options over with lower-cased keys.
        opts = {k.lower(): v for k, v in options.items()}
        for required in ("endpoint", "user", "password", "component"):
            if not opts.get(required):
                raise OptionError(f"the {FORMAT} source needs the option {required!r}")
        want = opts.get("want")
        stream = opts.get("stream")
        event_type = opts.get("eventtype")
        if event_type is not None:
            if not event_type or "-" in event_type or "," in event_type:
                raise OptionError(
                    f"the option 'eventType' names one event type (no '-' or ','),"
                    f" not {event_type!r}"
                )
            if want is not None:
                raise OptionError("eventType reads one type: leave 'want' out with it")
            want = event_type
        if stream is not None:
            try:
                check_stream_name(stream)
            except ValueError as exc:
                raise OptionError(f"the option 'stream': {exc}") from None
            if "afterid" in opts or "uptoid" in opts:
                raise OptionError("afterId and uptoId read one log: leave them out with 'stream'")
        return cls(
            endpoint=opts["endpoint"],
            user=opts["user"],
            password=opts["password"],
            component=opts["component"],
            want=tuple(t for t in want.split(",") if t) if want else None,
            max_events_per_batch=_positive(opts, "maxEventsPerBatch", DEFAULT_MAX_EVENTS_PER_BATCH),
            events_per_partition=_positive(
                opts, "eventsPerPartition", DEFAULT_EVENTS_PER_PARTITION
            ),
            after_id=_optional_id(opts, "afterId"),
            upto_id=_optional_id(opts, "uptoId"),
            stream=stream,
            event_type=event_type,
        )

    def connect(self, partition: int | None = None) -> BlockingClient:
        """A connection to the endpoint, or with ``stream`` to one of its partitions."""
        url = self.endpoint if partition is None else self._url(f"/{self.stream}/{partition}")
        return BlockingClient(url, credentials=f"{self.user}:{self.password}")

    def _url(self, path: str, scheme: str | None = None) -> str:
        parts = urlsplit(normalize_url(self.endpoint))
        base = parts.path.rstrip("/")
        return urlunsplit((scheme or parts.scheme, parts.netloc, base + path, "", ""))

    def _server_url(self, path: str) -> str:
        """``path`` on the server's HTTP side: the endpoint's base URL (without ``stream``,
        the endpoint less its ``/NAME`` or ``/NAME/P``)."""
        parts = urlsplit(normalize_url(self.endpoint))
        scheme = "https" if parts.scheme == "wss" else "http"
        base = parts.path.rstrip("/")
        if self.stream is None:
            base = base[: len(base) - len(self._endpoint_path())].rstrip("/")
        return urlunsplit((scheme, parts.netloc, base + path, "", ""))

    def _endpoint_path(self) -> str:
        """The ``/NAME`` or ``/NAME/P`` that ``endpoint`` ends with; "" for the server's root."""
        segments = urlsplit(normalize_url(self.endpoint)).path.strip("/").split("/")
        take = 2 if len(segments) >= 2 and segments[-1].isdigit() else 1
        return "".join(f"/{s}" for s in segments[-take:] if s)

    def subject_stream(self) -> str:
        """The stream whose events are read: ``stream``, or the one the endpoint's path names
        (``events`` for the server's root)."""
        if self.stream is not None:
            return self.stream
        return self._endpoint_path().split("/")[1] if self._endpoint_path() else DEFAULT_STREAM

    def schema(self) -> StructType:
        """The columns: with ``eventType``, ``data`` typed by the newest schema of the subject
        ``STREAM-TYPE`` in the server's registry."""
        data: DataType = StringType()
        if self.event_type is not None:
            name = subject(self.subject_stream(), self.event_type)
            try:
                found = latest_schema(
                    self._server_url("/schemas"), name, (self.user, self.password)
                )
            except SchemaFetchError as exc:
                raise SourceError(str(exc)) from None
            data = spark_type(found)
        return row_schema(data, stream=self.stream is not None)

    def with_schema(self, schema: StructType) -> SourceOptions:
        """These options reading into ``schema`` (the one Spark was given)."""
        if self.event_type is None:
            return self
        return replace(self, data_type=schema["data"].dataType)

    def partitions(self) -> list[int | None]:
        """The partitions to read: the stream's, as the server lists them (the ops iface's
        ``listStreams``, on the same connection as every other call); ``[None]`` without
        ``stream`` (the endpoint's one log)."""
        if self.stream is None:
            return [None]
        try:
            with self.connect() as client:
                streams = client.call(OPS, "listStreams", {})
        except (CommError, RemoteError) as exc:
            raise SourceError(f"cannot list the partitions of {self.stream}: {exc}") from None
        for summary in streams:
            if summary["name"] == self.stream:
                return list(range(int(summary["partitions"])))
        raise SourceError(f"the server has no stream {self.stream}")


def _positive(opts: Mapping[str, str], key: str, default: int) -> int:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise OptionError(f"the option {key!r} must be a positive integer, not {raw!r}")
    return int(raw)


def _optional_id(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key.lower())
    if raw is None:
        return None
    if not raw.isdigit():
        raise OptionError(f"the option {key!r} must be an event id, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class EventRange(InputPartition):
    """Events with ``after_id < id <= upto_id`` (of one partition of the stream)."""

    after_id: int
    upto_id: int
    partition: int | None = None


def split_range(
    after_id: int, upto_id: int, per_partition: int, partition: int | None = None
) -> list[EventRange]:
    return [
        EventRange(start, min(start + per_partition, upto_id), partition)
        for start in range(after_id, upto_id, per_partition)
    ]


#: Positions by partition (``None``: the endpoint's one log).
Positions = dict[int | None, int]


def load_offset(offset: Mapping[str, Any]) -> Positions:
    """``{"id": N}`` (one log) or ``{"0": N0, "1": N1, ...}`` (a stream's partitions). An
    offset of one log read with ``stream`` is partition 0's, and the other way round."""
    if "id" in offset:
        return {None: int(offset["id"])}
    return {int(key): int(value) for key, value in offset.items()}


def dump_offset(positions: Positions) -> dict[str, int]:
    if None in positions:
        return {"id": positions[None]}
    return {str(p): positions[p] for p in sorted(k for k in positions if k is not None)}


def _as_stream(positions: Positions, stream: str | None) -> Positions:
    """The positions keyed as the source reads: by partition with ``stream``, else one log."""
    if stream is None:
        return {None: positions.get(None, positions.get(0, 0))}
    if None in positions:
        return {0: positions[None]}
    return positions


def share_rows(starts: Positions, heads: Positions, max_rows: int) -> Positions:
    """Each partition's end, at most ``max_rows`` ids past the starts in all: the partitions
    with less to read take it all, the others share what is left evenly."""
    wanted = {p: heads[p] - starts[p] for p in heads}
    ends: Positions = {}
    left = max_rows
    for turn, p in enumerate(sorted(wanted, key=lambda k: (wanted[k], k or 0))):
        take = min(wanted[p], left // (len(wanted) - turn))
        ends[p] = starts[p] + take
        left -= take
    return ends


def record_batch(
    events: Sequence[dict[str, Any]],
    stream: str | None = None,
    partition: int | None = None,
    data_type: DataType | None = None,
) -> pa.RecordBatch:
    """One readEvents reply (read with ``data_as_text``) as Arrow columns; with ``stream``,
    also the stream and partition columns; with ``data_type``, ``data`` of that type."""
    ts = pc.assume_timezone(
        pc.strptime(
            pa.array([e["ts"] for e in events], pa.string()),
            format="%Y-%m-%dT%H:%M:%SZ",
            unit="us",
        ),
        "UTC",
    )
    columns = [
        pa.array([e["id"] for e in events], pa.string()).cast(pa.int64()),
        pa.array([e["type"] for e in events], pa.string()),
        _data_column(events, data_type),
        ts,
        ts.cast(pa.date32()),
    ]
    schema = ARROW_SCHEMA
    if stream is not None:
        columns.append(pa.array([stream] * len(events), pa.string()))
        columns.append(pa.array([partition] * len(events), pa.int32()))
        schema = STREAM_ARROW_SCHEMA
    if data_type is not None:
        schema = schema.set(2, pa.field("data", columns[2].type))
    return pa.record_batch(columns, schema=schema)


def _data_column(events: Sequence[dict[str, Any]], data_type: DataType | None) -> pa.Array:
    if data_type is None:
        return pa.array([e["data"] for e in events], pa.string())
    values = [typed_value(json.loads(e["data"]), data_type) for e in events]
    return pa.array(values, to_arrow_type(data_type, timezone="UTC"))


#: About how many events an Arrow batch holds: replies (up to 1000 events each) converted
#: and handed to Spark together cost less per event than one by one.
BATCH_EVENTS: Final = 10_000


def read_range(options: SourceOptions, events: InputPartition) -> Iterator[pa.RecordBatch]:
    """Every event of the range, in Arrow batches of whole replies, each the first to reach
    :data:`BATCH_EVENTS` events (runs on a Spark worker)."""
    if not isinstance(events, EventRange):
        return  # Spark reads one placeholder partition when there are none
    with options.connect(events.partition) as client:
        after_id = events.after_id
        batch: list[dict[str, Any]] = []
        while page := client.read_events(
            options.component, after_id, events.upto_id, options.want, data_as_text=True
        ):
            batch += page
            after_id = int(page[-1]["id"])
            if len(batch) >= BATCH_EVENTS:
                yield record_batch(batch, options.stream, events.partition, options.data_type)
                batch = []
        if batch:
            yield record_batch(batch, options.stream, events.partition, options.data_type)


class _Consumer:
    """The driver side's connection to one log, opened when first needed and left out of
    pickles."""

    def __init__(self, options: SourceOptions, partition: int | None = None) -> None:
        self.options = options
        self.partition = partition
        self._client: BlockingClient | None = None
        self._acknowledged = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_acknowledged": 0}

    def _call(self, call: Callable[[BlockingClient, str], T]) -> T:
        """Run ``call(client, component)``; reconnect once if the connection was lost."""
        component = self.options.component
        try:
            return call(self._connected(), component)
        except ConnectionError:
            self.close()
        return call(self._connected(), component)

    def _connected(self) -> BlockingClient:
        if self._client is None:
            self._client = self.options.connect(self.partition)
            self._client.register_consumer(self.options.component)
        return self._client

    def state(self) -> tuple[int, int]:
        return self._call(BlockingClient.consumer_state)

    def acknowledge(self, event_id: int) -> None:
        if event_id > self._acknowledged:
            self._acknowledged = self._call(lambda c, comp: c.acknowledge(comp, event_id))

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


class _Consumers:
    """The driver side's consumer on each partition read."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumers: dict[int | None, _Consumer] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_consumers": {}}

    def get(self, partition: int | None) -> _Consumer:
        consumer = self._consumers.get(partition)
        if consumer is None:
            consumer = self._consumers[partition] = _Consumer(self.options, partition)
        return consumer

    def states(self) -> dict[int | None, tuple[int, int]]:
        """(position, newest id) of each partition there is now."""
        return {p: self.get(p).state() for p in self.options.partitions()}

    def acknowledge(self, positions: Positions) -> None:
        for partition, position in positions.items():
            self.get(partition).acknowledge(position)

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()


def consumer_states(options: SourceOptions) -> dict[int | None, tuple[int, int]]:
    """Register the consumer on every partition read; (position, newest id) of each."""
    consumers = _Consumers(options)
    try:
        return consumers.states()
    finally:
        consumers.close()


class FutoinEvtDataSource(DataSource):
    """``spark.read.format("futoin-evt")`` and ``spark.readStream.format("futoin-evt")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SourceOptions.parse(self.options).schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(self.options).with_schema(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(self.options).with_schema(schema))


class BatchReader(DataSourceReader):
    """The consumer's unacknowledged events (or ``afterId``..``uptoId``) as they are now.
    Reading acknowledges nothing."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        ranges: list[EventRange] = []
        for partition, (position, head_id) in consumer_states(self.options).items():
            after_id = self.options.after_id if self.options.after_id is not None else position
            upto_id = self.options.upto_id if self.options.upto_id is not None else head_id
            ranges += split_range(after_id, upto_id, self.options.events_per_partition, partition)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumers = _Consumers(options)
        #: With Trigger.AvailableNow: each partition's newest id when the query started.
        self._target: Positions | None = None

    def initialOffset(self) -> dict[str, int]:
        return dump_offset({p: state[0] for p, state in self._consumers.states().items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_events_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: state[1] for p, state in self._consumers.states().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        starts = _as_stream(load_offset(start), self.options.stream)
        self._consumers.acknowledge(starts)  # committed: see the module docstring
        heads: Positions = {}
        joining: Positions = {}
        for partition, (position, head_id) in self._consumers.states().items():
            if partition not in starts:  # new: it joins at its position, reading nothing yet
                joining[partition] = position
                continue
            if self._target is not None:
                head_id = min(head_id, self._target.get(partition, starts[partition]))
            heads[partition] = max(head_id, starts[partition])
        if isinstance(limit, ReadMaxRows):
            heads = share_rows(starts, heads, limit.max_rows)
        return dump_offset({**starts, **heads, **joining})

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        starts = _as_stream(load_offset(start), self.options.stream)
        ends = _as_stream(load_offset(end), self.options.stream)
        per = self.options.events_per_partition
        ranges: list[EventRange] = []
        for partition, upto_id in ends.items():
            ranges += split_range(starts.get(partition, upto_id), upto_id, per, partition)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        self._consumers.acknowledge(_as_stream(load_offset(end), self.options.stream))

    def stop(self) -> None:
        self._consumers.close()
