"""Each partition's head, sampled in memory, for events per second, the partitions'
15-minute charts and the overview's hour.

A task reads every partition's newest id each :attr:`HeadSamples.interval` seconds (one
indexed query per partition, :data:`MAX_SAMPLED` partitions at most) and keeps the samples
of the last :data:`HISTORY_SECONDS`, all of one round at one time. Ids grow by one per
event, so the difference of two heads is the events appended between them (by any
process).

Byte figures are estimates: when a head moved, the newest :data:`SIZE_SAMPLE` events of its
partition are read and their data's mean size (UTF-8 JSON) stands for every event there, so
bytes per second are events per second times that, and a partition's size its events kept
times that.

Each consumer's lag is sampled too, for the last :data:`LAG_WINDOW_SECONDS` (one read per
partition that has consumers, :data:`MAX_CONSUMERS_SAMPLED` consumers at most), read as the
console itself (:data:`SAMPLER`): a consumer's page shows it only to who may see that
consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ..domain.partition import Partition
from ..domain.principal import Principal
from ..domain.stream import UserId
from ..log.streams import StreamLogs, StreamRegistry

logger = logging.getLogger(__name__)

WINDOW_SECONDS: Final = 15 * 60.0
#: How long each partition's heads are kept (the overview charts the last hour).
HISTORY_SECONDS: Final = 3600.0
DEFAULT_INTERVAL: Final = 10.0
#: Partitions sampled at most (in registry order).
MAX_SAMPLED: Final = 1000
#: The rate shown is over about this many seconds.
RATE_SECONDS: Final = 60.0
#: Events read to estimate a partition's mean event size.
SIZE_SAMPLE: Final = 16
#: How long each consumer's lag is kept.
LAG_WINDOW_SECONDS: Final = 3600.0
MAX_CONSUMERS_SAMPLED: Final = 1000
#: Who samples the lags: the console itself (what it shows is filtered per user).
SAMPLER: Final = Principal(UserId(0), "console", True)
#: A consumer: (partition, user id, component).
ConsumerKey = tuple[Partition, UserId, str]


class HeadSamples:
    def __init__(
        self, logs: StreamLogs, streams: StreamRegistry, interval: float = DEFAULT_INTERVAL
    ) -> None:
        self._logs = logs
        self._streams = streams
        self.interval = interval
        self._maxlen = int(HISTORY_SECONDS / interval) + 2
        self._samples: dict[Partition, deque[tuple[float, int]]] = {}
        #: (head when measured, mean data bytes of an event) per partition.
        self._sizes: dict[Partition, tuple[int, float]] = {}
        self._lags: dict[ConsumerKey, deque[tuple[float, int]]] = {}
        self._lags_kept = int(LAG_WINDOW_SECONDS / interval) + 2
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="futoin-evt-console-samples")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception as exc:  # the database is away for a moment: the next turn
                logger.debug("sampling the heads failed: %s", exc)
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        partitions = [p for info in self._streams for p in info.partitions][:MAX_SAMPLED]
        for gone in self._samples.keys() - set(partitions):
            del self._samples[gone]
            self._sizes.pop(gone, None)
        now = time.time()  # one time a round: the overview sums the partitions' rates by it
        for partition in partitions:
            events = self._logs.partition(partition)
            head = max(await events.newest_id(), events.head)
            samples = self._samples.get(partition)
            if samples is None:
                samples = self._samples[partition] = deque(maxlen=self._maxlen)
            samples.append((now, head))
            measured = self._sizes.get(partition)
            if head > 0 and (measured is None or measured[0] != head):
                newest, _ = await events.read_of_types(
                    max(head - SIZE_SAMPLE, 0), SIZE_SAMPLE, None
                )
                if newest:
                    mean = sum(len(e.data_json.encode()) for e in newest) / len(newest)
                    self._sizes[partition] = (head, mean)
        await self._sample_lags(partitions)

    async def _sample_lags(self, partitions: list[Partition]) -> None:
        counts = await self._logs.consumer_counts(SAMPLER)
        seen: set[ConsumerKey] = set()
        now = time.time()
        for partition in partitions:
            room = MAX_CONSUMERS_SAMPLED - len(seen)
            if room <= 0:
                break
            if not counts.get(partition.key):
                continue
            consumers = self._logs.partition(partition).consumers
            for row in await consumers.first(SAMPLER, room):
                key = (partition, row.user_id, row.component)
                seen.add(key)
                lags = self._lags.get(key)
                if lags is None:
                    lags = self._lags[key] = deque(maxlen=self._lags_kept)
                lags.append((now, row.behind))
        for gone in self._lags.keys() - seen:
            del self._lags[gone]

    def lags(self, key: ConsumerKey) -> list[tuple[float, float]]:
        """(time, events behind) of a consumer over the last hour."""
        return [(at, float(lag)) for at, lag in self._lags.get(key, ())]

    def event_size(self, partition: Partition) -> float | None:
        """The mean data bytes of the partition's newest events; None before a sample."""
        measured = self._sizes.get(partition)
        return measured[1] if measured is not None else None

    def bytes_rate(self, partition: Partition) -> float | None:
        """Bytes per second (an estimate: see the module's text)."""
        rate, mean = self.rate(partition), self.event_size(partition)
        if rate is None:
            return None
        return rate * mean if mean is not None else 0.0

    def rate(self, partition: Partition) -> float | None:
        """Events per second over the last minute or so; None before two samples."""
        samples = self._samples.get(partition)
        if not samples or len(samples) < 2:
            return None
        last_time, last_head = samples[-1]
        first_time, first_head = samples[-2]
        for at, head in reversed(samples):
            if last_time - at > RATE_SECONDS:
                break
            first_time, first_head = at, head
        if last_time <= first_time:
            return None
        return max(last_head - first_head, 0) / (last_time - first_time)

    def rates(self, partition: Partition) -> list[tuple[float, float]]:
        """(time, events per second since the sample before) over the window."""
        samples = list(self._samples.get(partition, ()))
        return [
            (at, max(head - before, 0) / (at - then))
            for (then, before), (at, head) in itertools.pairwise(samples)
            if at > then
        ]

    def total_rates(
        self, partitions: Iterable[Partition]
    ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """(time, events per second) and (time, bytes per second, estimated) of
        ``partitions`` together, over the last hour."""
        events: dict[float, float] = {}
        sizes: dict[float, float] = {}
        for partition in partitions:
            mean = self.event_size(partition) or 0.0
            for at, rate in self.rates(partition):
                events[at] = events.get(at, 0.0) + rate
                sizes[at] = sizes.get(at, 0.0) + rate * mean
        return sorted(events.items()), sorted(sizes.items())


@dataclass(frozen=True, slots=True)
class Dot:
    """A sample on a chart, with what hovering it tells (``07:41:02 UTC: 12``)."""

    x: float
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """An SVG line chart's geometry: numbers only (nothing to escape), and its samples."""

    width: int
    height: int
    points: str
    peak: float
    empty: bool
    #: What the left edge is: "15 min ago", or less while the samples cover less.
    since: str
    dots: tuple[Dot, ...] = ()


def chart(
    rates: list[tuple[float, float]],
    width: int,
    height: int,
    now: float,
    shortest: float,
    window: float = WINDOW_SECONDS,
    unit: str = "events/s",
) -> Chart:
    """The values (events per second, unless told) of the last ``window`` seconds as a
    polyline, scaled to the peak. While the samples cover less (a process started lately),
    the chart spans what they cover, ``shortest`` seconds at least."""
    first = rates[0][0] if rates else now
    window = min(max(now - first, shortest), window)
    series = [(at, rate) for at, rate in rates if at >= now - window]
    peak = max((rate for _at, rate in series), default=0.0)
    scale = peak if peak > 0 else 1.0
    dots = tuple(
        Dot(
            (at - (now - window)) / window * width,
            height - rate / scale * (height - 2) - 1,
            f"{time.strftime('%H:%M:%S', time.gmtime(at))} UTC: {_value(rate)} {unit}",
        )
        for at, rate in series
    )
    points = " ".join(f"{dot.x:.1f},{dot.y:.1f}" for dot in dots)
    since = f"{window / 60:.0f} min ago" if window >= 120 else f"{window:.0f} s ago"
    return Chart(width, height, points, peak, not series, since, dots)


def _value(value: float) -> str:
    """``12``, ``3.5``, ``1,024``: whole numbers without a fraction."""
    return f"{value:,.0f}" if value.is_integer() else f"{value:,.1f}"
