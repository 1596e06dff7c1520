"""An eventsourcing ``DCBRecorder`` backed by a futoin-evt server (the DCB HTTP API).

``pip install 'futoin-evt[eventsourcing]'``, then::

    recorder = FutoinDCBRecorder("http://127.0.0.1:8480/", credentials="shop:s3cret")

With ``stream="NAME"`` it records in the stream ``NAME`` (of one partition) instead of
``events``.

Event data is ``bytes`` in eventsourcing; it is stored exactly, as opaque bytes. A failed
append condition raises eventsourcing's ``IntegrityError``, as its own recorders do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from eventsourcing.dcb.api import (
    DCBAppendCondition,
    DCBEvent,
    DCBQuery,
    DCBReadResponse,
    DCBRecorder,
    DCBSequencedEvent,
    DCBSubscription,
)
from eventsourcing.persistence import IntegrityError

from .client import AppendConditionFailed, DcbClient, Event, SequencedEvent, stream_path

#: How long one long poll of a subscription waits; also how soon it notices ``stop()``.
SUBSCRIPTION_POLL_SECONDS = 1.0


def _query(query: DCBQuery | None) -> dict[str, Any] | None:
    if query is None:
        return None
    return {"items": [{"types": list(i.types), "tags": list(i.tags)} for i in query.items]}


def _sequenced(event: SequencedEvent) -> DCBSequencedEvent:
    data = event.data if isinstance(event.data, bytes) else str(event.data).encode()
    return DCBSequencedEvent(DCBEvent(event.type, data, list(event.tags)), event.position)


class _ReadResponse(DCBReadResponse):
    def __init__(self, events: list[DCBSequencedEvent], head: int | None) -> None:
        self._events = iter(events)
        self._head = head

    @property
    def head(self) -> int | None:
        return self._head

    def __next__(self) -> DCBSequencedEvent:
        return next(self._events)


class FutoinDCBRecorder(DCBRecorder):
    def __init__(
        self, url: str, *, credentials: str, path: str = "/dcb/v1", stream: str | None = None
    ) -> None:
        self._url = url
        self._credentials = credentials
        self._path = stream_path(path, stream)
        self._client = DcbClient(url, credentials=credentials, path=self._path)

    def close(self) -> None:
        self._client.close()

    def read(
        self,
        query: DCBQuery | None = None,
        *,
        after: int | None = None,
        limit: int | None = None,
    ) -> DCBReadResponse:
        if limit == 0:
            return _ReadResponse([], None)
        result = self._client.read(_query(query), after=after, limit=limit)
        events = [_sequenced(e) for e in result.events]
        # With a limit that was reached, the head is the last event read (the read stopped
        # there); otherwise the store's newest position.
        head = events[-1].position if limit is not None and len(events) == limit else result.head
        return _ReadResponse(events, head or None)

    def append(
        self, events: Sequence[DCBEvent], condition: DCBAppendCondition | None = None
    ) -> int:
        wire_condition: dict[str, Any] | None = None
        if condition is not None:
            wire_condition = {"failIfEventsMatch": _query(condition.fail_if_events_match)}
            if condition.after is not None:
                wire_condition["after"] = condition.after
        try:
            return self._client.append(
                [Event(e.type, bytes(e.data), list(e.tags)) for e in events], wire_condition
            )
        except AppendConditionFailed as exc:
            raise IntegrityError(exc.message) from exc

    def subscribe(
        self, query: DCBQuery | None = None, *, after: int | None = None
    ) -> DCBSubscription[FutoinDCBRecorder]:
        return _Subscription(self, query, after)

    def _subscription_client(self) -> DcbClient:
        return DcbClient(self._url, credentials=self._credentials, path=self._path)


class _Subscription(DCBSubscription[FutoinDCBRecorder]):
    """Long polls on a connection of its own, so that the recorder stays free to append."""

    def __init__(
        self, recorder: FutoinDCBRecorder, query: DCBQuery | None, after: int | None
    ) -> None:
        super().__init__(recorder, query, after)
        self._client = recorder._subscription_client()
        self._buffered: Iterator[DCBSequencedEvent] = iter(())

    def stop(self) -> None:
        super().stop()
        self._client.close()

    def __next__(self) -> DCBSequencedEvent:
        while not self._has_been_stopped:
            event = next(self._buffered, None)
            if event is not None:
                self._last_position = event.position
                return event
            result = self._client.read(
                _query(self._query),
                after=self._last_position,
                limit=1000,
                wait=SUBSCRIPTION_POLL_SECONDS,
            )
            self._buffered = iter([_sequenced(e) for e in result.events])
        raise StopIteration
