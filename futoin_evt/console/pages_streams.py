"""The streams and their partitions: the streams a user holds a right on (heads, rates and
charts of those they may read), a stream's page and a partition's; streams added, grown and
dropped through the registry (manage on the name)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..domain.partition import Partition, StreamInfo
from ..domain.rights import Right
from .exchange import Call, ConsoleResponse, PageError, Routes
from .formatting import number_in, paged, said, total
from .pages import Pages
from .samples import Chart, HeadSamples, chart


class StreamPages:
    def __init__(self, pages: Pages, samples: HeadSamples) -> None:
        self._pages = pages
        self._streams = pages.streams
        self._samples = samples

    def routes(self) -> Routes:
        return {
            ("GET", "/streams"): self._streams_page,
            ("GET", "/stream"): self._stream_page,
            ("POST", "/streams/add"): self._add_stream,
            ("POST", "/streams/grow"): self._grow_stream,
            ("POST", "/streams/drop"): self._drop_stream,
            ("GET", "/partition"): self._partition_page,
        }

    async def _extent(self, call: Call, partition: Partition) -> dict[str, Any]:
        """A partition's row: head, oldest, rate, who holds back discarding (named to those
        who manage the stream; to others only when it is theirs)."""
        events, who = self._pages.log(partition), call.principal
        limits = await events.retention_limits(who)
        held = limits.lowest_position is not None  # position 0 (never acknowledged) holds too
        lowest = await events.consumers.lowest(who) if held else None
        return {
            "partition": partition,
            "readable": True,
            "head": max(limits.newest_id, events.head),
            "oldest": limits.oldest_id,
            "rate": self._samples.rate(partition),
            "bytes": _kept_bytes(
                limits.oldest_id,
                max(limits.newest_id, events.head),
                self._samples.event_size(partition),
            ),
            "held_back_by": lowest,
            "manages": events.guard.shown_to(who) is None,
            "chart": self._chart(partition, 160, 28),
        }

    def _chart(self, partition: Partition, width: int, height: int) -> Chart:
        rates = self._samples.rates(partition)
        return chart(rates, width, height, time.time(), 30 * self._samples.interval)

    async def _streams_page(self, call: Call) -> ConsoleResponse:
        """The streams the caller holds a right on; the figures of those they may read."""
        prefix, who = call.query.get("q", ""), call.principal
        visible = self._streams.visible_to(who)
        partitions = [
            p for info in visible if info.name.startswith(prefix) for p in info.partitions
        ]
        page, pages, shown = paged(partitions, call.query)
        access = self._streams.access
        rows = [
            await self._extent(call, p)
            if access.allows(who, Right.READ, p.stream)
            else {"partition": p, "readable": False}
            for p in shown
        ]
        readable = [
            info.name
            for info in visible
            if info.name.startswith(prefix) and access.allows(who, Right.READ, info.name)
        ]
        return self._pages.page(
            call.session,
            "streams.html",
            rows=rows,
            typed=self._pages.typed(readable),
            page=page,
            pages=pages,
            total=len(partitions),
            streams=len(visible),
            q=prefix,
            notice=await self._pages.notice(call),
            principal=call.principal,
        )

    async def _partition_page(self, call: Call) -> ConsoleResponse:
        partition = self._pages.partition(call, call.query)
        row = await self._extent(call, partition)
        events, who = self._pages.log(partition), call.principal
        oldest = await events.read_after(who, max(row["oldest"] - 1, 0), 1)
        newest = await events.read_after(who, max(row["head"] - 1, 0), 1)
        big = self._chart(partition, 720, 180)
        return self._pages.page(
            call.session,
            "partition.html",
            row=row,
            oldest_ts=oldest[0].ts if oldest else None,
            newest_ts=newest[0].ts if newest else None,
            big=big,
            interval=self._samples.interval,
            principal=call.principal,
        )

    # -- managing streams -----------------------------------------------------------------

    def _stream_info(self, call: Call, name: str) -> StreamInfo:
        """The stream ``name`` when the caller holds some right on it (404 otherwise, the
        same whether it exists or not)."""
        info = self._streams.get(name) if self._streams.holds_any(call.principal, name) else None
        if info is None:
            raise PageError(404, f"No such stream: {name[:60]}.")
        return info

    async def _stream_page(self, call: Call) -> ConsoleResponse:
        info = self._stream_info(call, call.query.get("name", ""))
        who, access = call.principal, self._streams.access
        readable = access.allows(who, Right.READ, info.name)
        rows = [await self._extent(call, p) for p in info.partitions] if readable else []
        return self._pages.page(
            call.session,
            "stream.html",
            info=info,
            rows=rows,
            readable=readable,
            total_bytes=total([r["bytes"] for r in rows]),
            manages=access.allows(who, Right.MANAGE, info.name),
            notice=await self._pages.notice(call),
            principal=who,
        )

    async def _add_stream(self, call: Call) -> ConsoleResponse:
        name = call.form.get("name", "").strip()
        count = _partitions_in(call.form)
        try:
            info = await self._streams.add(call.principal, name, count)
        except KeyError:
            raise PageError(409, f"The stream {name} exists already.") from None
        except ValueError as exc:
            raise PageError(400, said(exc)) from None
        return await self._stream_done(call, info.name, f"Added {info.name}: {count} partitions.")

    async def _grow_stream(self, call: Call) -> ConsoleResponse:
        info = self._stream_info(call, call.form.get("name", ""))
        count = _partitions_in(call.form)
        try:
            grown = await self._streams.grow(call.principal, info.name, count)
        except KeyError:
            raise PageError(404, f"No such stream: {info.name}.") from None
        except ValueError as exc:
            raise PageError(400, said(exc)) from None
        notice = f"{grown.name} has {len(grown.partitions)} partitions now."
        return await self._stream_done(call, grown.name, notice)

    async def _drop_stream(self, call: Call) -> ConsoleResponse:
        info = self._stream_info(call, call.form.get("name", ""))
        if call.form.get("confirm", "") != info.name:
            raise PageError(400, f"Type the stream's name, {info.name}, to drop it.")
        try:
            dropped = await self._streams.drop(call.principal, info.name)
        except ValueError as exc:
            raise PageError(400, said(exc)) from None
        if not dropped:
            raise PageError(404, f"No such stream: {info.name}.")
        return await self._pages.noticed(call, f"Dropped {info.name} and its events.", "/streams")

    async def _stream_done(self, call: Call, name: str, notice: str) -> ConsoleResponse:
        """After a change: the stream's page, saying what was done."""
        return await self._pages.noticed(call, notice, f"/stream?name={quote(name, safe='')}")


def _kept_bytes(oldest: int, head: int, event_size: float | None) -> float | None:
    """The bytes of a partition's events kept, estimated from its mean event size."""
    if event_size is None:
        return None if head else 0.0
    return (head - oldest + 1) * event_size if oldest else 0.0


def _partitions_in(form: Mapping[str, str]) -> int:
    count = number_in(form.get("partitions", "").strip(), 6)
    if count is None:
        raise PageError(400, "The number of partitions is a whole number, 1 or more.")
    return count
