"""Domain names and rules of the event stream, shared by services, storage and clients."""

from __future__ import annotations

import calendar
import functools
import math
import re
import time
from typing import Any, Final, NamedTuple, NewType

from ..ftn3.messages import DEFAULT_MESSAGE_LIMIT, encode_json
from ..quoting import quote_input
from .attrs import EventAttrs, attrs_json
from .rejections import BadInput as BadInput
from .rejections import EventRejected as EventRejected

EventId = NewType("EventId", int)
Component = NewType("Component", str)
UserId = NewType("UserId", int)

LIVE_COMPONENT: Final = Component("LIVE")
MAX_EVENTS_PER_CALL: Final = 1000
EVENT_TYPE_RE: Final = re.compile(r"^[A-Z_]{1,16}\Z")
#: The rules of the names a user types, one sentence each: every door's refusal and the
#: command line's check say them (FTN18's EventType, futoin.evt.gen 1.2's EventKey,
#: ConsumerComponent, and a stream's name).
EVENT_TYPE_RULE: Final = (
    "an event type is 1 to 16 characters of A-Z and _ (no digits, no lower case), e.g. ORDER_PLACED"
)
EVENT_KEY_RULE: Final = (
    "an event key is 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-', e.g. order-1042"
)
COMPONENT_RULE: Final = (
    "a consumer component is 1 to 16 characters of A-Z, a-z, 0-9 and _, e.g. BILLING"
)
STREAM_NAME_RULE: Final = (
    "a stream name is 1 to 48 characters of a-z, 0-9, _ and -, starting with a letter or digit,"
    " e.g. orders"
)
#: A producer's key of an event (``futoin.evt.gen`` 1.2 ``addEvent``): within the dedup
#: window of the partition, an append with a key already stored stores nothing and answers
#: the first event's id.
EVENT_KEY_RE: Final = re.compile(r"^[A-Za-z0-9._:-]{1,64}\Z")
#: Seconds a key is remembered by default (``serve --dedup-window``; 0: keys are ignored).
DEFAULT_DEDUP_WINDOW: Final = 120.0

#: Room in a 64 KiB message for an event's id, type, ts and the reply envelope around it.
_EVENT_ENVELOPE_BYTES: Final = 256
#: Largest encoded event data: every stored event fits one 64 KiB pollEvents/onEvents reply.
MAX_EVENT_DATA_BYTES: Final = DEFAULT_MESSAGE_LIMIT - _EVENT_ENVELOPE_BYTES


#: Event types seen valid, so that a stream's few types are matched once each (bounded).
_valid_types: set[str] = set()
_VALID_TYPES_KEPT: Final = 1024


def _check_type(event_type: str) -> None:
    if type(event_type) is not str or event_type not in _valid_types:
        check_event_type(event_type)
        if len(_valid_types) < _VALID_TYPES_KEPT:
            _valid_types.add(event_type)


def encode_event_data(event_type: str, data: Any) -> str:
    """Check an event and return its data as the JSON text that is stored and sent as is."""
    _check_type(event_type)
    try:
        text = encode_json(data)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EventRejected(f"event data is not JSON: {exc}") from None
    if len(text) > MAX_EVENT_DATA_BYTES // 4 and len(text.encode()) > MAX_EVENT_DATA_BYTES:
        raise EventRejected(f"event data exceeds {MAX_EVENT_DATA_BYTES} bytes")
    return text


class OpaqueData(dict[str, str]):
    """Opaque bytes as data, ``{"$binary": "<base64>"}``, whose compact JSON text the door
    built with it (the draft's ``text``): stored as that text, not encoded again."""


class EventDraft(NamedTuple):
    """An event as a door parsed it from its wire: :meth:`~futoin_evt.log.eventlog.EventLog.append`
    checks and encodes it (:func:`stored_form`)."""

    type: str
    #: The data, a JSON value (opaque bytes as ``{"$binary": ...}``).
    data: Any
    #: An AMQP ``data`` section's content type (``""`` for none); None for any other event.
    content_type: str | None = None
    #: The data's JSON text as the producer sent it (one line), stored as it is so the same
    #: bytes go back out; None: the data is encoded here.
    text: str | None = None
    #: Its partition key and properties (:mod:`.attrs`), when it has them.
    attrs: EventAttrs | None = None


#: An event as it is stored: type, data JSON, content type, attributes' JSON (:mod:`.attrs`).
StoredForm = tuple[str, str, str | None, str | None]


def stored_form(draft: EventDraft) -> StoredForm:
    """(type, data JSON, content type, attributes' JSON) to store, the rules checked; raises
    :class:`EventRejected`. The producer's own JSON text is kept when it fits, the data itself
    checked as any event's is. The attributes count toward the event's size with its data:
    both together fit :data:`MAX_EVENT_DATA_BYTES`."""
    text = draft.text
    if text is not None and type(draft.data) is OpaqueData:
        _check_type(draft.type)
        if len(text) > MAX_EVENT_DATA_BYTES:  # ASCII: characters are bytes
            raise EventRejected(f"event data exceeds {MAX_EVENT_DATA_BYTES} bytes")
        data_json = text
    else:
        data_json = encode_event_data(draft.type, draft.data)
        if text is not None and (
            len(text) <= MAX_EVENT_DATA_BYTES // 4 or len(text.encode()) <= MAX_EVENT_DATA_BYTES
        ):
            data_json = text
    attrs = None if draft.attrs is None else attrs_json(draft.attrs)
    if attrs is not None and len(data_json) + len(attrs) > MAX_EVENT_DATA_BYTES // 4:
        size = len(data_json.encode()) + len(attrs.encode())
        if size > MAX_EVENT_DATA_BYTES:
            raise EventRejected(
                f"event data and attributes together exceed {MAX_EVENT_DATA_BYTES} bytes"
            )
    return draft.type, data_json, draft.content_type, attrs


def check_event_type(event_type: Any) -> str:
    """``event_type`` when it is one (see :data:`EVENT_TYPE_RE`); EventRejected else."""
    if not isinstance(event_type, str) or EVENT_TYPE_RE.match(event_type) is None:
        raise EventRejected(f"invalid event type {quote_input(event_type, 40)}: {EVENT_TYPE_RULE}")
    return event_type


@functools.lru_cache(maxsize=1024)
def is_ftn18_type(event_type: str) -> bool:
    """An event type FTN18 consumers see (other doors store other types, e.g. DCB's); asked
    for every event committed: types repeat."""
    return EVENT_TYPE_RE.match(event_type) is not None


def check_event_key(key: Any) -> str:
    """``key`` when it is one (see :data:`EVENT_KEY_RE`); EventRejected else."""
    if not isinstance(key, str) or EVENT_KEY_RE.match(key) is None:
        raise EventRejected(f"invalid event key {quote_input(key, 70)}: {EVENT_KEY_RULE}")
    return key


def utc_timestamp(epoch_seconds: float | None = None) -> str:
    """An FTN18 EventTimestamp: ``YYYY-MM-DDTHH:MM:SSZ``."""
    global _last_timestamp
    second = math.floor(time.time() if epoch_seconds is None else epoch_seconds)
    last = _last_timestamp  # one tuple, read and replaced whole: safe across threads
    if last[0] == second:
        return last[1]
    text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    _last_timestamp = (second, text)
    return text


#: The last second formatted (a group commit, and every event in it, asks for the current one).
_last_timestamp: tuple[int, str] = (-1, "")


def event_json(event_id: int, event_type: str, data_json: str, ts: str) -> str:
    """One FTN18 Event as JSON text, with the stored data spliced in without re-encoding."""
    return f'{{"id":"{event_id}","type":"{event_type}","data":{data_json},"ts":"{ts}"}}'


#: FTN18's ConsumerComponent (futoin.evt.types): what a registered consumer may be called.
COMPONENT_RE: Final = re.compile(r"^[A-Za-z0-9_]{1,16}\Z")


#: What an FTN3 parameter of each of these types must be, as said when a call's value is not one
#: (see :class:`futoin_evt.ftn3.ifaces.IfaceRegistry`); a list of them is explained by its items.
PARAM_TYPE_RULES: Final = {
    "EventType": EVENT_TYPE_RULE,
    "EventKey": EVENT_KEY_RULE,
    "ConsumerComponent": COMPONENT_RULE,
    "StreamName": STREAM_NAME_RULE,
}


def is_registrable(component: str) -> bool:
    """A name a reliable consumer can be registered under (LIVE is not one)."""
    return COMPONENT_RE.match(component) is not None and component != LIVE_COMPONENT


def check_component(component: Any) -> str:
    """``component`` when a consumer may be called so (LIVE included); ValueError else."""
    if not isinstance(component, str) or COMPONENT_RE.match(component) is None:
        raise ValueError(
            f"invalid consumer component {quote_input(component, 40)}: {COMPONENT_RULE}"
        )
    return component


class StoredEvent(NamedTuple):
    """One stored event: a tuple, made from a store row in one call (readers make one per
    event, so this matters on the hot paths)."""

    id: EventId
    type: str
    #: The event data as the JSON text it is stored as.
    data_json: str
    #: ``YYYY-MM-DDTHH:MM:SSZ`` (when it was added).
    ts: str
    #: The content type of the AMQP ``data`` section the event came as (``""`` for none);
    #: None when it came otherwise.
    content_type: str | None = None
    #: Its partition key and properties as stored (:func:`.attrs.parse_attrs` reads them);
    #: None when it has none.
    attrs_json: str | None = None

    @property
    def timestamp_ms(self) -> int:
        return ts_to_ms(self.ts)


@functools.lru_cache(maxsize=256)
def ts_to_ms(ts: str) -> int:
    """An FTN18 timestamp as milliseconds since the epoch."""
    return calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")) * 1000
