"""Event notification over FTN3: subscribe with a selector and a transformation, and take the
messages the server pushes back (``futoin.evt.notify.receiver:1.0:onNotify``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from .aio import FTN3Client

NOTIFY: Final = "futoin.evt.notify:1.0"
RECEIVER: Final = "futoin.evt.notify.receiver"


class Subscribed(asyncio.Queue[dict[str, Any]]):
    """The messages of one subscription, in order."""

    def __init__(self, sid: str) -> None:
        super().__init__()
        self.sid = sid


class Notifications:
    """The subscriptions of one connection; each delivers into its own queue of messages
    (``{subject, properties, body}`` as the transformation left them)."""

    def __init__(self, ftn3: FTN3Client) -> None:
        self.ftn3 = ftn3
        self._queues: dict[str, Subscribed] = {}
        ftn3.on_request(RECEIVER, "onNotify", self._on_notify)

    async def subscribe(
        self,
        selector: str | None = None,
        requested: Sequence[str] | None = None,
        *,
        compact: bool = False,
        after: int | str | Sequence[int] | None = None,
        stream: str | None = None,
    ) -> Subscribed:
        """``stream``: every partition of that stream (None: ``events``); ``after``: start
        after this id, or after these ids, one per partition (a list, or the text
        ``"12,0,7,3"``), instead of at the newest."""
        params: dict[str, Any] = {}
        if stream is not None:
            params["stream"] = stream
        if selector is not None:
            params["selector"] = selector
        if requested is not None:
            params["transformation"] = {"requestedAttributes": list(requested), "compact": compact}
        if isinstance(after, int | str):
            params["after"] = str(after)
        elif after is not None:
            params["after"] = ",".join(str(position) for position in after)
        sid = str(await self.ftn3.call(NOTIFY, "subscribe", params))
        queue = self._queues[sid] = Subscribed(sid)
        return queue

    async def unsubscribe(self, subscribed: Subscribed) -> bool:
        self._queues.pop(subscribed.sid, None)
        return bool(await self.ftn3.call(NOTIFY, "unsubscribe", {"sid": subscribed.sid}))

    async def event_types(
        self, event_type: str | None = None, *, stream: str | None = None
    ) -> dict[str, list[str]]:
        """GET-EVENTS: event type -> attribute names (of ``stream``; None: ``events``)."""
        params = {"event_type": event_type} if event_type is not None else {}
        if stream is not None:
            params["stream"] = stream
        result: dict[str, list[str]] = await self.ftn3.call(NOTIFY, "getEvents", params)
        return result

    async def _on_notify(self, params: dict[str, Any]) -> bool:
        queue = self._queues.get(params["sid"])
        if queue is not None:
            for message in params["messages"]:
                queue.put_nowait(message)
        return True
