"""FTN3 message envelope: decoding, request checks, encoding."""

from __future__ import annotations

import json

import pytest

from futoin_evt.ftn3.errors import FTN3Error, ProtocolViolation
from futoin_evt.ftn3.messages import (
    EncodedJson,
    decode_frame,
    encode_error,
    encode_json,
    encode_request,
    encode_result,
    parse_request,
    parse_response,
    parse_size,
)


def test_request_round_trip() -> None:
    frame = encode_request("C7", "futoin.evt.gen:1.1:addEvent", {"type": "A", "data": [1]}, "u:p")
    request = parse_request(decode_frame(frame))
    assert (request.rid, request.iface, request.major, request.minor, request.func) == (
        "C7",
        "futoin.evt.gen",
        1,
        1,
        "addEvent",
    )
    assert request.params == {"type": "A", "data": [1]}
    assert request.sec == "u:p"
    assert request.f == "futoin.evt.gen:1.1:addEvent"


@pytest.mark.parametrize("frame", [b"\xff\xfe", b"{", b"[1]", b'"x"', b"null", b"NaN"])
def test_frames_that_are_not_json_objects_are_protocol_violations(frame: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame(frame)


@pytest.mark.parametrize("rid", [None, 1, "", "X1", "C", "C1a", "C12345678901"])
def test_a_message_needs_a_valid_rid(rid: object) -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame(json.dumps({"f": "a:1.0:b", "rid": rid}))


def test_deep_nesting_is_a_protocol_violation_not_a_crash() -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    ("msg", "desc"),
    [
        ({"rid": "C1"}, "Invalid req.f"),
        ({"rid": "C1", "f": "Futoin.evt:1.0:x"}, "Invalid req.f"),
        ({"rid": "C1", "f": "futoin.evt:1:x"}, "Invalid req.f"),
        ({"rid": "C1", "f": "futoin.evt:1.0:X"}, "Invalid req.f"),
        ({"rid": "C1", "f": 5}, "Invalid req.f"),
        ({"rid": "C1", "f": "a:1.0:b", "p": []}, "Invalid req.p"),
        ({"rid": "C1", "f": "a:1.0:b", "p": {"Bad": 1}}, "Invalid parameter name: Bad"),
        ({"rid": "C1", "f": "a:1.0:b", "sec": 5}, "Invalid req.sec"),
        ({"rid": "C1", "f": "a:1.0:b", "x": 1}, "Unknown request key: x"),
    ],
)
def test_invalid_requests(msg: dict[str, object], desc: str) -> None:
    with pytest.raises(FTN3Error) as info:
        parse_request(msg)
    assert info.value.name == "InvalidRequest"
    assert info.value.desc == desc


def test_optional_request_keys_are_accepted() -> None:
    request = parse_request({"rid": "C1", "f": "a:1.0:b", "forcersp": True, "obf": {}})
    assert request.params == {}


def test_replies_carry_only_ftn3_keys() -> None:
    assert json.loads(encode_result("C1", {"echo": 1})) == {"r": {"echo": 1}, "rid": "C1"}
    assert json.loads(encode_result("C2", EncodedJson('[{"a":1}]'))) == {
        "r": [{"a": 1}],
        "rid": "C2",
    }
    assert json.loads(encode_error("C3", "NotRegistered", "no")) == {
        "e": "NotRegistered",
        "edesc": "no",
        "rid": "C3",
    }


def test_responses() -> None:
    assert parse_response({"rid": "S1", "r": False}).result is False
    error = parse_response({"rid": "S1", "e": "InternalError", "edesc": "x"})
    assert (error.error, error.error_desc) == ("InternalError", "x")
    assert parse_response({"rid": "S1", "r": 1, "extra": 2}).error == "InternalError"


def test_lone_surrogates_still_encode_to_valid_utf8() -> None:
    text = encode_json({"s": "\ud800x", "u": "é"})
    text.encode("utf-8")
    assert json.loads(text) == {"s": "\ud800x", "u": "é"}


def test_sizes() -> None:
    assert parse_size("8M") == 8 * 1024 * 1024
    assert parse_size("64K") == 65536
    assert parse_size(100) == 100
    with pytest.raises(ValueError, match="invalid message size"):
        parse_size("8G")
