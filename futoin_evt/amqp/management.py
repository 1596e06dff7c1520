"""Request/response nodes (AMQP management): ``$management`` with the Event Hubs READ operations
on the hub and its partition and the event notification's GET-EVENTS, and the base that
``$cbs`` shares.

A request arrives on a link to ``$management``, with ``operation: READ``, ``type`` (
``com.microsoft:eventhub`` or ``com.microsoft:partition``), ``name`` (a stream) and, for a
partition, ``partition`` in its application properties. ``operation: GET-EVENTS`` (with an
optional ``eventType``, and ``stream`` for a stream other than ``events``: 404 when there is
none) answers a map of event type to its attribute names. The reply goes out
on the peer's link from ``$management`` whose target is the request's ``reply-to`` (or its
only one), with ``status-code``/``status-description`` and the request's id as
``correlation-id``. Each answer about a stream needs the read right on it (and, with SAS
tokens, one whose scope covers ``NAME/$management``): without it the status is 401, as Event
Hubs answers, whether the stream exists or not.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

from ..domain.partition import DEFAULT_STREAM
from ..domain.rights import Right
from ..domain.stream import ts_to_ms
from ..log.access import Refused
from ..log.checkpoints import HubCheckpoints
from ..notify.live import UnknownStream
from ..quoting import quote_input
from . import checkpoints
from .codec import format_offset
from .engine.message import Message, decode_message
from .engine.session import Delivery, Link
from .engine.types import DecodeError, Timestamp
from .table import ConnectionView as Connection
from .table import Hubs

logger = logging.getLogger(__name__)

MANAGEMENT: Final = "$management"
HUB_TYPE: Final = "com.microsoft:eventhub"
PARTITION_TYPE: Final = "com.microsoft:partition"
GET_EVENTS: Final = "GET-EVENTS"
#: Replies kept for a peer that gives no credit for them; one more detaches the reply link.
MAX_QUEUED_REPLIES: Final = 64
#: A larger request detaches its link (a token or a READ is a few hundred bytes).
MAX_REQUEST_BYTES: Final = 64 * 1024
#: Requests a peer may send before it is answered; topped up once half is used.
REQUEST_CREDIT: Final = 16


#: GET-EVENTS: (stream or None for ``events``, event type or None) -> type -> attribute names.
EventTypes = Callable[[str | None, str | None], Awaitable[dict[str, list[str]]]]


class RequestReplyNode:
    """A node that answers requests: pairs each connection's request links with its reply
    links. Subclasses say what the answer to a request is."""

    def __init__(self) -> None:
        self._replies: dict[Connection, dict[str | None, ReplyLink]] = {}

    def attach(self, conn: Connection, link: Link) -> RequestLink | ReplyLink:
        if not link.is_sender:
            link.accept(max_message_size=MAX_REQUEST_BYTES)
            return RequestLink(conn, link, self)
        link.accept()
        target = link.remote_target
        address = target.address if target is not None else None
        reply = ReplyLink(conn, link, lambda: self._forget(conn, address))
        self._replies.setdefault(conn, {})[address] = reply
        return reply

    def _forget(self, conn: Connection, address: str | None) -> None:
        links = self._replies.get(conn, {})
        links.pop(address, None)
        if not links:
            self._replies.pop(conn, None)

    def reply_link(self, conn: Connection, reply_to: str | None) -> ReplyLink | None:
        links = self._replies.get(conn, {})
        if reply_to in links:
            return links[reply_to]
        return next(iter(links.values())) if len(links) == 1 else None

    async def answer(self, conn: Connection, request: Message) -> tuple[int, str, Any]:
        """(status code, description, body) for one request."""
        raise NotImplementedError


class ManagementNode(RequestReplyNode):
    """``$management``: READ of a stream (an event hub) and of its partitions, GET-EVENTS, and
    the Event Hubs checkpoint store's calls."""

    def __init__(
        self,
        hubs: Hubs,
        event_types: EventTypes | None = None,
        checkpoints: HubCheckpoints | None = None,
    ) -> None:
        """``event_types(stream, event_type)``: GET-EVENTS (None: not served)."""
        super().__init__()
        self._hubs = hubs
        self._event_types = event_types
        #: The Event Hubs checkpoint store (:mod:`.checkpoints`), when served.
        self._checkpoints = checkpoints

    async def answer(self, conn: Connection, request: Message) -> tuple[int, str, Any]:
        properties: dict[str, Any] = dict(request.properties or {})
        if properties.get("operation") == GET_EVENTS:
            stream = properties.get("stream")
            refused = _refused(conn, DEFAULT_STREAM if stream is None else stream)
            if refused is not None:
                return refused
            return await self._get_events(properties.get("eventType"), stream)
        if properties.get("operation") != "READ":
            return 400, f"unsupported operation: {quote_input(properties.get('operation'))}", None
        hub = properties.get("name")
        refused = _refused(conn, hub)
        if refused is not None:
            return refused
        logs = self._hubs.partitions(hub) if isinstance(hub, str) else None
        if logs is None:
            return 404, f"no such event hub: {quote_input(hub)}", None
        kind = properties.get("type")
        if isinstance(kind, str) and kind.startswith(checkpoints.PREFIX):
            if self._checkpoints is None or conn.principal is None:
                return 501, "the checkpoint store is not served here", None
            return await checkpoints.answer(
                self._checkpoints, conn.principal, len(logs), kind, properties, request.body
            )
        who = conn.principal
        assert who is not None, "the node table takes no $management link without a user"
        if kind == HUB_TYPE:
            bounds = await logs[0].bounds(who)
            return 200, "OK", {
                "name": hub,
                "type": HUB_TYPE,
                "created_at": Timestamp(ts_to_ms(bounds.first_ts) if bounds.first_ts else 0),
                "partition_count": len(logs),
                "partition_ids": [str(number) for number in range(len(logs))],
            }  # fmt: skip
        if kind != PARTITION_TYPE:
            return 400, f"unsupported type: {quote_input(kind)}", None
        partition = properties.get("partition")
        ids = [str(number) for number in range(len(logs))]
        if partition not in ids:
            return 404, f"no such partition: {quote_input(partition)}", None
        bounds = await logs[ids.index(partition)].bounds(who)
        last_id = bounds.last_id or 0
        return 200, "OK", {
            "name": hub,
            "type": PARTITION_TYPE,
            "partition": partition,
            "begin_sequence_number": bounds.first_id or 0,
            "last_enqueued_sequence_number": last_id,
            "last_enqueued_offset": format_offset(last_id) if last_id else "-1",
            "last_enqueued_time_utc": Timestamp(ts_to_ms(bounds.last_ts) if bounds.last_ts else 0),
            "is_partition_empty": bounds.events == 0,
        }  # fmt: skip

    async def _get_events(self, event_type: Any, stream: Any) -> tuple[int, str, Any]:
        """GET-EVENTS: event type -> its attribute names (all types, or ``eventType``)."""
        if self._event_types is None:
            return 501, "event notification is not served here", None
        if event_type is not None and not isinstance(event_type, str):
            return 400, "eventType must be a string", None
        if stream is not None and not isinstance(stream, str):
            return 400, "stream must be a string", None
        try:
            return 200, "OK", await self._event_types(stream, event_type)
        except UnknownStream as exc:
            return 404, str(exc), None


def _refused(conn: Connection, stream: Any) -> tuple[int, str, Any] | None:
    """401 (what the Event Hubs SDKs take for an authorization error) when the connection
    may not read ``stream``, or its tokens do not cover ``NAME/$management``; asked
    before anything tells whether the stream exists. None for a name that is no string
    (the request's own answer says it is wrong)."""
    if not isinstance(stream, str):
        return None
    reason = conn.refusal(Right.READ, stream, (f"{stream}/{MANAGEMENT}",))
    return None if reason is None else (401, reason, None)


class RequestLink:
    """Requests to a request/response node: each is settled (accepted) with its answer, in
    the same batch of frames and after it, and credit is topped up once half is used. A
    client that reads one frame at a time (the Event Hubs SDK opens a connection for each
    management request and sleeps 50 ms for each frame it reads until its token is
    answered) then waits for two frames fewer."""

    def __init__(self, conn: Connection, link: Link, node: RequestReplyNode) -> None:
        self._conn = conn
        self._link = link
        self._node = node
        self._answering: set[asyncio.Task[None]] = set()
        link.flow(REQUEST_CREDIT)

    def on_delivery(self, delivery: Delivery) -> None:
        """A whole request (the engine detaches a link whose request is too large)."""
        try:
            request = decode_message(delivery.payload)
        except DecodeError as exc:
            delivery.reject("amqp:decode-error", str(exc))
        else:
            task = asyncio.ensure_future(self._answer(delivery, request))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        link = self._link
        if link.credit <= REQUEST_CREDIT // 2:
            link.flow(REQUEST_CREDIT - link.credit)

    async def _answer(self, delivery: Delivery, request: Message) -> None:
        try:
            status, description, body = await self._node.answer(self._conn, request)
        except Refused as exc:  # a right checked in log/
            status, description, body = 401, str(exc), None
        except Exception:
            logger.exception("a request to %s failed", self._link.name)
            delivery.reject("amqp:internal-error", "the request could not be answered")
            self._conn.wake()
            return
        reply = Message(
            correlation_id=request.id,
            body=body,
            address=request.reply_to,
            # statusDescription too: the Event Hubs SDK reads that name
            properties={
                "status-code": status,
                "status-description": description,
                "statusDescription": description,
            },
        )
        delivery.accept()
        target = self._node.reply_link(self._conn, request.reply_to)
        if target is None:
            logger.info("no link to reply to %r", request.reply_to)
        else:
            target.send(reply.encode())
        self._conn.wake()  # the reply's transfer first, then the accept (the batch's last)

    def on_flow(self) -> None:
        pass

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        pass

    def on_writable(self) -> None:
        pass

    def on_closed(self) -> asyncio.Future[None] | None:
        for task in self._answering:
            task.cancel()
        return None


class ReplyLink:
    """Replies from a request/response node, sent as the peer gives credit (settled on sending)."""

    def __init__(self, conn: Connection, link: Link, forget: Any) -> None:
        self._conn = conn
        self._link = link
        self._forget = forget
        self._queue: deque[bytes] = deque()
        self._sent = 0

    def send(self, encoded: bytes) -> None:
        if len(self._queue) >= MAX_QUEUED_REPLIES:
            self._conn.detach(
                self._link, "amqp:resource-limit-exceeded", "replies are not being taken"
            )
            return
        self._queue.append(encoded)
        self.on_flow()

    def on_flow(self) -> None:
        link = self._link
        while link.credit > 0 and self._queue:
            self._sent += 1
            link.send(self._queue.popleft(), str(self._sent).encode(), settled=True)
        self._conn.wake()

    def on_delivery(self, delivery: Delivery) -> None:
        pass

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        pass

    def on_writable(self) -> None:
        pass

    def on_closed(self) -> asyncio.Future[None] | None:
        self._forget()
        return None
