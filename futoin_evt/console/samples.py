"""Each partition's head, sampled in memory, for events per second and the 15-minute chart.

A task reads every partition's newest id each :attr:`HeadSamples.interval` seconds (one
indexed query per partition, :data:`MAX_SAMPLED` partitions at most) and keeps the samples
of the last :data:`WINDOW_SECONDS`. Ids grow by one per event, so the difference of two
heads is the events appended between them (by any process).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Final

from ..domain.partition import Partition
from ..log.streams import StreamLogs, StreamRegistry

log = logging.getLogger(__name__)

WINDOW_SECONDS: Final = 15 * 60.0
DEFAULT_INTERVAL: Final = 10.0
#: Partitions sampled at most (in registry order).
MAX_SAMPLED: Final = 1000
#: The rate shown is over about this many seconds.
RATE_SECONDS: Final = 60.0


class HeadSamples:
    def __init__(
        self, logs: StreamLogs, streams: StreamRegistry, interval: float = DEFAULT_INTERVAL
    ) -> None:
        self._logs = logs
        self._streams = streams
        self.interval = interval
        self._maxlen = int(WINDOW_SECONDS / interval) + 2
        self._samples: dict[Partition, deque[tuple[float, int]]] = {}
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
                log.debug("sampling the heads failed: %s", exc)
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        partitions = [p for info in self._streams for p in info.partitions][:MAX_SAMPLED]
        for gone in self._samples.keys() - set(partitions):
            del self._samples[gone]
        for partition in partitions:
            events = self._logs.partition(partition)
            head = max(await events.newest_id(), events.head)
            samples = self._samples.get(partition)
            if samples is None:
                samples = self._samples[partition] = deque(maxlen=self._maxlen)
            samples.append((time.time(), head))

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


@dataclass(frozen=True, slots=True)
class Chart:
    """An SVG line chart's geometry: numbers only (nothing to escape)."""

    width: int
    height: int
    points: str
    peak: float
    empty: bool
    #: What the left edge is: "15 min ago", or less while the samples cover less.
    since: str


def chart(
    rates: list[tuple[float, float]], width: int, height: int, now: float, shortest: float
) -> Chart:
    """The rates of the last 15 minutes as a polyline, scaled to the peak. While the samples
    cover less (a process started lately), the chart spans what they cover, ``shortest``
    seconds at least."""
    first = rates[0][0] if rates else now
    window = min(max(now - first, shortest), WINDOW_SECONDS)
    series = [(at, rate) for at, rate in rates if at >= now - window]
    peak = max((rate for _at, rate in series), default=0.0)
    scale = peak if peak > 0 else 1.0
    points = " ".join(
        f"{(at - (now - window)) / window * width:.1f},"
        f"{height - rate / scale * (height - 2) - 1:.1f}"
        for at, rate in series
    )
    since = f"{window / 60:.0f} min ago" if window >= 120 else f"{window:.0f} s ago"
    return Chart(width, height, points, peak, not series, since)
