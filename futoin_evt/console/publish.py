"""Publishing an event through its partition's log (write), as FTN18's addEvent adds it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

from ..domain.rights import Right
from ..domain.stream import EventDraft, EventRejected
from ..log.eventlog import NotWritable
from .exchange import Call, ConsoleResponse, Routes, redirect
from .formatting import said
from .pages import Pages


class PublishPages:
    def __init__(self, pages: Pages) -> None:
        self._pages = pages

    def routes(self) -> Routes:
        return {
            ("GET", "/publish"): self._publish_page,
            ("POST", "/publish"): self._publish,
        }

    async def _publish_page(self, call: Call) -> ConsoleResponse:
        query = call.query
        return self._publish_form(
            call, 200, query.get("stream"), query.get("partition", "0"), {}, None
        )

    def _publish_form(
        self,
        call: Call,
        status: int,
        stream: str | None,
        partition: str,
        values: Mapping[str, str],
        message: str | None,
    ) -> ConsoleResponse:
        """The publish form (``values``: as it was filled in), over the streams the caller
        may write to."""
        streams = self._pages.streams
        who, access = call.principal, streams.access
        writable = [info.name for info in streams if access.allows(who, Right.WRITE, info.name)]
        return self._pages.page(
            call.session,
            "publish.html",
            status=status,
            writable=writable,
            stream=stream or (writable[0] if writable else ""),
            partition=partition,
            typed=self._pages.typed(writable),
            values=values,
            message=message,
            principal=who,
        )

    async def _publish(self, call: Call) -> ConsoleResponse:
        """One event, as FTN18's addEvent adds it (its type's schema, the key's dedup)."""
        form = call.form
        event_type = form.get("type", "").strip()
        key = form.get("key", "").strip() or None
        try:
            data = json.loads(form.get("data", "") or "null")
        except ValueError as exc:
            return await self._publish_refused(call, f"The data is not JSON: {exc}.")
        pages = self._pages
        partition = pages.partition(call, form, Right.WRITE)
        try:
            event_id = await pages.log(partition).append(
                call.principal,
                (EventDraft(event_type, data),),
                keys=None if key is None else (key,),
            )
        except (EventRejected, NotWritable) as exc:
            return await self._publish_refused(call, said(exc))
        assert call.session is not None
        await pages.sessions.set_notice(call.session, f"Published event {event_id} to {partition}.")
        where = f"stream={quote(partition.stream, safe='')}&partition={partition.number}"
        return redirect(f"{pages.base}/event?{where}&id={event_id}")

    async def _publish_refused(self, call: Call, message: str) -> ConsoleResponse:
        """The publish form again, as it was filled in, with why it was refused."""
        form = call.form
        return self._publish_form(
            call, 400, form.get("stream"), form.get("partition", "0"), form, message
        )
