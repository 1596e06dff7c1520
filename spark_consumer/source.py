"""The PySpark data source ``futoin-evt``: a futoin-evt server's events as a table or a stream.

It reads as a registered reliable consumer of the server, through ``futoinevt.ops`` range
reads that never move the consumer's position. Offsets are event ids (``{"id": N}``: everything
up to N). A streaming query acknowledges a batch's end only once Spark has committed the batch
to its checkpoint, so the server may discard exactly what the checkpoint says is done:

- ``latestOffset(start)`` acknowledges ``start``: Spark asks for the next offset only after the
  batch ending at ``start`` is committed. That also covers the last batch of a run, which Spark
  never passes to ``commit``, and the checkpoint of an earlier run at start-up.
- ``commit(end)`` acknowledges ``end``.

Readers are pickled and sent to Spark's Python workers: connections are opened lazily and are
never part of the pickled state. ``read`` runs on the workers, one connection per partition.

Options: ``endpoint`` (ws:// URL), ``user`` and ``password`` (Spark redacts an option named
``password`` in plans and logs), ``component``, ``want`` (event types, comma-separated),
``maxEventsPerBatch`` (default 1000000), ``eventsPerPartition`` (default 50000). A batch read
(``spark.read``) also takes ``afterId`` and ``uptoId`` (default: the consumer's position and
the newest event).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from futoin_evt.client.sync import BlockingClient

T = TypeVar("T")

FORMAT: Final = "futoin-evt"

#: ``date`` is the event's UTC date, the archive's partition column beside ``type``.
SCHEMA: Final = "id bigint, type string, data string, ts timestamp, date date"

ARROW_SCHEMA: Final = pa.schema([
    ("id", pa.int64()),
    ("type", pa.string()),
    ("data", pa.string()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("date", pa.date32()),
])  # fmt: skip

DEFAULT_MAX_EVENTS_PER_BATCH: Final = 1_000_000
DEFAULT_EVENTS_PER_PARTITION: Final = 50_000


class OptionError(ValueError):
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

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        # Spark hands options over with lower-cased keys.
        opts = {k.lower(): v for k, v in options.items()}
        for required in ("endpoint", "user", "password", "component"):
            if not opts.get(required):
                raise OptionError(f"the {FORMAT} source needs the option {required!r}")
        want = opts.get("want")
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
        )

    def connect(self) -> BlockingClient:
        return BlockingClient(self.endpoint, credentials=f"{self.user}:{self.password}")


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
    """Events with ``after_id < id <= upto_id``."""

    after_id: int
    upto_id: int


def split_range(after_id: int, upto_id: int, per_partition: int) -> list[EventRange]:
    return [
        EventRange(start, min(start + per_partition, upto_id))
        for start in range(after_id, upto_id, per_partition)
    ]


def record_batch(events: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    """One readEvents reply (read with ``data_as_text``) as Arrow columns."""
    ts = pc.assume_timezone(
        pc.strptime(
            pa.array([e["ts"] for e in events], pa.string()),
            format="%Y-%m-%dT%H:%M:%SZ",
            unit="us",
        ),
        "UTC",
    )
    return pa.record_batch(
        [
            pa.array([e["id"] for e in events], pa.string()).cast(pa.int64()),
            pa.array([e["type"] for e in events], pa.string()),
            pa.array([e["data"] for e in events], pa.string()),
            ts,
            ts.cast(pa.date32()),
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(options: SourceOptions, events: InputPartition) -> Iterator[pa.RecordBatch]:
    """Every event of the range, one Arrow batch per reply (runs on a Spark worker)."""
    if not isinstance(events, EventRange):
        return  # Spark reads one placeholder partition when there are none
    with options.connect() as client:
        after_id = events.after_id
        while page := client.read_events(
            options.component, after_id, events.upto_id, options.want, data_as_text=True
        ):
            yield record_batch(page)
            after_id = int(page[-1]["id"])


class _Consumer:
    """The driver side's connection, opened when first needed and left out of pickles."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: BlockingClient | None = None
        self._acknowledged = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_client": None, "_acknowledged": 0}

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
            self._client = self.options.connect()
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


class FutoinEvtDataSource(DataSource):
    """``spark.read.format("futoin-evt")`` and ``spark.readStream.format("futoin-evt")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(self.options))


class BatchReader(DataSourceReader):
    """The consumer's unacknowledged events (or ``afterId``..``uptoId``) as they are now.
    Reading acknowledges nothing."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        consumer = _Consumer(self.options)
        try:
            position, head_id = consumer.state()
        finally:
            consumer.close()
        after_id = self.options.after_id if self.options.after_id is not None else position
        upto_id = self.options.upto_id if self.options.upto_id is not None else head_id
        return split_range(after_id, upto_id, self.options.events_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer = _Consumer(options)
        #: With Trigger.AvailableNow: the newest id when the query started.
        self._target: int | None = None

    def initialOffset(self) -> dict[str, int]:
        position, _head = self._consumer.state()
        return {"id": position}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_events_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._consumer.state()[1]

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        start_id = int(start["id"])
        self._consumer.acknowledge(start_id)  # committed: see the module docstring
        _position, end_id = self._consumer.state()
        if self._target is not None:
            end_id = min(end_id, self._target)
        if isinstance(limit, ReadMaxRows):
            end_id = min(end_id, start_id + limit.max_rows)
        return {"id": max(end_id, start_id)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return split_range(int(start["id"]), int(end["id"]), self.options.events_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        self._consumer.acknowledge(int(end["id"]))

    def stop(self) -> None:
        self._consumer.close()
