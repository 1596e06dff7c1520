"""The engine's AMQP type system against proton's: generated values encoded by one are
decoded by the other, type for type; every constructor and both widths decode; bad bytes
raise DecodeError and nothing else."""

from __future__ import annotations

import contextlib
import struct
import uuid
from typing import Any

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Data

from futoin_evt.amqp.engine import types as t
from futoin_evt.amqp.engine.performatives import (
    Attach,
    BadComposite,
    Disposition,
    Open,
    Source,
    Transfer,
    from_described,
)

# -- a value in both worlds ---------------------------------------------------------------------

_PROTON_TYPES = {
    t.UBYTE: Data.UBYTE, t.USHORT: Data.USHORT, t.UINT: Data.UINT, t.ULONG: Data.ULONG,
    t.BYTE: Data.BYTE, t.SHORT: Data.SHORT, t.INT: Data.INT, t.LONG: Data.LONG,
    t.FLOAT: Data.FLOAT, t.DOUBLE: Data.DOUBLE, t.TIMESTAMP: Data.TIMESTAMP, t.UUID: Data.UUID,
    t.VBIN32: Data.BINARY, t.STR32: Data.STRING, t.SYM32: Data.SYMBOL, t.BOOLEAN: Data.BOOL,
    t.CHAR: Data.CHAR,
}  # fmt: skip
_OURS_BY_PROTON = {proton_code: ours for ours, proton_code in _PROTON_TYPES.items()}


def _ranged(ours: type, theirs: Any, low: int, high: int) -> st.SearchStrategy[Any]:
    return st.integers(low, high).map(lambda n: (ours(n), theirs(n)))


SCALARS: dict[int, st.SearchStrategy[tuple[Any, Any]]] = {
    t.UBYTE: _ranged(t.UByte, proton.ubyte, 0, 255),
    t.USHORT: _ranged(t.UShort, proton.ushort, 0, 0xFFFF),
    t.UINT: _ranged(t.UInt, proton.uint, 0, 0xFFFF_FFFF),
    t.ULONG: _ranged(t.ULong, proton.ulong, 0, 2**64 - 1),
    t.BYTE: _ranged(t.Byte, proton.byte, -128, 127),
    t.SHORT: _ranged(t.Short, proton.short, -(2**15), 2**15 - 1),
    t.INT: _ranged(t.Int, proton.int32, -(2**31), 2**31 - 1),
    t.LONG: _ranged(int, int, -(2**63), 2**63 - 1),
    t.TIMESTAMP: _ranged(t.Timestamp, proton.timestamp, -(2**63), 2**63 - 1),
    t.DOUBLE: st.floats(allow_nan=False).map(lambda f: (f, f)),
    t.FLOAT: st.floats(width=32, allow_nan=False).map(lambda f: (t.Float(f), proton.float32(f))),
    t.UUID: st.uuids().map(lambda u: (u, u)),
    t.VBIN32: st.binary(max_size=300).map(lambda b: (b, b)),
    t.STR32: st.text(max_size=300).map(lambda s: (s, s)),
    t.SYM32: st.text(
        st.characters(min_codepoint=33, max_codepoint=126), max_size=300
    ).map(lambda s: (t.Symbol(s), proton.symbol(s))),
    t.BOOLEAN: st.booleans().map(lambda b: (b, b)),
    t.CHAR: st.characters(exclude_categories=["Cs"]).map(lambda c: (t.Char(c), proton.char(c))),
}  # fmt: skip
NULL = st.just((None, None))
DECIMALS = st.one_of(
    st.integers(0, 2**32 - 1).map(
        lambda n: (t.Decimal32(n.to_bytes(4, "big")), proton.decimal32(n))
    ),
    st.integers(0, 2**63 - 1).map(
        lambda n: (t.Decimal64(n.to_bytes(8, "big")), proton.decimal64(n))
    ),
    st.binary(min_size=16, max_size=16).map(lambda b: (t.Decimal128(b), proton.decimal128(b))),
)


def _array(code: int) -> st.SearchStrategy[tuple[Any, Any]]:
    undescribed: Any = proton.UNDESCRIBED
    return st.lists(SCALARS[code], max_size=12).map(
        lambda items: (
            t.Array(code, [a for a, _ in items]),
            proton.Array(undescribed, _PROTON_TYPES[code], *[b for _, b in items]),
        )
    )


ARRAYS = st.sampled_from(sorted(SCALARS)).flatmap(_array)
LEAVES = st.one_of(NULL, DECIMALS, ARRAYS, *SCALARS.values())


def _compound(children: st.SearchStrategy[tuple[Any, Any]]) -> st.SearchStrategy[Any]:
    keys = st.one_of(SCALARS[t.STR32], SCALARS[t.SYM32], SCALARS[t.LONG], SCALARS[t.UINT])
    return st.one_of(
        st.lists(children, max_size=8).map(
            lambda items: ([a for a, _ in items], [b for _, b in items])
        ),
        st.lists(st.tuples(keys, children), max_size=6).map(
            lambda pairs: ({k[0]: v[0] for k, v in pairs}, {k[1]: v[1] for k, v in pairs})
        ),
        # described values of described values confuse proton's decoder: leaves only
        st.tuples(st.one_of(SCALARS[t.ULONG], SCALARS[t.SYM32]), LEAVES).map(
            lambda dv: (t.Described(dv[0][0], dv[1][0]), proton.Described(dv[0][1], dv[1][1]))
        ),
    )  # fmt: skip


VALUES = st.recursive(LEAVES, _compound, max_leaves=25)


def _proton_encode(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def _proton_decode(raw: bytes) -> Any:
    data = Data()
    assert data.decode(raw) == len(raw)
    data.rewind()
    data.next()
    return _ours(data.get_object())  # proton's binaries view its buffer: copy them now


def _ours(value: Any) -> Any:
    """A value proton decoded, in the engine's types."""
    kinds = {
        proton.ubyte: t.UByte, proton.ushort: t.UShort, proton.uint: t.UInt,
        proton.ulong: t.ULong, proton.byte: t.Byte, proton.short: t.Short, proton.int32: t.Int,
        proton.timestamp: t.Timestamp, proton.float32: t.Float, proton.char: t.Char,
        proton.symbol: t.Symbol,
    }  # fmt: skip
    for kind, ours in kinds.items():
        if type(value) is kind:
            return ours(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, proton.decimal32):
        return t.Decimal32(int(value).to_bytes(4, "big"))
    if isinstance(value, proton.decimal64):
        return t.Decimal64(int(value).to_bytes(8, "big"))
    if isinstance(value, proton.decimal128):
        return t.Decimal128(bytes(value))
    if isinstance(value, proton.Array):
        return t.Array(_OURS_BY_PROTON[value.type], [_ours(v) for v in value.elements])
    if isinstance(value, proton.Described):
        return t.Described(_ours(value.descriptor), _ours(value.value))
    if isinstance(value, list):
        return [_ours(v) for v in value]
    if isinstance(value, dict):
        return {_ours(k): _ours(v) for k, v in value.items()}
    return value


def _same(ours: Any, theirs: Any) -> None:
    """Equal, and of the same AMQP type, all the way down."""
    assert type(ours) is type(theirs), (ours, theirs)
    if isinstance(ours, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _same(a, b)
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs)
        for key in ours:
            _same(ours[key], theirs[key])
    elif isinstance(ours, t.Described):
        _same(ours.descriptor, theirs.descriptor)
        _same(ours.value, theirs.value)
    elif isinstance(ours, t.Array):
        assert t._wide(ours.code) == t._wide(theirs.code)
        _same(ours.items, theirs.items)
    elif isinstance(ours, float) and ours != ours:
        assert theirs != theirs
    else:
        assert ours == theirs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_what_we_encode_proton_decodes_type_for_type(pair: tuple[Any, Any]) -> None:
    ours, _theirs = pair
    _same(_proton_decode(t.encode(ours)), ours)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_what_proton_encodes_we_decode_type_for_type(pair: tuple[Any, Any]) -> None:
    ours, theirs = pair
    _same(t.decode(_proton_encode(theirs)), ours)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"\x40", None), (b"\x41", True), (b"\x42", False), (b"\x56\x01", True),
        (b"\x43", t.UInt(0)), (b"\x52\x07", t.UInt(7)), (b"\x70\x00\x00\x01\x00", t.UInt(256)),
        (b"\x44", t.ULong(0)), (b"\x53\x07", t.ULong(7)), (b"\x54\xff", t.Int(-1)),
        (b"\x55\xfe", -2), (b"\xa1\x01a", "a"), (b"\xb1\x00\x00\x00\x01a", "a"),
        (b"\xa3\x01a", t.Symbol("a")), (b"\xb3\x00\x00\x00\x01a", t.Symbol("a")),
        (b"\xa0\x01a", b"a"), (b"\xb0\x00\x00\x00\x01a", b"a"), (b"\x45", []),
        (b"\xc0\x02\x01\x40", [None]), (b"\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x40", [None]),
        (b"\xc1\x03\x02\x40\x41", {None: True}),
        (b"\xd1\x00\x00\x00\x06\x00\x00\x00\x02\x40\x41", {None: True}),
        (b"\xe0\x04\x02\x50\x01\x02", t.Array(t.UBYTE, [1, 2])),
        (b"\xf0\x00\x00\x00\x07\x00\x00\x00\x02\x50\x01\x02", t.Array(t.UBYTE, [1, 2])),
        (b"\xe0\x05\x01\x00\x53\x01\x40", t.Array(t.NULL, [None], t.ULong(1))),
    ],
)  # fmt: skip
def test_every_width_decodes(raw: bytes, value: Any) -> None:
    decoded = t.decode(raw)
    assert decoded == value
    assert type(decoded) is type(value)


def test_the_narrowest_form_is_written() -> None:
    assert t.encode(t.UInt(0)) == b"\x43"
    assert t.encode(t.UInt(255)) == b"\x52\xff"
    assert t.encode([]) == b"\x45"
    assert t.encode("x" * 255)[:2] == b"\xa1\xff"
    assert t.encode("x" * 256)[:5] == b"\xb1\x00\x00\x01\x00"
    assert t.encode(["x" * 300])[:1] == b"\xd0"
    assert t.encode({t.Symbol("k"): 1})[:1] == b"\xc1"


@pytest.mark.parametrize(
    "value",
    [t.UByte(256), t.UInt(-1), t.Int(2**31), 2**63, t.Char("ab"), t.Symbol("é"), object(),
     t.Decimal32(b"12345")],
)  # fmt: skip
def test_what_no_amqp_type_holds_is_refused(value: Any) -> None:
    with pytest.raises(t.EncodeError):
        t.encode(value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES, st.data())
def test_cut_and_corrupted_values_raise_decode_error_only(
    pair: tuple[Any, Any], data: st.DataObject
) -> None:
    raw = bytearray(t.encode(pair[0]))
    if raw:
        cut = data.draw(st.integers(0, len(raw)))
        raw = raw[:cut]
    for _ in range(data.draw(st.integers(0, 3))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(t.DecodeError):
        t.decode(bytes(raw))


def test_deep_nesting_is_refused() -> None:
    raw = b"\xc0\x03\x01" * 100 + b"\x40"
    with pytest.raises(t.DecodeError, match="deep"):
        t.decode(raw)


def test_a_huge_count_in_few_bytes_is_refused_at_once() -> None:
    with pytest.raises(t.DecodeError):
        t.decode(b"\xd0\x00\x00\x00\x08\xff\xff\xff\xff" + b"\x40" * 4)
    with pytest.raises(t.DecodeError):
        t.decode(b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40")


def test_skip_value_matches_decode() -> None:
    raw = t.encode([t.Described(t.ULong(1), {"a": [1, 2.5]}), t.Array(t.SYM32, [t.Symbol("x")])])
    assert t.skip_value(raw, 0) == len(raw)
    with pytest.raises(t.DecodeError):
        t.skip_value(raw[:-1], 0)


# -- composites -----------------------------------------------------------------------------


def test_performatives_are_written_with_every_field() -> None:
    encoded = t.encode(Open("c").described())
    assert encoded[:5] == bytes((0x00, 0x53, 0x10, 0xC0, len(encoded) - 5))
    assert encoded[5] == 10  # all ten fields, trailing nulls included
    attach = Attach("n", 1, True, source=Source("events"))
    assert t.decode(t.encode(attach.described())).value.__len__() == 14
    assert len(t.decode(t.encode(Disposition(True, 1).described())).value) == 6


def test_performatives_round_trip_through_proton() -> None:
    attach = Attach(
        "link", 3, True, source=Source("events", filter={t.Symbol("f"): "x"}),
        properties={t.Symbol("p"): 1}, max_message_size=1024,
    )  # fmt: skip
    data = Data()
    data.decode(t.encode(attach.described()))
    data.rewind()
    data.next()
    theirs: Any = data.get_object()
    assert theirs.descriptor == 0x12
    assert theirs.value[0] == "link"
    assert type(theirs.value[1]) is proton.uint
    assert type(theirs.value[10]) is proton.ulong
    again = from_described(t.decode(_proton_encode(theirs)))
    assert again == attach


def test_defaults_fill_in_and_mandatory_fields_are_checked() -> None:
    decoded = from_described(t.Described(t.ULong(0x14), [t.UInt(0)]))
    assert decoded == Transfer(0)
    assert decoded.more is False
    with pytest.raises(BadComposite, match="mandatory"):
        from_described(t.Described(t.ULong(0x12), ["name-only"]))
    with pytest.raises(BadComposite, match="wrong type"):
        from_described(t.Described(t.ULong(0x14), ["not a handle"]))
    by_name = from_described(t.Described(t.Symbol("amqp:open:list"), ["c"]))
    assert by_name == Open("c")


def test_uuid_and_char_and_timestamp_keep_their_types() -> None:
    value = [uuid.UUID(int=7), t.Char("€"), t.Timestamp(-5)]
    assert [type(v) for v in t.decode(t.encode(value))] == [uuid.UUID, t.Char, t.Timestamp]
    assert struct.unpack(">q", t.encode(t.Timestamp(-5))[1:])[0] == -5


def test_bytearrays_and_memoryviews_are_read_and_written_as_bytes() -> None:
    """What a buffer holds decodes as the same bytes do, and a bytearray or memoryview is
    written as binary (the compiled codec takes every buffer its types name)."""
    value = t.Described(t.ULong(0x75), [b"\x00\x01", "text", t.Symbol("s"), {"k": 1}])
    raw = t.encode(value)
    for buffer in (bytearray(raw), memoryview(raw)):
        assert t.decode(buffer) == value
        assert t.skip_value(buffer, 0) == len(raw)
    assert (
        t.encode(bytearray(b"\x00\x01")) == t.encode(memoryview(b"\x00\x01")) == b"\xa0\x02\x00\x01"
    )
