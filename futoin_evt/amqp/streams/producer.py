""":class:`ProducerLink`: messages sent to a stream become its events, in the partition the
link is bound to, or where the target partition or the partition key of each message sends it
(read from the encoded message without decoding the rest)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from ...domain.stream import EventId
from ...log.errors import fault_of
from ...log.eventlog import EventLog
from ...quoting import quote_input
from ...stats import Calls
from ..codec import (
    BATCH_FORMAT,
    PARTITION_KEYS,
    BadMessage,
    batch_messages,
    message_to_event,
    partition_key,
)
from ..config import NodeLimits
from ..engine.conditions import (
    DECODE_ERROR,
    INTERNAL_ERROR,
    INVALID_FIELD,
    PRECONDITION_FAILED,
)
from ..engine.message import Message, decode_message
from ..engine.session import Delivery, Link
from ..engine.types import DecodeError, Described, Symbol, decode_value
from ..faults import AMQP_FAULTS
from ..links import link_answer
from ..quickdecode import quick_event
from ..table import ConnectionView
from .addressing import NODE

logger = logging.getLogger(__name__)

#: Delivery annotations: the partition a producer's message goes to, a consumer's came from.
TARGET_PARTITION: Final = Symbol("event-streams-target-partition")

_SECTION: Final = b"\x00\x53"
#: Header, delivery annotations, message annotations: the sections before the rest.
_LEADING_SECTIONS: Final = (0x70, 0x71, 0x72)


_HEADER: Final = b"\x00\x53\x70"
_DELIVERY_ANNOTATIONS: Final = b"\x00\x53\x71"
_MESSAGE_ANNOTATIONS: Final = b"\x00\x53\x72"


def _header_size(raw: bytes) -> int:
    """The size of the message's header section (some clients write one into every message), read
    without decoding it; 0 when there is none (or it is of a form left to the decoder)."""
    if raw[:3] != _HEADER or len(raw) < 5:
        return 0
    constructor = raw[3]
    if constructor == 0x45:  # list0
        return 4
    if constructor == 0xC0:  # list8: size, then count and items
        return 5 + raw[4]
    if constructor == 0xD0 and len(raw) >= 8:  # list32
        return 8 + int.from_bytes(raw[4:8], "big")
    return 0


def _routing(raw: bytes) -> tuple[str | None, str | None]:
    """The ``event-streams-target-partition`` delivery annotation and the partition key
    (message annotation) of an encoded message, when it has them."""
    start = _header_size(raw)
    if raw[start : start + 3] not in (_DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS):
        return None, None  # the common case: nothing to decode
    target = key = None
    view = memoryview(raw)[start:]
    while len(view) > 2 and view[:2].tobytes() == _SECTION and view[2] in _LEADING_SECTIONS:
        try:
            value, used = decode_value(view, 0)
        except DecodeError as exc:
            raise BadMessage(DECODE_ERROR, f"undecodable message: {exc}") from None
        view = view[used:]
        if not isinstance(value, Described) or not isinstance(value.value, Mapping):
            continue
        if value.descriptor == 0x71:
            target = value.value.get(TARGET_PARTITION, target)
        elif value.descriptor == 0x72 and any(name in value.value for name in PARTITION_KEYS):
            key = partition_key(value.value)
    if target is not None and not isinstance(target, str):
        raise BadMessage(INVALID_FIELD, "event-streams-target-partition must be a symbol")
    return target, key


def _message_key(message: Message) -> str | None:
    """The partition key of a batched message (when its batch has none of its own)."""
    return partition_key(message.annotations or {})


class ProducerLink:
    """Messages to the node become events; each is settled ``accepted`` once it is durable.

    A partition-bound link stores in its partition; a partition-agnostic one where its
    router sends each message (a batch whole to one partition). Credit is kept at the window
    less the messages still on their way to the store, so a producer only waits for credit
    when the store falls behind.
    """

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        events: EventLog,
        limits: NodeLimits,
        calls: Calls | None = None,
        *,
        router: Callable[[str | None, str | None], EventLog] | None = None,
        partition: int | None = 0,
    ):
        who = conn.principal
        assert who is not None, "the node table takes no such link without a user"
        self._conn = conn
        #: The user the link was attached as: it appends as them.
        self._who = who
        self._calls = calls if calls is not None else Calls("amqp")
        self._link = link
        self._events = events
        self._router = router
        self._partition = partition
        self._limits = limits
        self._in_store = 0
        self._closed = False
        link.accept(properties=link_answer(partition), max_message_size=limits.max_message_bytes)
        self._top_up()

    def on_flow(self) -> None:
        pass

    def on_writable(self) -> None:
        pass

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        pass

    def on_closed(self) -> asyncio.Future[None] | None:
        self._closed = True
        return None

    def on_delivery(self, delivery: Delivery) -> None:
        """A whole message (the engine detaches a link whose message is too large)."""
        started = time.perf_counter()
        try:
            future = self._append(delivery.payload, delivery.message_format == BATCH_FORMAT)
        except BadMessage as exc:
            delivery.reject(exc.condition, str(exc))
            self._count(exc.condition, started)
        except Exception as exc:  # a failure of the log: its kind says the condition
            fault = fault_of(exc)
            if fault is None:
                logger.exception("an append from AMQP failed")
            condition = INTERNAL_ERROR if fault is None else AMQP_FAULTS[fault]
            delivery.reject(condition, str(exc) if fault is not None else "internal error")
            self._count(condition, started)
        else:
            self._in_store += 1
            future.add_done_callback(lambda done: self._stored(delivery, done, started))
        self._top_up()

    def _append(self, raw: bytes, batch: bool) -> asyncio.Future[EventId]:
        """Every event of the message (of each message of a batch) queued for the store, or
        none when one of them cannot be an event."""
        target, key = _routing(raw)
        quick = None if batch else quick_event(raw)
        if quick is not None:
            events = [quick]
        elif batch:
            messages = batch_messages(raw)
            if key is None and target is None and self._router is not None:
                key = _message_key(messages[0])
            events = [message_to_event(message) for message in messages]
        else:
            try:
                message = decode_message(raw)
            except DecodeError as exc:
                raise BadMessage(DECODE_ERROR, f"undecodable message: {exc}") from None
            events = [message_to_event(message)]
        drafts = [event.draft() for event in events]
        keys = [e.key for e in events]
        destination = self._destination(target, key)
        if all(k is None for k in keys):
            return destination.append(self._who, drafts)
        return destination.append(self._who, drafts, keys=keys)

    def _destination(self, target: str | None, key: str | None) -> EventLog:
        if self._router is not None:
            return self._router(target, key)
        if target is not None and target != str(self._partition):
            raise BadMessage(
                PRECONDITION_FAILED,
                f"event-streams-target-partition {quote_input(target, 40)} on a link bound to"
                f" partition {self._partition}",
            )
        return self._events

    def _count(self, outcome: str, started: float) -> None:
        self._calls.observe(NODE, "send", outcome, time.perf_counter() - started)

    def _stored(self, delivery: Delivery, done: asyncio.Future[Any], started: float) -> None:
        self._in_store -= 1
        if self._closed:
            if not done.cancelled():
                done.exception()  # retrieved: nobody is left to tell
            return
        failed = None if done.cancelled() else done.exception()
        if done.cancelled() or failed is not None:
            fault = None if failed is None else fault_of(failed)
            condition = INTERNAL_ERROR if fault is None else AMQP_FAULTS[fault]
            delivery.reject(
                condition, "the event could not be stored" if fault is None else str(failed)
            )
            self._count(condition, started)
        else:
            delivery.accept()
            self._count("ok", started)
        self._top_up()
        self._conn.wake()

    def _top_up(self) -> None:
        if self._closed:
            return
        window = self._limits.credit_window
        room = window - self._link.credit - self._in_store
        if room >= window // 2 or (room > 0 and self._link.credit == 0):
            self._link.flow(room)
