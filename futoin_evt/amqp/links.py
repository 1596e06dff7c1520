"""What the links the nodes send on share: :class:`SourceLink`, a task that sends as credit
allows (and knows where a start position's time puts a reader), and the properties our end
of a link answers with."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from ..log.access import Refused
from ..log.eventlog import DamagedEvent, EventLog
from .codec import Position
from .engine.conditions import INTERNAL_ERROR, UNAUTHORIZED
from .engine.session import Delivery, Link
from .engine.types import Symbol
from .table import ConnectionView

logger = logging.getLogger(__name__)

PARTITION_PROPERTY: Final = Symbol("event-streams-partition")


def link_answer(
    partition: int | None, properties: Mapping[Any, Any] | None = None
) -> dict[Any, Any]:
    """The properties our end of a link has: the partition it is bound to, if any, and
    ``properties``."""
    bound = {PARTITION_PROPERTY: Symbol(str(partition))} if partition is not None else {}
    return {**bound, **(properties or {})}


class SourceLink:
    """A link the node sends on: a task that waits for credit and something to send."""

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        events: EventLog,
        properties: Mapping[Any, Any] | None = None,
        partition: int | None = None,
        *,
        source: Any = None,
        unsettled: dict[bytes, Any] | None = None,
        incomplete_unsettled: bool = False,
    ) -> None:
        """``source``: our terminus (None: the peer's); ``unsettled``: our unsettled map
        (AMQP 2.6.13), when the link resumes a kept one."""
        who = conn.principal
        assert who is not None, "the node table takes no such link without a user"
        self._conn = conn
        self._link = link
        self._events = events
        #: The user the link was attached as: it reads as them.
        self._who = who
        self._wake = asyncio.Event()
        self._closed = False
        remote = link.remote_source
        if source is None and remote is not None and remote.durable:
            source = replace(remote, durable=0)  # nothing of it is kept
        link.accept(
            source=source,
            properties=link_answer(partition, properties),
            unsettled=unsettled,
            incomplete_unsettled=incomplete_unsettled,
        )
        self._task = asyncio.ensure_future(self._run())
        self._task.add_done_callback(self._finished)

    async def _run(self) -> None:
        raise NotImplementedError

    def _finished(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        if isinstance(exc, Refused):  # the right went before the link was detached for it
            self._conn.detach(self._link, UNAUTHORIZED, str(exc))
        elif isinstance(exc, DamagedEvent):  # logged once per event by the store
            self._conn.detach(self._link, INTERNAL_ERROR, str(exc))
        elif exc is not None:
            logger.error("AMQP link failed", exc_info=exc)
            self._conn.detach(self._link, INTERNAL_ERROR, "the server could not read events")

    def _send(self, encoded: bytes | list[bytes], tag: str) -> bool:
        """Send one message; True when it is settled already (the peer asked for that)."""
        return self._link.send(encoded, tag.encode()).settled

    def on_flow(self) -> None:
        self._wake.set()

    def on_writable(self) -> None:
        self._wake.set()

    def on_delivery(self, delivery: Delivery) -> None:
        pass  # the engine refuses transfers on a link the peer receives on

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        pass  # the engine settles what the consumer settled

    def on_closed(self) -> asyncio.Future[None] | None:
        self._closed = True
        self._task.cancel()
        return None

    async def _after_time(self, events: EventLog, start: Position, after: int) -> int:
        """``after``, moved past the events older than the start's time, if it has one."""
        if start.after_ms is not None:
            after = max(after, await events.id_before_ms(self._who, start.after_ms))
        return after
