"""Our SASL server layer, without sockets: frames in, frames out."""

from __future__ import annotations

import struct
from typing import Any, cast

import pytest
from proton import Data, Described, symbol, ulong

from futoin_evt.amqp.sasl import (
    AMQP_HEADER,
    MAX_PIPELINED,
    MAX_SASL_FRAME,
    SASL_HEADER,
    Outcome,
    SaslError,
    SaslInit,
    SaslServer,
    encode_sasl_frame,
)
from futoin_evt.auth.plain import parse_plain


def init_frame(mechanism: str, response: bytes | None) -> bytes:
    return encode_sasl_frame(0x41, [symbol(mechanism), response])


def decode_frames(raw: bytes) -> list[object]:
    frames = []
    while raw:
        (size,) = struct.unpack_from(">I", raw)
        body = Data()
        body.decode(raw[8:size])
        body.rewind()
        body.next()
        frames.append(body.get_object())
        raw = raw[size:]
    return frames


def test_plain_login_then_amqp() -> None:
    server = SaslServer(["PLAIN", "ANONYMOUS"])
    assert server.receive(SASL_HEADER) is None
    out = server.data_to_send()
    assert out.startswith(SASL_HEADER)
    (mechanisms,) = decode_frames(out[len(SASL_HEADER) :])
    assert isinstance(mechanisms, Described)
    assert mechanisms.descriptor == ulong(0x40)
    offered = cast(list[Any], mechanisms.value)[0]
    assert list(offered.elements) == ["PLAIN", "ANONYMOUS"]
    # the peer may send its AMQP header and more right behind the init (pipelining)
    init = server.receive(init_frame("PLAIN", b"\0alice\0pw") + AMQP_HEADER + b"rest")
    assert init == SaslInit("PLAIN", b"\0alice\0pw")
    assert not server.done
    server.outcome(Outcome.OK)
    (outcome,) = decode_frames(server.data_to_send())
    assert isinstance(outcome, Described)
    assert outcome.value == [0]
    assert server.done
    assert server.take_rest() == b"rest"


def test_frames_may_arrive_byte_by_byte() -> None:
    server = SaslServer(["PLAIN"])
    inits = [server.receive(bytes([b])) for b in SASL_HEADER + init_frame("PLAIN", b"\0a\0b")]
    assert inits[-1] == SaslInit("PLAIN", b"\0a\0b")
    assert inits[:-1] == [None] * (len(inits) - 1)


def test_a_peer_may_not_pile_up_data_while_its_login_is_checked() -> None:
    server = SaslServer(["PLAIN"])
    assert server.receive(SASL_HEADER + init_frame("PLAIN", b"\0a\0b")) is not None
    assert server.receive(AMQP_HEADER + b"x" * 1000) is None  # pipelined: kept
    with pytest.raises(SaslError, match="too much data"):
        server.receive(b"x" * MAX_PIPELINED)
    assert server.failed


def test_what_follows_a_successful_login_must_be_amqp() -> None:
    server = SaslServer(["PLAIN"])
    server.receive(SASL_HEADER + init_frame("PLAIN", b"\0a\0b") + b"GET / HTTP/1.1")
    with pytest.raises(SaslError, match="AMQP protocol header"):
        server.outcome(Outcome.OK)
    assert server.failed


def test_failed_login_ends_the_exchange() -> None:
    server = SaslServer(["PLAIN"])
    server.receive(SASL_HEADER + init_frame("PLAIN", b"\0a\0wrong"))
    server.data_to_send()
    server.outcome(Outcome.AUTH)
    (outcome,) = decode_frames(server.data_to_send())
    assert isinstance(outcome, Described)
    assert outcome.value == [1]
    assert server.failed
    assert server.receive(AMQP_HEADER) is None
    assert not server.done


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (AMQP_HEADER, "SASL protocol header is required"),
        (b"GET / HTTP/1.1\r\n", "SASL protocol header is required"),
        (SASL_HEADER + init_frame("CRAM-MD5", b""), "mechanism not offered"),
        (SASL_HEADER + struct.pack(">IBBH", MAX_SASL_FRAME + 1, 2, 1, 0), "bad SASL frame"),
        (SASL_HEADER + struct.pack(">IBBH", 8, 2, 0, 0), "bad SASL frame"),
        (SASL_HEADER + struct.pack(">IBBH", 4, 2, 1, 0), "bad SASL frame size"),
        (SASL_HEADER + struct.pack(">IBBH", 12, 2, 1, 0) + b"\xff\xff\xff\xff", "undecodable"),
        (SASL_HEADER + encode_sasl_frame(0x44, [0]), "expected sasl-init"),
        (SASL_HEADER + encode_sasl_frame(0x41, [symbol("PLAIN"), "text"]), "not binary"),
    ],
)
def test_broken_exchanges_are_refused(data: bytes, reason: str) -> None:
    server = SaslServer(["PLAIN"])
    with pytest.raises(SaslError, match=reason):
        server.receive(data)
    assert server.data_to_send().startswith(SASL_HEADER)  # our header goes out before closing
    assert server.failed


@pytest.mark.parametrize(
    ("response", "credentials"),
    [
        (b"\0alice\0pw", ("alice", "pw")),
        (b"alice\0alice\0pw", ("alice", "pw")),
        (b"\0alice\0", ("alice", "")),
        (b"bob\0alice\0pw", None),  # acting as another user is not supported
        (b"\0\0pw", None),
        (b"alice\0pw", None),
        (b"\0alice\0p\0w", None),
        (b"\0\xff\0pw", None),
    ],
)
def test_parse_plain(response: bytes, credentials: tuple[str, str] | None) -> None:
    assert parse_plain(response) == credentials
