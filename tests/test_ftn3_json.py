"""The JSON of FTN3 messages: orjson where it agrees with the standard library's strict codec,
the standard library where it does not. Whatever path a value takes, the decoded value, the
refusals and the value an encoding stands for are those of the standard library."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futoin_evt.ftn3.errors import ProtocolViolation, RefusedMessage
from futoin_evt.ftn3.messages import decode_frame, decode_json, encode_json

#: Scalars as JSON has them, with integers far beyond 64 bits and text with any code point
#: (lone surrogates included).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def reference_decode(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(name)

    return json.JSONDecoder(parse_constant=refuse).decode(text)


def same(a: Any, b: Any) -> bool:
    """Equal, with types: 1 and 1.0 and True differ, -0.0 and 0.0 differ."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(json_values)
def test_decoding_gives_the_standard_librarys_value(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: only the escaped form is UTF-8
        text = json.dumps(value)
        data = text.encode()
    assert same(decode_json(data), reference_decode(text))


@given(json_values)
def test_encoding_stands_for_the_same_value(value: Any) -> None:
    text = encode_json(value)
    text.encode("utf-8")  # always valid UTF-8
    assert same(reference_decode(text), reference_decode(json.dumps(value)))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1, {"x": math.nan}]])
def test_nan_and_infinity_are_refused_when_encoding(value: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_json(value)


@pytest.mark.parametrize(
    "number",
    [
        "18446744073709551616",  # 2**64: orjson would make it a float
        "-9223372036854775809",
        "1" + "0" * 100,
        "1234567890123456789",
    ],
)
def test_integers_beyond_64_bits_stay_exact(number: str) -> None:
    msg = decode_frame(f'{{"rid":"C1","p":{{"n":{number}}}}}'.encode())
    assert msg["p"]["n"] == int(number)
    assert encode_json(msg["p"]) == f'{{"n":{number}}}'


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b'{"rid":"C1","p":{"n":1e999}}', "out of range"),
        (b'{"rid":"C1","p":{"n":-1E400}}', "out of range"),
        (b'{"rid":"C1","p":{"n":' + b"9" * 4301 + b"}}", "4300 digits"),
        (b'{"rid":"C1","p":{"s":"\\ud800"}}', "lone surrogate"),
    ],
)
def test_refusals_keep_their_reasons(frame: bytes, reason: str) -> None:
    with pytest.raises(RefusedMessage) as info:
        decode_frame(frame)
    assert reason in info.value.desc


@pytest.mark.parametrize("frame", [b"NaN", b'{"rid":"C1","x":NaN}', b'{"rid":"C1","x":Infinity}'])
def test_nan_and_infinity_are_not_json(frame: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame(frame)
