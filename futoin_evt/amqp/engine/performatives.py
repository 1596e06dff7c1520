"""Performatives, termini, outcomes and errors (AMQP 1.0 parts 2.7, 3.4, 3.5) as classes.

Each composite is a dataclass whose fields follow the spec's order. Decoding checks each
field's type and fills in the spec's default for a null or absent one; a composite that
misses a mandatory field or has one of the wrong type raises :class:`BadComposite`. Encoding
writes every field, trailing nulls included: some clients read the fields by position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from .conditions import DECODE_ERROR, INVALID_FIELD
from .types import (
    Array,
    DecodeError,
    Described,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
    encode_into,
    symbols,
)


class BadComposite(DecodeError):
    """A composite value with a field missing or of the wrong type."""

    def __init__(self, description: str, condition: str = INVALID_FIELD) -> None:
        super().__init__(description)
        self.condition = condition


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _uint_ok(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= 0xFFFF_FFFF


def _symbols_out(value: Any) -> Any:
    if value is None or isinstance(value, Array):
        return value
    if isinstance(value, str):
        return Symbol(value)
    return symbols(*value)


def _symbols_in(value: Any) -> Any:
    """A ``multiple`` symbol field as a tuple of strings."""
    if isinstance(value, str):
        return (str(value),)
    if isinstance(value, Array) and all(isinstance(item, str) for item in value.items):
        return tuple(str(item) for item in value.items)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(str(item) for item in value)
    raise BadComposite("a field of symbols holds something else")


class _Kind:
    """How one field is checked when decoded and typed when encoded."""

    __slots__ = ("check", "read", "write")

    def __init__(
        self,
        check: Callable[[Any], bool],
        write: Callable[[Any], Any] | None = None,
        read: Callable[[Any], Any] | None = None,
    ) -> None:
        self.check = check
        self.write = write
        self.read = read


def _same(value: Any) -> Any:
    return value


UINT_K: Final = _Kind(_uint_ok, UInt)
USHORT_K: Final = _Kind(lambda v: _is_int(v) and 0 <= v <= 0xFFFF, UShort)
UBYTE_K: Final = _Kind(lambda v: _is_int(v) and 0 <= v <= 0xFF, UByte)
ULONG_K: Final = _Kind(lambda v: _is_int(v) and 0 <= v < 1 << 64, ULong)
BOOL_K: Final = _Kind(lambda v: isinstance(v, bool))
STR_K: Final = _Kind(lambda v: isinstance(v, str))
SYMBOL_K: Final = _Kind(lambda v: isinstance(v, str), Symbol, str)
BINARY_K: Final = _Kind(lambda v: isinstance(v, bytes))
SYMBOLS_K: Final = _Kind(lambda v: True, _symbols_out, _symbols_in)
MAP_K: Final = _Kind(lambda v: isinstance(v, dict))
ANY_K: Final = _Kind(lambda v: True)
#: An ``error`` field: an error composite (decoded by :func:`from_described` already).
ERROR_K: Final = _Kind(lambda v: isinstance(v, Error))


class Composite:
    """A described list type. Subclasses are dataclasses and set the class attributes."""

    DESCRIPTOR: ClassVar[int]
    NAME: ClassVar[str]
    KINDS: ClassVar[tuple[_Kind, ...]]
    #: (mandatory, default) of each field, filled in by :func:`_composite`.
    _DEFAULTS: ClassVar[tuple[tuple[bool, Any], ...]]
    _NAMES: ClassVar[tuple[str, ...]]
    __slots__ = ()

    def fields(self) -> list[Any]:
        """Every field, typed for encoding (nulls where there is no value)."""
        out = []
        for name, kind in zip(self._NAMES, self.KINDS, strict=True):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, Composite):
                    value = value.described()
                elif kind.write is not None:
                    value = kind.write(value)
            out.append(value)
        return out

    def described(self) -> Described:
        return Described(ULong(self.DESCRIPTOR), self.fields())

    def encode_into(self, out: bytearray) -> None:
        encode_into(self.described(), out)

    @classmethod
    def from_fields(cls, fields: Any) -> Any:
        """The composite of a decoded field list; raises :class:`BadComposite`."""
        if not isinstance(fields, list):
            raise BadComposite(f"{cls.NAME} is not a list", DECODE_ERROR)
        values = []
        for index, (mandatory, default) in enumerate(cls._DEFAULTS):
            value = fields[index] if index < len(fields) else None
            if value is None:
                if mandatory:
                    raise BadComposite(f"{cls.NAME} lacks its mandatory field {index + 1}")
                value = default
            else:
                kind = cls.KINDS[index]
                if isinstance(value, Described):
                    value = from_described(value)
                if not kind.check(value):
                    raise BadComposite(f"field {index + 1} of {cls.NAME} has the wrong type")
                if kind.read is not None:
                    value = kind.read(value)
            values.append(value)
        return cls(*values)


_BY_CODE: dict[int, type[Composite]] = {}
_BY_NAME: dict[str, type[Composite]] = {}


def _composite(
    code: int, name: str, kinds: Sequence[_Kind], optional: Sequence[int] = ()
) -> Callable[[type[Any]], Any]:
    """Register a composite; ``optional``: fields without a default that may be null."""

    def register(cls: type[Any]) -> Any:
        cls.DESCRIPTOR = code
        cls.NAME = name
        cls.KINDS = tuple(kinds)
        defaults = []
        for index, field in enumerate(dataclasses.fields(cls)):
            missing = field.default is dataclasses.MISSING
            defaults.append((missing and index not in optional, None if missing else field.default))
        if len(defaults) != len(kinds):
            raise AssertionError(f"{name}: {len(defaults)} fields, {len(kinds)} kinds")
        cls._DEFAULTS = tuple(defaults)
        cls._NAMES = tuple(field.name for field in dataclasses.fields(cls))
        _BY_CODE[code] = cls
        _BY_NAME[f"amqp:{name}:list"] = cls
        return cls

    return register


def from_described(value: Described) -> Any:
    """The composite a described value is, when it is one we know; else the value itself."""
    descriptor = value.descriptor
    if type(descriptor) is ULong:
        cls = _BY_CODE.get(descriptor)
    elif isinstance(descriptor, str):
        cls = _BY_NAME.get(descriptor)
    else:
        cls = None
    if cls is None:
        return value
    return cls.from_fields(value.value)


# -- errors, termini, outcomes ------------------------------------------------------------------


@_composite(0x1D, "error", (SYMBOL_K, STR_K, MAP_K))
@dataclass(slots=True)
class Error(Composite):
    condition: str
    description: str | None = None
    info: dict[Any, Any] | None = None


@_composite(
    0x28,
    "source",
    (STR_K, UINT_K, SYMBOL_K, UINT_K, BOOL_K, MAP_K, SYMBOL_K, MAP_K, ANY_K, SYMBOLS_K, SYMBOLS_K),
)
@dataclass(slots=True)
class Source(Composite):
    address: str | None = None
    durable: int = 0
    expiry_policy: str | None = None
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: str | None = None
    filter: dict[Any, Any] | None = None
    default_outcome: Any = None
    outcomes: tuple[str, ...] | None = None
    capabilities: tuple[str, ...] | None = None


@_composite(0x29, "target", (STR_K, UINT_K, SYMBOL_K, UINT_K, BOOL_K, MAP_K, SYMBOLS_K))
@dataclass(slots=True)
class Target(Composite):
    address: str | None = None
    durable: int = 0
    expiry_policy: str | None = None
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    capabilities: tuple[str, ...] | None = None


@_composite(0x23, "received", (UINT_K, ULONG_K))
@dataclass(slots=True)
class Received(Composite):
    section_number: int
    section_offset: int


@_composite(0x24, "accepted", ())
@dataclass(slots=True)
class Accepted(Composite):
    pass


@_composite(0x25, "rejected", (ERROR_K,))
@dataclass(slots=True)
class Rejected(Composite):
    error: Error | None = None


@_composite(0x26, "released", ())
@dataclass(slots=True)
class Released(Composite):
    pass


@_composite(0x27, "modified", (BOOL_K, BOOL_K, MAP_K))
@dataclass(slots=True)
class Modified(Composite):
    delivery_failed: bool = False
    undeliverable_here: bool = False
    message_annotations: dict[Any, Any] | None = None


#: What a disposition's or transfer's ``state`` may be.
Outcome = Received | Accepted | Rejected | Released | Modified
ACCEPTED: Final = Accepted()
RELEASED: Final = Released()


# -- performatives ------------------------------------------------------------------------------

#: Settlement modes of attach.
SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1
#: Roles of attach and disposition.
SENDER, RECEIVER = False, True


@_composite(
    0x10,
    "open",
    (STR_K, STR_K, UINT_K, USHORT_K, UINT_K, SYMBOLS_K, SYMBOLS_K, SYMBOLS_K, SYMBOLS_K, MAP_K),
)
@dataclass(slots=True)
class Open(Composite):
    container_id: str
    hostname: str | None = None
    max_frame_size: int = 0xFFFF_FFFF
    channel_max: int = 0xFFFF
    #: Milliseconds; None: no time-out.
    idle_time_out: int | None = None
    outgoing_locales: tuple[str, ...] | None = None
    incoming_locales: tuple[str, ...] | None = None
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@_composite(
    0x11, "begin", (USHORT_K, UINT_K, UINT_K, UINT_K, UINT_K, SYMBOLS_K, SYMBOLS_K, MAP_K), (0,)
)
@dataclass(slots=True)
class Begin(Composite):
    remote_channel: int | None
    next_outgoing_id: int
    incoming_window: int
    outgoing_window: int
    handle_max: int = 0xFFFF_FFFF
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@_composite(
    0x12,
    "attach",
    (STR_K, UINT_K, BOOL_K, UBYTE_K, UBYTE_K, ANY_K, ANY_K, MAP_K, BOOL_K, UINT_K, ULONG_K,
     SYMBOLS_K, SYMBOLS_K, MAP_K),
)  # fmt: skip
@dataclass(slots=True)
class Attach(Composite):
    name: str
    handle: int
    role: bool
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    source: Source | Any = None
    target: Target | Any = None
    unsettled: dict[Any, Any] | None = None
    incomplete_unsettled: bool = False
    initial_delivery_count: int | None = None
    max_message_size: int | None = None
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@_composite(
    0x13,
    "flow",
    (UINT_K, UINT_K, UINT_K, UINT_K, UINT_K, UINT_K, UINT_K, UINT_K, BOOL_K, BOOL_K, MAP_K),
    (0,),
)
@dataclass(slots=True)
class Flow(Composite):
    next_incoming_id: int | None
    incoming_window: int
    next_outgoing_id: int
    outgoing_window: int
    handle: int | None = None
    delivery_count: int | None = None
    link_credit: int | None = None
    available: int | None = None
    drain: bool = False
    echo: bool = False
    properties: dict[Any, Any] | None = None


@_composite(
    0x14,
    "transfer",
    (UINT_K, UINT_K, BINARY_K, UINT_K, BOOL_K, BOOL_K, UBYTE_K, ANY_K, BOOL_K, BOOL_K, BOOL_K),
)
@dataclass(slots=True)
class Transfer(Composite):
    handle: int
    delivery_id: int | None = None
    delivery_tag: bytes | None = None
    message_format: int | None = None
    settled: bool | None = None
    more: bool = False
    rcv_settle_mode: int | None = None
    state: Any = None
    resume: bool = False
    aborted: bool = False
    batchable: bool = False


@_composite(0x15, "disposition", (BOOL_K, UINT_K, UINT_K, BOOL_K, ANY_K, BOOL_K))
@dataclass(slots=True)
class Disposition(Composite):
    role: bool
    first: int
    last: int | None = None
    settled: bool = False
    state: Any = None
    batchable: bool = False


@_composite(0x16, "detach", (UINT_K, BOOL_K, ERROR_K))
@dataclass(slots=True)
class Detach(Composite):
    handle: int
    closed: bool = False
    error: Error | None = None


@_composite(0x17, "end", (ERROR_K,))
@dataclass(slots=True)
class End(Composite):
    error: Error | None = None


@_composite(0x18, "close", (ERROR_K,))
@dataclass(slots=True)
class Close(Composite):
    error: Error | None = None


Performative = Open | Begin | Attach | Flow | Transfer | Disposition | Detach | End | Close
PERFORMATIVES: Final = frozenset(range(0x10, 0x19))

# -- SASL (part 5.3) ----------------------------------------------------------------------------


@_composite(0x40, "sasl-mechanisms", (SYMBOLS_K,))
@dataclass(slots=True)
class SaslMechanisms(Composite):
    sasl_server_mechanisms: tuple[str, ...]


@_composite(0x41, "sasl-init", (SYMBOL_K, BINARY_K, STR_K))
@dataclass(slots=True)
class SaslInit(Composite):
    mechanism: str
    initial_response: bytes | None = None
    hostname: str | None = None


@_composite(0x44, "sasl-outcome", (UBYTE_K, BINARY_K))
@dataclass(slots=True)
class SaslOutcome(Composite):
    code: int
    additional_data: bytes | None = None


def composite_class(code: int) -> type[Composite] | None:
    return _BY_CODE.get(code)
