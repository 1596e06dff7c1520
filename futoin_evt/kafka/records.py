"""Kafka's record batches (magic 2), read from a Produce and written for a Fetch. No I/O here.

A batch is a 61-byte header (base offset, length, partition leader epoch, magic, CRC32C of
everything after it, attributes, last offset delta, first and max timestamps, producer id,
epoch and base sequence, record count) then its records, compressed together when the
attributes name a codec (:mod:`.compression`). A record is a varint length then attributes,
a timestamp delta (varlong), an offset delta, a key, a value (varint length, -1 for null) and
headers (a varint count of UTF-8 keys and nullable values); the varints are zigzag-encoded, as
Protocol Buffers' sint32/sint64.

:func:`decode_batches` reads the ``records`` field of a Produce partition and trusts nothing
in it: whatever it is sent, it returns batches or raises :class:`CorruptBatch` (Kafka's
CORRUPT_MESSAGE), :class:`UnsupportedMagic` for the message sets of magic 0 and 1
(UNSUPPORTED_FOR_MESSAGE_FORMAT); ``max_records`` and ``max_bytes`` bound what a request can
make the server hold. It checks the format, not Kafka's rules about what a producer may send
(one batch per partition, offset deltas 0 to n-1, sequence numbers): the door applies those.

:func:`encode_batch` writes one batch as a broker serves it; the ``records`` field of a Fetch
partition is its batches one after the other, so ``b"".join(batches)`` is the whole field.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from google_crc32c import extend as crc32c_extend
from google_crc32c import value as crc32c

from .compression import CorruptBatch, OutputTooLarge, UnsupportedCodec, compress, decompress

__all__ = [
    "CorruptBatch",
    "Record",
    "RecordBatch",
    "UnsupportedCodec",
    "UnsupportedMagic",
    "decode_batches",
    "encode_batch",
]

MAGIC: Final = 2
#: The attribute bits besides the codec (bits 0-2).
LOG_APPEND_TIME: Final = 0x08
TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20
_CODEC_MASK: Final = 0x07

#: Base offset and length: what precedes the part of a batch its length counts.
_LOG_OVERHEAD: Final = 12
#: The header up to the CRC (base offset, length, leader epoch, magic, CRC), and after it.
_BEFORE_CRC: Final = struct.Struct(">qiibI")
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
_HEADER_SIZE: Final = 61
_CRC_END: Final = 21
_MAGIC_AT: Final = 16
_OFFSET_LENGTH: Final = struct.Struct(">qi")
_HEADER: Final = struct.Struct(">qiibIhiqqqhii")

#: The zigzag varints of -1 to _SMALL_LIMIT - 1, by value + 1: lengths and deltas of records.
_SMALL_LIMIT: Final = 2048


class Record(NamedTuple):
    """A record of a batch: its offset and timestamp are the batch's base offset and first
    timestamp plus its deltas (with log append time, every record's time is the batch's max
    timestamp)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class RecordBatch(NamedTuple):
    """A decoded batch: its header's fields and its records, decompressed."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[Record]

    @property
    def compression(self) -> int:
        """The codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _CODEC_MASK

    @property
    def log_append_time(self) -> bool:
        """Whether the timestamps are the broker's (LogAppendTime) rather than the
        producer's (CreateTime)."""
        return bool(self.attributes & LOG_APPEND_TIME)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        """A control batch (a transaction's commit or abort marker), written by brokers."""
        return bool(self.attributes & CONTROL)


class UnsupportedMagic(CorruptBatch):
    """A message set of magic 0 or 1, the formats before record batches."""


def _read_varint(data: bytes, position: int, most: int) -> tuple[int, int]:
    """A zigzag varint of at most ``most`` bytes (5 for an int32, 10 for an int64) at
    ``position``, and the position after it."""
    unsigned = 0
    shift = 0
    stop = position + most
    while True:
        byte = data[position]
        position += 1
        unsigned |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (unsigned >> 1) ^ -(unsigned & 1), position
        if position >= stop:
            raise CorruptBatch(f"a varint is longer than {most} bytes")
        shift += 7


def decode_batches(data: bytes, *, max_records: int, max_bytes: int) -> list[RecordBatch]:
    """The record batches of ``data`` (a Produce partition's ``records``: one or more batches,
    whole, and nothing after them), their records decompressed.

    Raises :class:`CorruptBatch` when a batch is not valid (truncated, CRC mismatch, records
    that do not fill the batch exactly, ...), when the batches hold more than ``max_records``
    records, or more than ``max_bytes`` bytes of records once decompressed (the headers are
    not counted); :class:`UnsupportedMagic` for magic 0 and 1.
    """
    try:
        return _decode_batches(data, max_records, max_bytes)
    except (IndexError, struct.error):  # a varint running past the data
        raise CorruptBatch("a record runs past the end of the data") from None


def _decode_batches(data: bytes, max_records: int, max_bytes: int) -> list[RecordBatch]:
    batches: list[RecordBatch] = []
    records_left = max_records
    bytes_left = max_bytes
    position = 0
    size = len(data)
    while position < size:
        if position + _LOG_OVERHEAD > size:
            raise CorruptBatch("the data ends inside a batch's offset and length")
        if position + _MAGIC_AT < size:  # a message set of magic 0 or 1 may be shorter
            _check_magic(data[position + _MAGIC_AT])
        length = _OFFSET_LENGTH.unpack_from(data, position)[1]
        end = position + _LOG_OVERHEAD + length
        if length < _HEADER_SIZE - _LOG_OVERHEAD or end > size:
            raise CorruptBatch(f"a batch of length {length} does not fit in the data")
        (
            base_offset,
            _,
            leader_epoch,
            _,
            crc,
            attributes,
            last_offset_delta,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _HEADER.unpack_from(data, position)
        actual_crc = crc32c(data[position + _CRC_END : end])
        if actual_crc != crc:
            raise CorruptBatch(
                f"the batch at offset {base_offset} fails its CRC32C check"
                f" (computed {actual_crc:#010x}, the batch says {crc:#010x})"
            )
        if count < 0:
            raise CorruptBatch(f"a batch says it holds {count} records")
        if count > records_left:
            raise CorruptBatch(f"the batches hold more than {max_records} records")
        records_left -= count
        codec = attributes & _CODEC_MASK
        start = position + _HEADER_SIZE
        if codec:
            try:
                body = decompress(codec, data[start:end], bytes_left)
            except OutputTooLarge:
                raise CorruptBatch(_too_many_bytes(max_bytes)) from None
            start = 0
            body_end = len(body)
        else:
            body = data
            body_end = end
        bytes_left -= body_end - start
        if bytes_left < 0:
            raise CorruptBatch(_too_many_bytes(max_bytes))
        records = _decode_records(body, start, body_end, count)
        batches.append(
            RecordBatch(
                base_offset,
                leader_epoch,
                attributes,
                last_offset_delta,
                first_timestamp,
                max_timestamp,
                producer_id,
                producer_epoch,
                base_sequence,
                records,
            )
        )
        position = end
    return batches


def _too_many_bytes(max_bytes: int) -> str:
    return f"the batches hold more than {max_bytes} bytes of records (decompressed)"


def _check_magic(magic: int) -> None:
    if magic != MAGIC:
        if magic == 0 or magic == 1:
            raise UnsupportedMagic(f"a message set of magic {magic}: only magic 2 is supported")
        raise CorruptBatch(f"a batch of magic {magic}: Kafka's batches are of magic 2")


def _decode_records(data: bytes, position: int, end: int, count: int) -> list[Record]:
    """``count`` records filling ``data[position:end]`` exactly. The varints of one and two
    bytes (lengths and deltas up to 8191, null keys) are read inline; the reads past ``end`` that a
    corrupt record can make are caught by the check that each record ends at its length."""
    records: list[Record] = []
    for _ in range(count):
        byte = data[position]
        if byte < 0x80:
            length = (byte >> 1) ^ -(byte & 1)
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            length = (byte >> 1) ^ -(byte & 1)
            position += 2
        else:
            length, position = _read_varint(data, position, 5)
        record_end = position + length
        if length < 0 or record_end > end:
            raise CorruptBatch(f"a record of length {length} does not fit in its batch")
        position += 1  # its attributes: none are defined
        byte = data[position]
        if byte < 0x80:
            timestamp_delta = (byte >> 1) ^ -(byte & 1)
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            timestamp_delta = (byte >> 1) ^ -(byte & 1)
            position += 2
        else:
            timestamp_delta, position = _read_varint(data, position, 10)
        byte = data[position]
        if byte < 0x80:
            offset_delta = (byte >> 1) ^ -(byte & 1)
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            offset_delta = (byte >> 1) ^ -(byte & 1)
            position += 2
        else:
            offset_delta, position = _read_varint(data, position, 5)
        byte = data[position]
        if byte == 1:  # -1: null
            key: bytes | None = None
            position += 1
        else:
            if byte < 0x80:
                size = (byte >> 1) ^ -(byte & 1)
                position += 1
            elif data[position + 1] < 0x80:
                byte = (byte & 0x7F) | (data[position + 1] << 7)
                size = (byte >> 1) ^ -(byte & 1)
                position += 2
            else:
                size, position = _read_varint(data, position, 5)
            if size < 0 or size > record_end - position:
                raise CorruptBatch(f"a record key of length {size} does not fit in its record")
            key = data[position : position + size]
            position += size
        byte = data[position]
        if byte == 1:
            value: bytes | None = None
            position += 1
        else:
            if byte < 0x80:
                size = (byte >> 1) ^ -(byte & 1)
                position += 1
            elif data[position + 1] < 0x80:
                byte = (byte & 0x7F) | (data[position + 1] << 7)
                size = (byte >> 1) ^ -(byte & 1)
                position += 2
            else:
                size, position = _read_varint(data, position, 5)
            if size < 0 or size > record_end - position:
                raise CorruptBatch(f"a record value of length {size} does not fit in its record")
            value = data[position : position + size]
            position += size
        byte = data[position]
        if byte == 0:
            headers: list[tuple[str, bytes | None]] = []
            position += 1
        else:
            headers, position = _decode_headers(data, position, record_end)
        if position != record_end:
            raise CorruptBatch(f"a record's fields do not fill its length of {length} bytes")
        records.append(Record(offset_delta, timestamp_delta, key, value, headers))
    if position != end:
        raise CorruptBatch(f"a batch of {count} records has {end - position} bytes after them")
    return records


def _decode_headers(
    data: bytes, position: int, end: int
) -> tuple[list[tuple[str, bytes | None]], int]:
    count, position = _read_varint(data, position, 5)
    if count < 0 or count > (end - position) // 2:  # a header is 2 bytes at least
        raise CorruptBatch(f"a record says it has {count} headers")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        size, position = _read_varint(data, position, 5)
        if size < 0 or size > end - position:
            raise CorruptBatch(f"a header key of length {size} does not fit in its record")
        try:
            name = data[position : position + size].decode()
        except UnicodeDecodeError:
            raise CorruptBatch("a header key is not UTF-8") from None
        position += size
        size, position = _read_varint(data, position, 5)
        if size == -1:
            headers.append((name, None))
            continue
        if size < 0 or size > end - position:
            raise CorruptBatch(f"a header value of length {size} does not fit in its record")
        headers.append((name, data[position : position + size]))
        position += size
    return headers, position


def _zigzag_varint(value: int) -> bytes:
    """The zigzag varint of an int64."""
    unsigned = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)


_SMALL: Final = tuple(_zigzag_varint(value) for value in range(-1, _SMALL_LIMIT))


def _varint(value: int) -> bytes:
    if -1 <= value < _SMALL_LIMIT:
        return _SMALL[value + 1]
    return _zigzag_varint(value)


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    *,
    timestamp_ms: int,
    log_append_time: bool = True,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytes:
    """One batch of ``records``, each (offset delta, key, value, headers), as a broker writes
    it for a Fetch: every record at ``timestamp_ms`` (the batch's first and max timestamps,
    record deltas 0), marked as log append time unless ``log_append_time`` is false (then
    create time), compressed with the codec id ``compression``. The last record's offset delta
    is the batch's last offset delta. Raises ValueError when ``records`` is empty and
    :class:`UnsupportedCodec` for an unknown codec id."""
    if not records:
        raise ValueError("a record batch holds one record at least")
    small = _SMALL
    parts: list[bytes] = []
    append = parts.append
    for offset_delta, key, value, headers in records:
        od = small[offset_delta + 1] if 0 <= offset_delta < _SMALL_LIMIT else _varint(offset_delta)
        size = 2 + len(od)  # the attributes and timestamp delta, both 0
        if key is None:
            key_size = b"\x01"
        else:
            size += len(key)
            key_size = small[len(key) + 1] if len(key) < _SMALL_LIMIT else _varint(len(key))
        if value is None:
            value_size = b"\x01"
        else:
            size += len(value)
            value_size = small[len(value) + 1] if len(value) < _SMALL_LIMIT else _varint(len(value))
        size += len(key_size) + len(value_size) + 1
        if headers:
            header_parts = _encode_headers(headers)
            size += len(header_parts) - 1
        else:
            header_parts = b"\x00"
        append(small[size + 1] if size < _SMALL_LIMIT else _varint(size))
        append(b"\x00\x00")
        append(od)
        append(key_size)
        if key is not None:
            append(key)
        append(value_size)
        if value is not None:
            append(value)
        append(header_parts)
    body = b"".join(parts)
    if compression:
        body = compress(compression, body)
    attributes = compression | LOG_APPEND_TIME if log_append_time else compression
    after_crc = _AFTER_CRC.pack(
        attributes,
        records[-1][0],
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    crc = crc32c_extend(crc32c(after_crc), body)
    before_crc = _BEFORE_CRC.pack(
        base_offset, _HEADER_SIZE - _LOG_OVERHEAD + len(body), partition_leader_epoch, MAGIC, crc
    )
    return b"".join((before_crc, after_crc, body))


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """A record's headers: their count and each key and value."""
    parts = [_varint(len(headers))]
    for name, value in headers:
        encoded = name.encode()
        parts.append(_varint(len(encoded)))
        parts.append(encoded)
        if value is None:
            parts.append(b"\x01")
        else:
            parts.append(_varint(len(value)))
            parts.append(value)
    return b"".join(parts)
