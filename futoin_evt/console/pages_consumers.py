"""Registered consumers: a user's own on the streams they may read and, on streams they
manage, everyone's; a consumer's lag over the last hour; a consumer dropped or moved to a
position (read for one's own, manage for another's).

A push consumer's state (in flight, retrying) is known to the worker it is connected to; the
others show it connected, as the workers' channel tells them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..domain.partition import Partition
from ..domain.rights import Right
from ..log.access import AccessDenied, Refused
from ..log.consumers import ConsumerRow
from ..log.deliveries import ConnectedDeliveries
from .exchange import Call, ConsoleResponse, PageError, Routes
from .formatting import PAGE_SIZE, age, iso_time, number_in, page_of, sentence
from .pages import Pages
from .samples import LAG_WINDOW_SECONDS, HeadSamples, chart


class ConsumerPages:
    def __init__(self, pages: Pages, push: ConnectedDeliveries, samples: HeadSamples) -> None:
        self._pages = pages
        self._streams = pages.streams
        self._push = push
        self._samples = samples

    def routes(self) -> Routes:
        return {
            ("GET", "/consumers"): self._consumers_page,
            ("GET", "/consumers/confirm"): self._confirm_page,
            ("GET", "/consumer"): self._consumer_page,
            ("POST", "/consumers/drop"): self._drop,
            ("POST", "/consumers/seek"): self._seek,
        }

    async def _consumers_page(self, call: Call) -> ConsoleResponse:
        principal = call.principal
        counts = await self._pages.logs.consumer_counts(principal)
        wanted = call.query.get("stream", "")
        partitions = [
            p
            for info in self._streams
            if not wanted or info.name == wanted
            for p in info.partitions
            if counts.get(p.key)
        ]
        total = sum(counts[p.key] for p in partitions)
        page, pages = page_of(call.query, total)
        start = (page - 1) * PAGE_SIZE
        rows: list[dict[str, Any]] = []
        offset = 0
        for partition in partitions:
            count = counts[partition.key]
            if offset + count > start and len(rows) < PAGE_SIZE:
                skip = max(start - offset, 0)
                consumers = self._pages.log(partition).consumers
                listed = await consumers.first(principal, skip + PAGE_SIZE - len(rows))
                rows += await self._consumer_rows(
                    call, partition, listed[skip:], PAGE_SIZE - len(rows)
                )
            offset += count
        return self._pages.page(
            call.session,
            "consumers.html",
            rows=rows,
            page=page,
            pages=pages,
            total=total,
            stream=wanted,
            notice=await self._pages.notice(call),
            principal=principal,
        )

    async def _consumer_rows(
        self, call: Call, partition: Partition, listed: list[ConsumerRow], limit: int
    ) -> list[dict[str, Any]]:
        lowest = await self._pages.log(partition).consumers.lowest(call.principal)
        pushing = {s.key: s for s in self._push.all_streams if s.reliable}
        elsewhere = self._push.pushing_elsewhere()
        now = time.time()
        return [
            {
                "partition": partition,
                "row": row,
                "age": age(row.oldest_unread_ts, now),
                "push": pushing.get((partition.key, row.user_id, row.component)),
                "elsewhere": (partition.key, row.user_id, row.component) in elsewhere,
                "holds_back": lowest is not None
                and (lowest[1], lowest[2]) == (row.user_id, row.component),
            }
            for row in listed[:limit]
        ]

    async def _consumer_page(self, call: Call) -> ConsoleResponse:
        """A consumer's figures and its lag over the last hour (own, or managed)."""
        partition, row = await self._consumer(call, call.query)
        samples = self._samples
        lags = samples.lags((partition, row.user_id, row.component))
        shortest = 30 * samples.interval
        return self._pages.page(
            call.session,
            "consumer.html",
            partition=partition,
            row=row,
            age=age(row.oldest_unread_ts, time.time()),
            lag=chart(lags, 720, 180, time.time(), shortest, LAG_WINDOW_SECONDS, "events behind"),
            interval=samples.interval,
            principal=call.principal,
        )

    async def _confirm_page(self, call: Call) -> ConsoleResponse:
        action = call.query.get("action", "")
        if action not in ("drop", "seek"):
            raise PageError(400, "The action is drop or seek.")
        partition, row = await self._consumer(call, call.query)
        return self._pages.page(
            call.session,
            "confirm.html",
            action=action,
            partition=partition,
            row=row,
            principal=call.principal,
        )

    def _acted_on(self, call: Call, fields: Mapping[str, str]) -> tuple[Partition, str, str]:
        """The partition, user and component of the consumer a request names, once the
        caller may act on that user's consumers there: read for their own, manage for
        another's (refused the same whether that consumer exists or not)."""
        partition = self._pages.partition(call, fields)
        user, component = fields.get("user", ""), fields.get("component", "")
        who = call.principal
        if user != who.name and not self._streams.access.allows(
            who, Right.MANAGE, partition.stream
        ):
            raise AccessDenied(Right.MANAGE, partition.stream)
        return partition, user, component

    async def _consumer(
        self, call: Call, fields: Mapping[str, str]
    ) -> tuple[Partition, ConsumerRow]:
        """The consumer a request names, when the caller may act on it."""
        partition, user, component = self._acted_on(call, fields)
        row = await self._pages.log(partition).consumers.find(call.principal, user, component)
        if row is None:
            raise PageError(404, "No such consumer.")
        return partition, row

    async def _drop(self, call: Call) -> ConsoleResponse:
        partition, user, component = self._acted_on(call, call.form)
        consumers = self._pages.log(partition).consumers
        if not await consumers.drop(
            call.principal, user, component, reason="dropped in the console"
        ):
            raise PageError(404, "No such consumer.")
        notice = f"Dropped {user}/{component} of {partition}."
        return await self._pages.noticed(call, notice, "/consumers")

    async def _seek(self, call: Call) -> ConsoleResponse:
        partition, row = await self._consumer(call, call.form)
        events, who = self._pages.log(partition), call.principal
        at = call.form.get("time", "").strip()
        given = call.form.get("position", "").strip()
        if at:
            ts = iso_time(at)
            position = await events.id_before(who, ts) or 0
        elif (wanted := number_in(given, 18)) is not None:
            position = wanted
        else:
            raise PageError(400, "Give a position (an event id) or a time (UTC).")
        try:
            sought = await events.consumers.seek(who, row.user_id, row.component, position)
        except Refused as exc:  # the one seek refuses: a position past the head
            raise PageError(400, sentence(exc)) from None
        if not sought:
            raise PageError(404, "No such consumer.")
        notice = f"{row.user}/{row.component} of {partition} is at {position} now."
        return await self._pages.noticed(call, notice, "/consumers")
