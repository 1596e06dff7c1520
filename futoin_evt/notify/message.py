"""How a notification (:mod:`futoin_evt.domain.notification`) is read and sent: its
attributes by name, the transformation a subscriber asks for, the real message.

A dotted name (``order.total``) reaches into nested objects; a field whose own name holds
the dot wins over the walk. No I/O here: every door shapes the result into its own messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from ..domain.notification import (
    BASE_ATTRIBUTES,
    EVENT_TYPE,
    ID,
    PARTITION,
    SCALARS,
    STREAM,
    TS,
    Notification,
    Value,
)
from ..quoting import quote_input

Getter = Callable[[Notification], Value]

#: Encoded forms kept with one notification (a door and a transformation each); more are
#: encoded each time, so many different transformations hold no more memory.
MAX_FORMS: Final = 8
#: The most attributes a transformation may ask for, and the longest name.
MAX_REQUESTED: Final = 256
MAX_NAME_CHARS: Final = 256


class NotifyError(ValueError):
    """A selector or transformation that cannot be used; the message says why (and where)."""


@functools.lru_cache(maxsize=4096)
def getter(name: str) -> Getter:
    """How to read attribute ``name`` of a notification (NULL when it has none)."""
    if name == EVENT_TYPE:
        return _event_type
    if name == ID:
        return _id
    if name == TS:
        return _ts
    if name == STREAM:
        return _stream
    if name == PARTITION:
        return _partition
    path = tuple(name.split("."))

    def read_field(notification: Notification) -> Value:
        data = notification.data
        if type(data) is not dict:
            return None
        value = data.get(name)
        if value is None and len(path) > 1 and name not in data:
            value = data
            for part in path:
                if type(value) is not dict:
                    return None
                value = value.get(part)
        return value if value is None or type(value) in SCALARS else None

    return read_field


def _event_type(notification: Notification) -> Value:
    return notification.type


def _id(notification: Notification) -> Value:
    return notification.id


def _ts(notification: Notification) -> Value:
    return notification.ts


def _stream(notification: Notification) -> Value:
    return notification.stream


def _partition(notification: Notification) -> Value:
    return notification.partition


_T = TypeVar("_T")


def encoded(
    notification: Notification,
    key: tuple[str, Transformation | None],
    encode: Callable[[Notification, Transformation | None], _T],
) -> _T:
    """``encode(notification, transformation)`` for ``key`` (a door's name and the
    transformation), made once and shared by every subscriber that sends the same shape."""
    forms = notification.forms
    form: _T | None = forms.get(key)
    if form is None:
        form = encode(notification, key[1])
        if len(forms) < MAX_FORMS:
            forms[key] = form
    return form


@dataclass(frozen=True, slots=True)
class Transformation:
    """``{requestedAttributes: [names], compact: bool}`` (the seed's notification
    transformation): only the requested attributes, or with ``compact`` their values alone,
    in the requested order, NULL for those missing."""

    requested: tuple[str, ...]
    compact: bool = False
    _getters: tuple[Getter, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "_getters", tuple(getter(name) for name in self.requested))

    @classmethod
    def parse(cls, spec: object) -> Transformation:
        """From its map form; raises :class:`NotifyError` naming what is wrong."""
        if not isinstance(spec, Mapping):
            raise NotifyError("a transformation is a map: {requestedAttributes, compact}")
        unknown = [str(k) for k in spec if str(k) not in ("requestedAttributes", "compact")]
        if unknown:
            raise NotifyError(f"unknown transformation entry: {quote_input(unknown[0])}")
        names = spec.get("requestedAttributes")
        if not isinstance(names, list | tuple) or not names:
            raise NotifyError("requestedAttributes must be a non-empty list of attribute names")
        if len(names) > MAX_REQUESTED:
            raise NotifyError(f"at most {MAX_REQUESTED} requestedAttributes")
        for name in names:
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
                raise NotifyError(
                    f"each requested attribute is a name of 1-{MAX_NAME_CHARS} characters,"
                    f" not {quote_input(name)}"
                )
        compact = spec.get("compact", False)
        if compact is None:
            compact = False
        if not isinstance(compact, bool):
            raise NotifyError("compact must be a boolean")
        return cls(tuple(str(name) for name in names), compact)

    def values(self, notification: Notification) -> list[Value]:
        """The compact form: the requested values in order, None for those missing."""
        return [get(notification) for get in self._getters]

    def attributes(self, notification: Notification) -> dict[str, Value]:
        """The requested attributes the notification has (the others are left out)."""
        result: dict[str, Value] = {}
        for name, get in zip(self.requested, self._getters, strict=True):
            value = get(notification)
            if value is not None or _has_null(notification, name):
                result[name] = value
        return result


def _has_null(notification: Notification, name: str) -> bool:
    """The attribute is there and NULL (a JSON null), not missing."""
    data = notification.data
    if type(data) is not dict or name in BASE_ATTRIBUTES:
        return False
    if name in data:
        return data[name] is None
    *parents, last = name.split(".")
    for part in parents:
        data = data.get(part)
        if type(data) is not dict:
            return False
    return last in data and data[last] is None


def real_message(
    notification: Notification, transformation: Transformation | None
) -> dict[str, Any]:
    """The real message a subscriber gets, as ``{subject, properties, body}`` (each only when
    present). Without a transformation: the virtual message (subject = event type, properties
    = every attribute) with the event data as body; with one, the requested properties only;
    compact, the body alone: the requested values in order."""
    if transformation is None:
        return {
            "subject": notification.type,
            "properties": notification.attributes(),
            "body": notification.data,
        }
    if transformation.compact:
        return {"body": transformation.values(notification)}
    return {"subject": notification.type, "properties": transformation.attributes(notification)}
