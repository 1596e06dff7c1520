"""The AMQP 1.0 type system (part 1): Python values and their encoding, no I/O.

Python values map to AMQP types as follows; a type Python has no own value for is a marker
subclass:

=====================  ==========================================================
AMQP                   Python
=====================  ==========================================================
null, boolean          ``None``, ``bool``
ubyte/ushort/uint/     :class:`UByte`, :class:`UShort`, :class:`UInt`, :class:`ULong`
ulong
byte/short/int         :class:`Byte`, :class:`Short`, :class:`Int`
long                   ``int`` (the default for an integer)
float, double          :class:`Float`, ``float``
decimal32/64/128       :class:`Decimal32`, :class:`Decimal64`, :class:`Decimal128` (raw
                       IEEE 754 bytes)
char                   :class:`Char`
timestamp              :class:`Timestamp` (ms since the epoch)
uuid                   ``uuid.UUID``
binary, string,        ``bytes``, ``str``, :class:`Symbol`
symbol
list, map              ``list``, ``dict``
array                  :class:`Array`
described              :class:`Described`
=====================  ==========================================================

The marker classes are defined in :mod:`.markers` (this module is compiled with mypyc).
Encoding picks the narrowest form (``uint0``, ``smalluint``, ``str8``, ``list0``, ``list8``...);
decoding reads every form. Decoding untrusted bytes raises :class:`DecodeError` and nothing else
(nesting is bounded).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from .markers import (
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Float,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

__all__ = [
    "Array",
    "Buffer",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "DecodeError",
    "Described",
    "EncodeError",
    "Float",
    "Int",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "decode",
    "decode_value",
    "encode",
    "encode_into",
    "skip_value",
    "symbols",
]

MAX_DEPTH: Final = 64
#: What values are decoded from, and binaries encoded from.
Buffer = bytes | bytearray | memoryview


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP encoding."""


class EncodeError(ValueError):
    """A value that no AMQP type holds (an integer out of range, say)."""


class Described:
    """A value with a descriptor (a symbol or a ulong, as a rule)."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Described)
            and self.descriptor == other.descriptor
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.descriptor, repr(self.value)))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class Array:
    """Values of one type (``code``: the element constructor, e.g. :data:`SYMBOL_ARRAY`),
    described by ``descriptor`` when it is not None."""

    __slots__ = ("code", "descriptor", "items")

    def __init__(self, code: int, items: Sequence[Any], descriptor: Any = None) -> None:
        self.code = code
        self.items = list(items)
        self.descriptor = descriptor

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Array)
            and _wide(self.code) == _wide(other.code)
            and self.descriptor == other.descriptor
            and self.items == other.items
        )

    def __hash__(self) -> int:
        return hash((_wide(self.code), repr(self.items)))

    def __repr__(self) -> str:
        return f"Array(0x{self.code:02x}, {self.items!r}, {self.descriptor!r})"


def symbols(*names: str) -> Array:
    """An array of symbols (capabilities, mechanisms, locales)."""
    return Array(SYM32, [Symbol(name) for name in names])


# -- constructors -------------------------------------------------------------------------------

NULL: Final = 0x40
TRUE, FALSE, BOOLEAN = 0x41, 0x42, 0x56
UINT0, SMALLUINT, UINT = 0x43, 0x52, 0x70
ULONG0, SMALLULONG, ULONG = 0x44, 0x53, 0x80
UBYTE, USHORT = 0x50, 0x60
BYTE, SHORT, SMALLINT, INT, SMALLLONG, LONG = 0x51, 0x61, 0x54, 0x71, 0x55, 0x81
FLOAT, DOUBLE = 0x72, 0x82
DECIMAL32, DECIMAL64, DECIMAL128 = 0x74, 0x84, 0x94
CHAR, TIMESTAMP, UUID = 0x73, 0x83, 0x98
VBIN8, VBIN32, STR8, STR32, SYM8, SYM32 = 0xA0, 0xB0, 0xA1, 0xB1, 0xA3, 0xB3
LIST0, LIST8, LIST32, MAP8, MAP32, ARRAY8, ARRAY32 = 0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0

_B = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_BB = struct.Struct(">BB")
_II = struct.Struct(">II")
_UINT_CODE = b"\x70"


def _wide(code: int) -> int:
    """The same type's widest constructor (arrays compare by type, not width)."""
    return {
        UINT0: UINT, SMALLUINT: UINT, ULONG0: ULONG, SMALLULONG: ULONG, SMALLINT: INT,
        SMALLLONG: LONG, VBIN8: VBIN32, STR8: STR32, SYM8: SYM32, LIST0: LIST32, LIST8: LIST32,
        MAP8: MAP32, ARRAY8: ARRAY32, TRUE: BOOLEAN, FALSE: BOOLEAN,
    }.get(code, code)  # fmt: skip


# -- encoding -----------------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    out = bytearray()
    encode_into(value, out)
    return bytes(out)


def encode_into(value: Any, out: bytearray) -> None:
    """Append the encoding of ``value`` to ``out``; raises :class:`EncodeError`."""
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        encoder = _encoder_of(value)
    encoder(value, out)


def _encoder_of(value: Any) -> Callable[[Any, bytearray], None]:
    for kind, encoder in _ENCODERS.items():
        if isinstance(value, kind):
            return encoder
    if isinstance(value, memoryview | bytearray):
        return _put_binary
    if isinstance(value, Sequence):
        return _put_list
    raise EncodeError(f"no AMQP type for a {type(value).__name__}")


def _range(value: int, low: int, high: int, name: str) -> None:
    if not low <= value <= high:
        raise EncodeError(f"{value} is out of the range of {name}")


def _put_null(_value: Any, out: bytearray) -> None:
    out.append(NULL)


def _put_bool(value: bool, out: bytearray) -> None:
    out.append(TRUE if value else FALSE)


def _put_ubyte(value: int, out: bytearray) -> None:
    _range(value, 0, 0xFF, "ubyte")
    out += bytes((UBYTE, value))


def _put_ushort(value: int, out: bytearray) -> None:
    _range(value, 0, 0xFFFF, "ushort")
    out.append(USHORT)
    out += _H.pack(value)


def _put_uint(value: int, out: bytearray) -> None:
    if value == 0:
        out.append(UINT0)
    elif 0 < value < 256:
        out += bytes((SMALLUINT, value))
    else:
        _range(value, 0, 0xFFFF_FFFF, "uint")
        out += _UINT_CODE + _I.pack(value)


def _put_ulong(value: int, out: bytearray) -> None:
    if value == 0:
        out.append(ULONG0)
    elif 0 < value < 256:
        out += bytes((SMALLULONG, value))
    else:
        _range(value, 0, 0xFFFF_FFFF_FFFF_FFFF, "ulong")
        out.append(ULONG)
        out += _Q.pack(value)


def _put_byte(value: int, out: bytearray) -> None:
    _range(value, -128, 127, "byte")
    out.append(BYTE)
    out += _B.pack(value)


def _put_short(value: int, out: bytearray) -> None:
    _range(value, -0x8000, 0x7FFF, "short")
    out.append(SHORT)
    out += _h.pack(value)


def _put_int(value: int, out: bytearray) -> None:
    if -128 <= value <= 127:
        out.append(SMALLINT)
        out += _B.pack(value)
    else:
        _range(value, -(1 << 31), (1 << 31) - 1, "int")
        out.append(INT)
        out += _i.pack(value)


def _put_long(value: int, out: bytearray) -> None:
    if -128 <= value <= 127:
        out.append(SMALLLONG)
        out += _B.pack(value)
    else:
        _range(value, -(1 << 63), (1 << 63) - 1, "long")
        out.append(LONG)
        out += _q.pack(value)


def _put_timestamp(value: int, out: bytearray) -> None:
    _range(value, -(1 << 63), (1 << 63) - 1, "timestamp")
    out.append(TIMESTAMP)
    out += _q.pack(value)


def _put_float(value: float, out: bytearray) -> None:
    out.append(FLOAT)
    try:
        out += _f.pack(value)
    except OverflowError:
        raise EncodeError(f"{value} is out of the range of float") from None


def _put_double(value: float, out: bytearray) -> None:
    out.append(DOUBLE)
    out += _d.pack(value)


def _put_decimal(code: int, width: int) -> Callable[[bytes, bytearray], None]:
    def put(value: bytes, out: bytearray) -> None:
        if len(value) != width:
            raise EncodeError(f"a decimal of {width} bytes, not {len(value)}")
        out.append(code)
        out += value

    return put


def _put_char(value: str, out: bytearray) -> None:
    if len(value) != 1:
        raise EncodeError("a char is one character")
    out.append(CHAR)
    out += _I.pack(ord(value))


def _put_uuid(value: uuid.UUID, out: bytearray) -> None:
    out.append(UUID)
    out += value.bytes


def _put_variable(short: int, long: int, raw: Buffer, out: bytearray) -> None:
    size = len(raw)
    if size < 256:
        out += bytes((short, size))
    else:
        _range(size, 0, 0xFFFF_FFFF, "a variable-width value")
        out.append(long)
        out += _I.pack(size)
    out += raw


def _put_binary(value: Buffer, out: bytearray) -> None:
    _put_variable(VBIN8, VBIN32, value, out)


def _put_string(value: str, out: bytearray) -> None:
    try:
        raw = value.encode()
    except UnicodeEncodeError:
        raise EncodeError("a string with lone surrogates") from None
    _put_variable(STR8, STR32, raw, out)


def _put_symbol(value: str, out: bytearray) -> None:
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError("a symbol is ASCII") from None
    _put_variable(SYM8, SYM32, raw, out)


def _put_compound(short: int, long: int, count: int, items: bytearray, out: bytearray) -> None:
    if len(items) + 1 < 256 and count < 256:
        out += bytes((short, len(items) + 1, count))
    else:
        out.append(long)
        out += _II.pack(len(items) + 4, count)
    out += items


def _put_list(value: Sequence[Any], out: bytearray) -> None:
    if not value:
        out.append(LIST0)
        return
    items = bytearray()
    for item in value:
        encode_into(item, items)
    _put_compound(LIST8, LIST32, len(value), items, out)


def _put_map(value: dict[Any, Any], out: bytearray) -> None:
    items = bytearray()
    for key, item in value.items():
        encode_into(key, items)
        encode_into(item, items)
    _put_compound(MAP8, MAP32, 2 * len(value), items, out)


def _put_described(value: Described, out: bytearray) -> None:
    out.append(0)
    encode_into(value.descriptor, out)
    encode_into(value.value, out)


def _put_array(value: Array, out: bytearray) -> None:
    code = _wide(value.code)
    element = _ELEMENTS.get(code)
    if element is None:
        raise EncodeError(f"no array of constructor 0x{value.code:02x}")
    body = bytearray()
    if value.descriptor is not None:
        body.append(0)
        encode_into(value.descriptor, body)
    body.append(code)
    for item in value.items:
        element(item, body)
    _put_compound(ARRAY8, ARRAY32, len(value.items), body, out)


def _element_fixed(fmt: struct.Struct) -> Callable[[Any, bytearray], None]:
    def put(value: Any, out: bytearray) -> None:
        try:
            out += fmt.pack(value)
        except (struct.error, OverflowError):
            raise EncodeError(f"{value!r} does not fit the array's type") from None

    return put


def _element_bool(value: Any, out: bytearray) -> None:
    out.append(1 if value else 0)


def _element_variable(text: str | None) -> Callable[[Any, bytearray], None]:
    def put(value: Any, out: bytearray) -> None:
        raw = value if text is None else value.encode(text)
        out += _I.pack(len(raw))
        out += raw

    return put


def _element_compound(kind: int) -> Callable[[Any, bytearray], None]:
    def put(value: Any, out: bytearray) -> None:
        wanted = {LIST32: (list, tuple), MAP32: (dict,), ARRAY32: (Array,)}[kind]
        if not isinstance(value, wanted):
            raise EncodeError("an array's elements are all of its type")
        encoded = bytearray()
        encode_into(value, encoded)
        # in the wide form that every element of the array shares
        count, items = _compound_parts(bytes(encoded))
        out += _II.pack(len(items) + 4, count)
        out += items

    return put


def _compound_parts(encoded: bytes) -> tuple[int, bytes]:
    code = encoded[0]
    if code == LIST0:
        return 0, b""
    if code in (LIST8, MAP8, ARRAY8):
        return encoded[2], encoded[3:]
    return _I.unpack_from(encoded, 5)[0], encoded[9:]


def _element_decimal(width: int) -> Callable[[Any, bytearray], None]:
    def put(value: Any, out: bytearray) -> None:
        if len(value) != width:
            raise EncodeError(f"a decimal of {width} bytes")
        out += value

    return put


_ELEMENTS: Final[dict[int, Callable[[Any, bytearray], None]]] = {
    NULL: lambda _v, _o: None,
    BOOLEAN: _element_bool,
    UBYTE: _element_fixed(struct.Struct(">B")),
    USHORT: _element_fixed(_H),
    UINT: _element_fixed(_I),
    ULONG: _element_fixed(_Q),
    BYTE: _element_fixed(_B),
    SHORT: _element_fixed(_h),
    INT: _element_fixed(_i),
    LONG: _element_fixed(_q),
    TIMESTAMP: _element_fixed(_q),
    FLOAT: _element_fixed(_f),
    DOUBLE: _element_fixed(_d),
    DECIMAL32: _element_decimal(4),
    DECIMAL64: _element_decimal(8),
    DECIMAL128: _element_decimal(16),
    CHAR: lambda v, o: o.extend(_I.pack(ord(v))),
    UUID: lambda v, o: o.extend(v.bytes),
    VBIN32: _element_variable(None),
    STR32: _element_variable("utf-8"),
    SYM32: _element_variable("ascii"),
    LIST32: _element_compound(LIST32),
    MAP32: _element_compound(MAP32),
    ARRAY32: _element_compound(ARRAY32),
}

#: Encoders by exact type, the subclasses before their bases for :func:`_encoder_of`.
_ENCODERS: Final[dict[type, Callable[[Any, bytearray], None]]] = {
    type(None): _put_null,
    bool: _put_bool,
    UByte: _put_ubyte,
    UShort: _put_ushort,
    UInt: _put_uint,
    ULong: _put_ulong,
    Byte: _put_byte,
    Short: _put_short,
    Int: _put_int,
    Timestamp: _put_timestamp,
    int: _put_long,
    Float: _put_float,
    float: _put_double,
    Decimal32: _put_decimal(DECIMAL32, 4),
    Decimal64: _put_decimal(DECIMAL64, 8),
    Decimal128: _put_decimal(DECIMAL128, 16),
    bytes: _put_binary,
    Char: _put_char,
    Symbol: _put_symbol,
    str: _put_string,
    uuid.UUID: _put_uuid,
    list: _put_list,
    tuple: _put_list,
    dict: _put_map,
    Described: _put_described,
    Array: _put_array,
}


# -- decoding -----------------------------------------------------------------------------------


def decode(data: Buffer) -> Any:
    """The one value that ``data`` holds (nothing may follow it)."""
    value, end = decode_value(data, 0)
    if end != len(data):
        raise DecodeError(f"{len(data) - end} bytes after the value")
    return value


def decode_value(data: Buffer, position: int, depth: int = 0) -> tuple[Any, int]:
    """The value at ``position`` and where the next begins; raises :class:`DecodeError`."""
    try:
        code = data[position]
    except IndexError:
        raise DecodeError("the value is cut short") from None
    if code == 0:
        if depth >= MAX_DEPTH:
            raise DecodeError("the value nests too deep")
        descriptor, position = decode_value(data, position + 1, depth + 1)
        if isinstance(descriptor, Described):
            raise DecodeError("a descriptor that is itself described")
        value, position = decode_value(data, position, depth + 1)
        return Described(descriptor, value), position
    reader = _READERS.get(code)
    if reader is None:
        raise DecodeError(f"no AMQP type has the constructor 0x{code:02x}")
    try:
        return reader(data, position + 1, depth)
    except (IndexError, struct.error):
        raise DecodeError("the value is cut short") from None


Reader = Callable[[Buffer, int, int], tuple[Any, int]]


def _constant(value: Any) -> Reader:
    def read(_data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
        return value, position

    return read


def _fixed(fmt: struct.Struct, wrap: Callable[[Any], Any]) -> Reader:
    size, unpack = fmt.size, fmt.unpack_from

    def read(data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
        return wrap(unpack(data, position)[0]), position + size

    return read


def _end(data: Buffer, end: int) -> int:
    if end > len(data):
        raise DecodeError("the value is cut short")
    return end


def _raw(width: int, wrap: Callable[[bytes], Any]) -> Reader:
    def read(data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
        end = _end(data, position + width)
        return wrap(bytes(data[position:end])), end

    return read


def _variable(width: int, kind: int) -> Reader:
    fmt = struct.Struct(">B" if width == 1 else ">I")

    def read(data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
        start = position + width
        end = _end(data, start + fmt.unpack_from(data, position)[0])
        raw = bytes(data[start:end])
        if kind == VBIN8:
            return raw, end
        try:
            text = raw.decode("utf-8" if kind == STR8 else "ascii")
        except UnicodeDecodeError:
            raise DecodeError("a string that is not UTF-8 or a symbol that is not ASCII") from None
        return (text if kind == STR8 else Symbol(text)), end

    return read


def _char(data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
    point = _I.unpack_from(data, position)[0]
    try:
        return Char(chr(point)), position + 4
    except (ValueError, OverflowError):
        raise DecodeError(f"not a character: {point}") from None


def _bool(data: Buffer, position: int, _depth: int) -> tuple[Any, int]:
    byte = data[position]
    if byte > 1:
        raise DecodeError(f"a boolean of {byte}")
    return byte == 1, position + 1


def _compound_head(width: int, data: Buffer, position: int) -> tuple[int, int, int]:
    """(count, first item, end) of a list, map or array after its constructor."""
    if width == 1:
        size, count = _BB.unpack_from(data, position)
    else:
        size, count = _II.unpack_from(data, position)
    end = _end(data, position + width + size)
    if size < width:
        raise DecodeError("a compound value smaller than its count")
    return count, position + 2 * width, end


def _list(width: int) -> Reader:
    def read(data: Buffer, position: int, depth: int) -> tuple[Any, int]:
        if depth >= MAX_DEPTH:
            raise DecodeError("the value nests too deep")
        count, position, end = _compound_head(width, data, position)
        if count > end - position:
            raise DecodeError("a list with more items than bytes")
        items = []
        for _ in range(count):
            item, position = decode_value(data, position, depth + 1)
            items.append(item)
        if position != end:
            raise DecodeError("a list whose items do not fill it")
        return items, end

    return read


def _map(width: int) -> Reader:
    def read(data: Buffer, position: int, depth: int) -> tuple[Any, int]:
        if depth >= MAX_DEPTH:
            raise DecodeError("the value nests too deep")
        count, position, end = _compound_head(width, data, position)
        if count % 2:
            raise DecodeError("a map with an odd number of items")
        if count > end - position:
            raise DecodeError("a map with more items than bytes")
        result: dict[Any, Any] = {}
        for _ in range(count // 2):
            key, position = decode_value(data, position, depth + 1)
            value, position = decode_value(data, position, depth + 1)
            try:
                result[key] = value
            except TypeError:
                raise DecodeError("a map key that is a list or a map") from None
        if position != end:
            raise DecodeError("a map whose items do not fill it")
        return result, end

    return read


def _array(width: int) -> Reader:
    def read(data: Buffer, position: int, depth: int) -> tuple[Any, int]:
        if depth >= MAX_DEPTH:
            raise DecodeError("the value nests too deep")
        count, position, end = _compound_head(width, data, position)
        descriptor = None
        if position >= end:
            raise DecodeError("an array without an element constructor")
        if data[position] == 0:
            descriptor, position = decode_value(data, position + 1, depth + 1)
        if position >= end:
            raise DecodeError("an array without an element constructor")
        code = data[position]
        reader = _READERS.get(code)
        if reader is None or code == 0:
            raise DecodeError(f"an array of constructor 0x{code:02x}")
        position += 1
        if count > end - position and code not in _EMPTY_WIDTH:
            raise DecodeError("an array with more items than bytes")
        if count > _MAX_EMPTY_ITEMS and code in _EMPTY_WIDTH:
            raise DecodeError("an array of too many zero-width elements")
        items = []
        for _ in range(count):
            try:
                item, position = reader(data, position, depth + 1)
            except (IndexError, struct.error):
                raise DecodeError("the array is cut short") from None
            if position > end:
                raise DecodeError("an array whose items overrun it")
            items.append(item)
        if position != end:
            raise DecodeError("an array whose items do not fill it")
        return Array(code, items, descriptor), end

    return read


#: Constructors whose values take no bytes: an array of them cannot say where it ends.
_EMPTY_WIDTH: Final = frozenset((NULL, TRUE, FALSE, UINT0, ULONG0, LIST0))
_MAX_EMPTY_ITEMS: Final = 1024

_READERS: Final[dict[int, Reader]] = {
    NULL: _constant(None),
    TRUE: _constant(True),
    FALSE: _constant(False),
    BOOLEAN: _bool,
    UINT0: _constant(UInt(0)),
    ULONG0: _constant(ULong(0)),
    LIST0: _constant([]),
    UBYTE: _fixed(struct.Struct(">B"), UByte),
    USHORT: _fixed(_H, UShort),
    UINT: _fixed(_I, UInt),
    SMALLUINT: _fixed(struct.Struct(">B"), UInt),
    ULONG: _fixed(_Q, ULong),
    SMALLULONG: _fixed(struct.Struct(">B"), ULong),
    BYTE: _fixed(_B, Byte),
    SHORT: _fixed(_h, Short),
    INT: _fixed(_i, Int),
    SMALLINT: _fixed(_B, Int),
    LONG: _fixed(_q, int),
    SMALLLONG: _fixed(_B, int),
    FLOAT: _fixed(_f, Float),
    DOUBLE: _fixed(_d, float),
    DECIMAL32: _raw(4, Decimal32),
    DECIMAL64: _raw(8, Decimal64),
    DECIMAL128: _raw(16, Decimal128),
    CHAR: _char,
    TIMESTAMP: _fixed(_q, Timestamp),
    UUID: _raw(16, lambda raw: uuid.UUID(bytes=raw)),
    VBIN8: _variable(1, VBIN8),
    VBIN32: _variable(4, VBIN8),
    STR8: _variable(1, STR8),
    STR32: _variable(4, STR8),
    SYM8: _variable(1, SYM8),
    SYM32: _variable(4, SYM8),
    LIST8: _list(1),
    LIST32: _list(4),
    MAP8: _map(1),
    MAP32: _map(4),
    ARRAY8: _array(1),
    ARRAY32: _array(4),
}


def skip_value(data: Buffer, position: int) -> int:
    """Where the value at ``position`` ends, without decoding it; raises :class:`DecodeError`."""
    try:
        code = data[position]
        if code == 0:
            return skip_value(data, skip_value(data, position + 1))
        nibble = code >> 4
        if nibble in _FIXED_WIDTHS:
            if code not in _READERS:
                raise DecodeError(f"no AMQP type has the constructor 0x{code:02x}")
            return _end(data, position + 1 + _FIXED_WIDTHS[nibble])
        if nibble in (0xA, 0xC, 0xE):
            return _end(data, position + 2 + data[position + 1])
        if nibble in (0xB, 0xD, 0xF):
            return _end(data, position + 5 + _I.unpack_from(data, position + 1)[0])
    except (IndexError, struct.error):
        raise DecodeError("the value is cut short") from None
    raise DecodeError(f"no AMQP type has the constructor 0x{code:02x}")


_FIXED_WIDTHS: Final = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
