"""The outgoing performative padding and the incoming batch detection, over byte streams cut
anywhere (no server)."""

from __future__ import annotations

import itertools
import struct
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from proton import Connection, Data, Described, Transport, uint, ulong

from futoin_evt.amqp.frames import BATCH_FORMAT, FULL_FIELDS, BatchSniffer, FramePadder

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


def frame(channel: int, descriptor: int, fields: list[Any], payload: bytes = b"") -> bytes:
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    body = data.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def performatives(stream: bytes) -> list[Any]:
    position, found = len(AMQP_HEADER), []
    while position < len(stream):
        size, doff = struct.unpack_from(">IB", stream, position)
        data = Data()
        data.decode(stream[position + doff * 4 : position + size])
        data.rewind()
        data.next()
        performative = data.get_object()
        assert isinstance(performative, Described)
        assert isinstance(performative.value, list)
        # Binary fields come as views into the decoder's memory: copy them while it lives.
        fields = [bytes(v) if isinstance(v, memoryview) else v for v in performative.value]
        found.append(Described(performative.descriptor, fields))
        position += size
    return found


def proton_output() -> bytes:
    """What proton writes to open a connection, a session and two links, then a transfer."""
    connection = Connection()
    transport = Transport()
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("out")
    sender.target.address = "events"
    sender.open()
    session.receiver("in").open()
    out = bytes(transport.peek(transport.pending()) or b"")
    return out + frame(0, 0x14, [uint(0), uint(0), b"tag", uint(0)], b"\x00Sw\xa1\x01x")


def cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_padding_fills_every_performative_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    stream = proton_output()
    padder = FramePadder()
    padded = b"".join(padder.feed(chunk) for chunk in cut(stream, cuts))
    assert padded.startswith(AMQP_HEADER)
    before, after = performatives(stream), performatives(padded)
    assert [p.descriptor for p in after] == [p.descriptor for p in before]
    for short, full in zip(before, after, strict=True):
        assert len(full.value) == FULL_FIELDS[int(full.descriptor)]
        assert full.value[: len(short.value)] == short.value
        assert set(full.value[len(short.value) :]) <= {None}


def test_a_complete_performative_is_left_as_it_is() -> None:
    complete = AMQP_HEADER + frame(0, 0x17, [None])  # end, with its one field
    assert FramePadder().feed(complete) == complete


def batch_stream() -> bytes:
    attach = frame(1, 0x12, ["producer", uint(7), False])
    transfers = [
        frame(1, 0x14, [uint(7), uint(n), f"t{n}".encode(), uint(fmt)], b"\x00Sw@")
        for n, fmt in enumerate((BATCH_FORMAT, 0, BATCH_FORMAT))
    ]
    other_link = frame(2, 0x14, [uint(7), uint(9), b"t9", uint(BATCH_FORMAT)], b"x" * 300)
    return AMQP_HEADER + attach + b"".join(transfers) + other_link


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_batches_are_found_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    sniffer = BatchSniffer()
    for chunk in cut(batch_stream(), cuts):
        sniffer.feed(chunk)
    assert sniffer.is_batch("producer", "t0")
    assert not sniffer.is_batch("producer", "t0")  # asked once
    assert not sniffer.is_batch("producer", "t1")  # message format 0
    assert sniffer.is_batch("producer", "t2")
    assert not sniffer.is_batch("producer", "t9")  # a transfer on a channel with no such link


def test_garbage_stops_the_sniffer_but_not_the_caller() -> None:
    sniffer = BatchSniffer()
    sniffer.feed(AMQP_HEADER + b"\x00\x00\x00\x01garbage" + batch_stream())
    assert not sniffer.is_batch("producer", "t0")
