"""Kafka's record batches and their codecs, cross-checked with kafka-python's implementation:
what Kafka's clients produce decodes as they wrote it, what the door serves reads in their
reader as it was meant, and nothing a producer sends raises anything but CorruptBatch."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
import warnings
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import cramjam
import pytest
from google_crc32c import value as crc32c
from hypothesis import given
from hypothesis import strategies as st

from futoin_evt.kafka.compression import XERIAL_MAGIC, compress, decompress
from futoin_evt.kafka.records import (
    CorruptBatch,
    Record,
    RecordBatch,
    UnsupportedCodec,
    UnsupportedMagic,
    decode_batches,
    encode_batch,
)

with warnings.catch_warnings():  # kafka-python 3.0 reads its schemas with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.codec
    from kafka.record import default_records, legacy_records, util

# kafka-python's implementation, untyped.
DefaultRecordBatch: Any = default_records.DefaultRecordBatch
DefaultRecordBatchBuilder: Any = default_records.DefaultRecordBatchBuilder
LegacyRecordBatchBuilder: Any = legacy_records.LegacyRecordBatchBuilder
encode_varint: Any = util.encode_varint
snappy_encode: Any = kafka.codec.snappy_encode
gzip_encode: Any = kafka.codec.gzip_encode

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
MB = 1 << 20
TS = 1_700_000_000_000
Headers = list[tuple[str, bytes | None]]
#: (offset delta, timestamp delta, key, value, headers), as a producer sends them.
SENT: list[tuple[int, int, bytes | None, bytes | None, Headers]] = [
    (0, 0, b"order-1", b'{"total": 12}' * 20, []),
    (1, 5, None, b"no key" * 30, [("trace", b"abc"), ("trace", b"def")]),
    (2, -3, b"tombstone", None, [("empty", None), ("ünï", b"")]),
    (3, 70_000, b"", b"", []),
    (4, 1, b"k" * 3000, b"v" * 20_000, [("h" * 300, b"x" * 5000)]),
]


def _lz4_frame(data: bytes) -> bytes:
    """An LZ4 frame as the lz4 package writes it for kafka-python (with content checksum)."""
    compressor = cramjam.lz4.Compressor(block_linked=False)
    compressor.compress(data)
    return bytes(compressor.finish())


class _RawSnappy:
    """python-snappy's two functions, which kafka-python's xerial framing calls."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


@pytest.fixture(autouse=True, scope="module")
def kafka_python_codecs() -> Iterator[None]:
    """kafka-python finds its snappy, lz4 and zstd libraries (not installed here) in cramjam;
    its own gzip (the gzip module) and xerial framing stay as they are."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka.codec, "snappy", _RawSnappy)
        patch.setattr(kafka.codec, "lz4", _RawSnappy)  # only checked for presence
        patch.setattr(kafka.codec, "zstd", _RawSnappy)
        patch.setattr(default_records, "lz4_encode", _lz4_frame)
        patch.setattr(default_records, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(d)))
        patch.setattr(default_records, "zstd_encode", lambda d: bytes(cramjam.zstd.compress(d)))
        patch.setattr(default_records, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(d)))
        yield


def kafka_python_batch(
    codec: int,
    sent: Sequence[tuple[int, int, bytes | None, bytes | None, Headers]] = SENT,
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, transactional, *producer, batch_size=10 * MB)
    for offset_delta, timestamp_delta, key, value, headers in sent:
        builder.append(offset_delta, TS + timestamp_delta, key, value, headers)
    data = bytes(builder.build())
    assert data[22] & 7 == codec  # kafka-python sends uncompressed what does not shrink
    return data


def kafka_python_read(data: bytes) -> list[tuple[int, int, int, Any, Any, Headers]]:
    batch = DefaultRecordBatch(bytearray(data))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in batch]


def decoded(data: bytes) -> list[RecordBatch]:
    return decode_batches(data, max_records=1000, max_bytes=10 * MB)


def with_crc(batch: bytes | bytearray) -> bytes:
    """The batch with its CRC32C made right for what it holds."""
    return bytes(batch[:17]) + struct.pack(">I", crc32c(bytes(batch[21:]))) + bytes(batch[21:])


def batch_around(body: bytes, *, count: int, attributes: int = 0) -> bytes:
    """A batch header, written here from Kafka's layout, around the given records part."""
    after = struct.pack(">hiqqqhii", attributes, max(count - 1, 0), TS, TS, -1, -1, -1, count)
    return with_crc(struct.pack(">qiibI", 0, 49 + len(body), 0, 2, 0) + after + body)


def raw_record(*fields: int | bytes) -> bytes:
    """A record from its fields: ints as zigzag varints (kafka-python's), bytes as they are;
    its length is put in front."""
    body = bytearray()
    for field in fields:
        if isinstance(field, int):
            encode_varint(field, body.append)
        else:
            body += field
    length = bytearray()
    encode_varint(len(body), length.append)
    return bytes(length + body)


# -- what Kafka's clients produce ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_decode_as_written(codec: int) -> None:
    data = kafka_python_batch(codec, producer=(4711, 3, 100))
    (batch,) = decoded(data)
    assert batch.compression == codec
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4711, 3, 100)
    assert (batch.base_offset, batch.last_offset_delta) == (0, 4)
    assert (batch.first_timestamp, batch.max_timestamp) == (TS, TS + 70_000)
    assert not batch.log_append_time
    assert not batch.is_transactional
    assert not batch.is_control
    assert batch.records == [Record(*sent) for sent in SENT]


def test_a_transactional_batch_says_so() -> None:
    data = kafka_python_batch(NONE, producer=(9, 0, 0), transactional=True)
    assert decoded(data)[0].is_transactional


def test_raw_snappy_decodes_as_xerial_does() -> None:
    body = b"abc" * 1000 + b"xyz" * 20_000  # 16 blocks
    xerial = snappy_encode(body, xerial_compatible=True, xerial_blocksize=4096)
    assert xerial.startswith(XERIAL_MAGIC)
    raw = snappy_encode(body, xerial_compatible=False)
    assert decompress(SNAPPY, xerial, len(body)) == decompress(SNAPPY, raw, len(body)) == body


def test_several_batches_decode_in_order() -> None:
    first = kafka_python_batch(LZ4)
    second = kafka_python_batch(NONE, SENT[:2])
    batches = decoded(first + second + first)
    assert [len(batch.records) for batch in batches] == [5, 2, 5]
    assert decode_batches(b"", max_records=1, max_bytes=1) == []


# -- what the door serves -----------------------------------------------------------------------


def served(codec: int, log_append_time: bool = True) -> bytes:
    fetched = [(delta * 2, key, value, headers) for delta, _, key, value, headers in SENT]
    return encode_batch(
        1000,
        fetched,
        timestamp_ms=TS,
        log_append_time=log_append_time,
        compression=codec,
        producer_id=77,
        producer_epoch=1,
        base_sequence=5,
        partition_leader_epoch=3,
    )


@pytest.mark.parametrize("codec", CODECS)
def test_served_batches_read_in_kafka_python(codec: int) -> None:
    data = served(codec)
    assert kafka_python_read(data) == [
        (1000 + delta * 2, TS, 1, key, value, headers) for delta, _, key, value, headers in SENT
    ]
    batch = DefaultRecordBatch(bytearray(data))
    assert (batch.compression_type, batch.last_offset, batch.leader_epoch) == (codec, 1008, 3)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 1, 5)
    (ours,) = decoded(data)
    assert ours.log_append_time
    assert ours.records == [
        Record(delta * 2, 0, key, value, headers) for delta, _, key, value, headers in SENT
    ]


def test_create_time_when_asked() -> None:
    assert {ts_type for _, _, ts_type, *_ in kafka_python_read(served(NONE, False))} == {0}
    assert not decoded(served(NONE, False))[0].log_append_time


def test_a_fetch_is_its_batches_one_after_the_other() -> None:
    fetch = b"".join(
        encode_batch(offset, [(0, None, b"%d" % offset, [])], timestamp_ms=TS)
        for offset in range(5)
    )
    assert [[r.value for r in batch.records] for batch in decoded(fetch)] == [
        [b"0"],
        [b"1"],
        [b"2"],
        [b"3"],
        [b"4"],
    ]


def test_a_batch_holds_a_record_at_least() -> None:
    with pytest.raises(ValueError, match="one record"):
        encode_batch(0, [], timestamp_ms=TS)


#: Short, and past the lengths that the decoder reads inline (two varint bytes, up to 8191).
sizes = st.one_of(st.none(), st.binary(max_size=40), st.integers(8180, 8200).map(b"b".__mul__))
fields = st.tuples(
    st.integers(0, 2**31 - 1),
    sizes,
    sizes,
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5)))),
)


@given(st.lists(fields, min_size=1, max_size=5), st.sampled_from(CODECS))
def test_what_is_served_decodes_as_it_was(
    records: list[tuple[int, bytes | None, bytes | None, Headers]], codec: int
) -> None:
    (batch,) = decoded(encode_batch(2**40, records, timestamp_ms=-1, compression=codec))
    assert batch.records == [Record(delta, 0, k, v, h) for delta, k, v, h in records]
    assert batch.last_offset_delta == records[-1][0]


# -- what a producer may get wrong --------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_flipped_byte_fails_the_crc(codec: int) -> None:
    data = kafka_python_batch(codec, SENT[:3])
    for position in range(21, len(data), 7):
        damaged = bytearray(data)
        damaged[position] ^= 0x20
        with pytest.raises(CorruptBatch, match="CRC32C"):
            decoded(bytes(damaged))


def test_every_truncation_is_corrupt() -> None:
    data = kafka_python_batch(NONE, SENT[:3])
    whole = kafka_python_batch(NONE, SENT[:1])
    for size in range(1, len(data)):
        with pytest.raises(CorruptBatch):
            decoded(data[:size])
        with pytest.raises(CorruptBatch):
            decoded(whole + data[:size])


@pytest.mark.parametrize("magic", [0, 1])
def test_old_message_sets_are_unsupported(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic, 0, MB)
    builder.append(0, TS if magic else None, b"k", b"v")
    data = bytes(builder.build())
    with pytest.raises(UnsupportedMagic, match=f"magic {magic}"):
        decoded(data)
    with pytest.raises(UnsupportedMagic):
        decoded(kafka_python_batch(NONE) + data)


def test_an_unknown_magic_is_corrupt() -> None:
    data = bytearray(kafka_python_batch(NONE))
    data[16] = 3
    with pytest.raises(CorruptBatch, match="magic 3") as raised:
        decoded(bytes(data))
    assert not isinstance(raised.value, UnsupportedMagic)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_an_unknown_codec_is_unsupported(codec: int) -> None:
    with pytest.raises(UnsupportedCodec, match=f"codec {codec}"):
        decoded(batch_around(b"anything", count=1, attributes=codec))
    with pytest.raises(UnsupportedCodec):
        compress(codec, b"")
    assert issubclass(UnsupportedCodec, CorruptBatch)


@pytest.mark.parametrize(
    ("records", "count", "says"),
    [
        ([raw_record(0, 0, 0, -1, -1, 0)] * 2, 3, "runs past the end"),
        ([raw_record(0, 0, 0, -1, -1, 0)] * 2, 1, "bytes after them"),
        ([raw_record(0, 0, 0, -1, -1, 0)], -1, "-1 records"),
        ([raw_record(0, 0, 0, -1, -1, 0, b"\x00")], 1, "do not fill its length"),
        ([raw_record(0, 0, 0, -1, -1, 1, 2, b"\xff\xfe", -1)], 1, "not UTF-8"),
        ([raw_record(0, 0, 0, -1, -1, 1, -1, b"\x00\x00")], 1, "header key of length -1"),
        ([raw_record(0, 0, 0, -1, -1, -1)], 1, "-1 headers"),
        ([raw_record(0, 0, 0, -1, -1, 1000)], 1, "1000 headers"),
        ([raw_record(0, 0, 0, -2, -1, 0)], 1, "key of length -2"),
        ([raw_record(0, 0, 0, 50, -1, 0)], 1, "key of length 50"),
        ([raw_record(0, 0, 0, -1, 9, 0)], 1, "value of length 9"),
        ([raw_record(0, 0, b"\xff" * 6, b"\x00")], 1, "longer than 5 bytes"),
        ([b"\x01"], 1, "length -1"),
    ],
)
def test_malformed_records_are_corrupt(records: list[bytes], count: int, says: str) -> None:
    with pytest.raises(CorruptBatch, match=says):
        decoded(batch_around(b"".join(records), count=count))


def test_a_record_count_over_the_limit_is_refused() -> None:
    data = kafka_python_batch(NONE)
    assert len(decode_batches(data + data, max_records=10, max_bytes=MB)) == 2
    with pytest.raises(CorruptBatch, match="more than 9 records"):
        decode_batches(data + data, max_records=9, max_bytes=MB)


@pytest.mark.parametrize("codec", CODECS)
def test_records_over_max_bytes_are_refused(codec: int) -> None:
    data = kafka_python_batch(codec, SENT[:2])
    size = len(decompress(codec, data[61:], MB)) if codec else len(data) - 61
    assert len(decode_batches(data + data, max_records=10, max_bytes=2 * size)) == 2
    with pytest.raises(CorruptBatch, match=f"more than {2 * size - 1} bytes of records"):
        decode_batches(data + data, max_records=10, max_bytes=2 * size - 1)


# -- the codecs ---------------------------------------------------------------------------------


def _zeros(size: int) -> Iterator[bytes]:
    chunk = bytes(MB)
    for _ in range(size // MB):
        yield chunk


def _bomb(codec: int) -> bytes:
    """100 MB of zeros, compressed without holding them."""
    if codec == GZIP:
        deflate = zlib.compressobj(1, zlib.DEFLATED, 31)
        return b"".join([*(deflate.compress(chunk) for chunk in _zeros(100 * MB)), deflate.flush()])
    if codec == SNAPPY:  # the xerial framing: 100 blocks of 1 MB
        block = bytes(cramjam.snappy.compress_raw(bytes(MB)))
        return XERIAL_MAGIC + bytes(8) + (struct.pack(">i", len(block)) + block) * 100
    compressor = cramjam.lz4.Compressor() if codec == LZ4 else cramjam.zstd.Compressor()
    for chunk in _zeros(100 * MB):
        compressor.compress(chunk)
    return bytes(compressor.finish())


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_a_decompression_bomb_is_refused_without_inflating_it(codec: int) -> None:
    data = batch_around(_bomb(codec), count=1, attributes=codec)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBatch, match="more than 1048576 bytes"):
            decode_batches(data, max_records=10, max_bytes=MB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MB + 2 * len(data)  # the limit, a copy of the input: not 100 MB


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_decompression_is_bounded_to_the_byte(codec: int) -> None:
    data = bytes(range(256)) * 3000  # far more than a first guess at the output
    compressed = compress(codec, data)
    assert decompress(codec, compressed, len(data)) == data
    with pytest.raises(CorruptBatch, match=f"more than {len(data) - 1} bytes"):
        decompress(codec, compressed, len(data) - 1)
    assert decompress(codec, compress(codec, b""), 0) == b""


def test_gzip_of_several_members_is_one_data() -> None:
    members = zlib.compress(b"one ", 9, 31) + gzip_encode(b"two")
    assert decompress(GZIP, members, 100) == b"one two"


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_data_not_of_the_codec_is_corrupt(codec: int) -> None:
    valid = compress(codec, b"some data " * 100)
    for damaged in [b"", b"garbage" * 9, valid[: len(valid) // 2], valid[:-1], valid + b"x"]:
        if codec in (LZ4, ZSTD) and damaged == valid + b"x":
            continue  # both stop at the frame's end, as Kafka's readers do
        with pytest.raises(CorruptBatch, match=r"snappy|gzip|lz4|zstd"):
            decompress(codec, damaged, MB)


# -- whatever it is sent ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeds() -> list[bytes]:
    """A batch of each codec, from kafka-python."""
    return [kafka_python_batch(codec, SENT[:3]) for codec in CODECS]


def _decodes_or_is_corrupt(data: bytes) -> None:
    with contextlib.suppress(CorruptBatch):
        decode_batches(data, max_records=100, max_bytes=MB)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_batches_or_corrupt(data: bytes) -> None:
    _decodes_or_is_corrupt(data)
    _decodes_or_is_corrupt(b"\x00" * 8 + struct.pack(">i", len(data)) + data)


@given(st.sampled_from([GZIP, SNAPPY, LZ4, ZSTD]), st.binary(max_size=200))
def test_arbitrary_data_decompresses_or_is_corrupt(codec: int, data: bytes) -> None:
    with contextlib.suppress(CorruptBatch):
        decompress(codec, data, MB)
    with contextlib.suppress(CorruptBatch):
        decompress(codec, XERIAL_MAGIC + data, MB)


@given(
    st.sampled_from(CODECS),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10**6),
    st.booleans(),
)
def test_mutated_batches_are_batches_or_corrupt(
    seeds: list[bytes], codec: int, changes: list[tuple[int, int]], cut: int, fix_crc: bool
) -> None:
    """Also with their CRC made right, so that the mutations reach the records."""
    data = bytearray(seeds[codec])
    for position, byte in changes:
        data[position % len(data)] = byte
    data = data[: len(data) - cut % 8]
    _decodes_or_is_corrupt(with_crc(data) if fix_crc and len(data) > 21 else bytes(data))
