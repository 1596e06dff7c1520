"""Reading events: a partition's events from an id or a time (keys are not searchable: they
serve duplicate checks only) or of some types, one event's page, and DCB queries."""

from __future__ import annotations

import json
from typing import Any, Final

from ..dcb.model import parse_query
from ..dcb.service import DcbService, ReadRequest
from ..domain.dcb import DcbInputError
from ..domain.stream import StoredEvent
from .exchange import Call, ConsoleResponse, PageError, Routes
from .formatting import iso_time, number_in, shorten, words
from .pages import Pages

#: Events shown per page of the event browser and the DCB query.
EVENTS_PER_PAGE: Final = 50


class EventPages:
    def __init__(self, pages: Pages) -> None:
        self._pages = pages

    def routes(self) -> Routes:
        return {
            ("GET", "/events"): self._events_page,
            ("GET", "/event"): self._event_page,
            ("GET", "/dcb"): self._dcb_page,
        }

    async def _events_page(self, call: Call) -> ConsoleResponse:
        query = call.query
        partition = self._pages.partition(call, query)
        events, who = self._pages.log(partition), call.principal
        after, message = 0, ""
        from_id, at = query.get("id", "").strip(), query.get("time", "").strip()
        if at:
            try:
                after = await events.id_before(who, iso_time(at)) or 0
            except PageError as exc:
                message = exc.message
        elif from_id:
            first = number_in(from_id, 18)
            if first is None:
                message = "An event id is a positive number."
            else:
                after = max(first - 1, 0)
        until, last_ts = query.get("to", "").strip(), None
        if until and not message:
            try:
                last_ts = iso_time(until)
            except PageError as exc:
                message = exc.message
            if last_ts is not None and at and iso_time(at) > last_ts:
                message = "The time range ends before it starts."
        types = words(query.get("type", ""))
        rows: list[StoredEvent] = []
        if types and not message:  # the store reads those types only
            events.guard.read(who)
            rows, _ = await events.read_of_types(after, EVENTS_PER_PAGE, types)
        elif not message:
            rows = await events.read_after(who, after, EVENTS_PER_PAGE)
        full = len(rows) == EVENTS_PER_PAGE
        if last_ts is not None:  # stored times are in id order, to the second
            within = [r for r in rows if r.ts <= last_ts]
            full = full and len(within) == len(rows)
            rows = within
        shown = [
            {"id": r.id, "type": r.type, "data": shorten(r.data_json), "ts": r.ts} for r in rows
        ]
        return self._pages.page(
            call.session,
            "events.html",
            partition=partition,
            events=shown,
            id=from_id,
            time=at,
            to=until,
            type=query.get("type", ""),
            message=message,
            next_id=rows[-1].id + 1 if full and rows else None,
            principal=call.principal,
        )

    async def _event_page(self, call: Call) -> ConsoleResponse:
        partition = self._pages.partition(call, call.query)
        wanted = number_in(call.query.get("id", ""), 18)
        if wanted is None or wanted == 0:
            raise PageError(400, "An event id is a positive number.")
        rows = await self._pages.log(partition).read_after(call.principal, wanted - 1, 1)
        if not rows or rows[0].id != wanted:
            raise PageError(404, f"No event {wanted} in {partition} (never added, or discarded).")
        event = rows[0]
        try:
            pretty = json.dumps(json.loads(event.data_json), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = event.data_json
        return self._pages.page(
            call.session,
            "event.html",
            partition=partition,
            event=event,
            pretty=pretty,
            size=len(event.data_json.encode()),
            notice=await self._pages.notice(call),
            principal=call.principal,
        )

    async def _dcb_page(self, call: Call) -> ConsoleResponse:
        query = call.query
        partition = self._pages.partition(call, query)
        types = words(query.get("types", ""))
        tags = words(query.get("tags", ""))
        after_text = query.get("after", "").strip()
        backwards = query.get("backwards") == "1"
        events: list[dict[str, Any]] = []
        message, head = "", None
        if query.get("run"):
            try:
                items = [{"types": types, "tags": tags}] if types or tags else []
                after = number_in(after_text, 18)
                if after_text and after is None:
                    raise DcbInputError("after", "a position is a number")
                read = await DcbService(self._pages.log(partition)).read(
                    call.principal,
                    ReadRequest(
                        parse_query({"items": items}),
                        after=after,
                        limit=EVENTS_PER_PAGE,
                        backwards=backwards,
                    ),
                )
                head = read.head
                async for page in read.pages():
                    events += [
                        {
                            "position": e.position,
                            "type": e.type,
                            "tags": ", ".join(e.tags),
                            "data": shorten(e.data_json),
                            "ts": e.ts,
                        }
                        for e in page
                    ]
            except DcbInputError as exc:
                message = f"{exc.field}: {exc.message}."
        return self._pages.page(
            call.session,
            "dcb.html",
            partition=partition,
            types=query.get("types", ""),
            tags=query.get("tags", ""),
            after=after_text,
            backwards=backwards,
            events=events,
            head=head,
            message=message,
            ran=bool(query.get("run")),
            principal=call.principal,
        )
