"""The compression codecs of Kafka's record batches, by their ids in a batch's attributes:
1 gzip, 2 snappy, 3 lz4, 4 zstd (0, none, never reaches here). No I/O here.

Every decompression is bounded: :func:`decompress` never holds more than ``max_bytes + 1``
bytes of output, so a small batch that inflates to gigabytes (a decompression bomb) costs at
most that much memory before it is refused. lz4 and zstd are decompressed into a buffer that
starts at a few times the input and doubles up to that bound; snappy says its length before
any work is done; gzip is inflated with an output limit.

The formats are those of Kafka's clients: gzip is the gzip file format (one member or
several); snappy is raw snappy or the xerial framing that the Java client and librdkafka write
(a 16-byte header then blocks of a big-endian int32 length and raw snappy), and is written raw,
which both read; lz4 is the LZ4 frame format with independent blocks, as Kafka's record batches
(magic 2) have it; zstd is zstd frames.

Data that is not valid for its codec raises :class:`CorruptBatch`, a too large output
:class:`OutputTooLarge` (a :class:`CorruptBatch`);
an unknown codec id raises :class:`UnsupportedCodec`, a :class:`CorruptBatch` too, so that the
door answers both with Kafka's CORRUPT_MESSAGE. :mod:`.records` re-exports both (they live
here so that the two modules do not import each other).
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

import cramjam

GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4

#: The names of the codecs, by id, for messages.
CODEC_NAMES: Final = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

#: What starts a snappy stream in the xerial framing: a marker byte, "SNAPPY", a NUL, then two
#: int32 (version and compatible version, ignored: some producers write them little-endian).
XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_INT32: Final = struct.Struct(">i")

#: The gzip file format for zlib (a window of 2**15 and a gzip header and trailer).
_GZIP_WBITS: Final = 31

#: The first output buffer of a bounded lz4 or zstd decompression: this many times the input,
#: and at least _FIRST_OUTPUT bytes.
_FIRST_RATIO: Final = 4
_FIRST_OUTPUT: Final = 16384
#: How the Rust I/O layer under cramjam says that the output buffer is full.
_OUTPUT_FULL: Final = "write whole buffer"


class CorruptBatch(ValueError):
    """A record batch that Kafka's broker would refuse as corrupt (CORRUPT_MESSAGE): its
    message says why, in one sentence."""


class UnsupportedCodec(CorruptBatch):
    """A compression codec id that Kafka does not define (5 to 7)."""


class OutputTooLarge(CorruptBatch):
    """Compressed data that decompresses to more than it may."""


def _unsupported(codec: int) -> UnsupportedCodec:
    return UnsupportedCodec(f"compression codec {codec} is not one of Kafka's")


def _too_large(name: str, max_bytes: int) -> OutputTooLarge:
    return OutputTooLarge(f"the {name} data decompresses to more than {max_bytes} bytes")


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """The data of a compressed batch, decompressed; raises :class:`CorruptBatch` when it is
    not valid for the codec or would be longer than ``max_bytes``."""
    max_bytes = max(max_bytes, 0)
    if codec in (LZ4, ZSTD):
        return _decompress_into(codec, data, max_bytes)
    if codec == SNAPPY:
        return _snappy_decompress(data, max_bytes)
    if codec == GZIP:
        return _gzip_decompress(data, max_bytes)
    raise _unsupported(codec)


def _decompress_into(codec: int, data: bytes, max_bytes: int) -> bytes:
    """lz4 or zstd through a buffer that doubles up to ``max_bytes + 1``."""
    name = CODEC_NAMES[codec]
    limit = max_bytes + 1
    size = min(limit, max(_FIRST_OUTPUT, len(data) * _FIRST_RATIO))
    while True:
        output = bytearray(size)
        try:
            if codec == LZ4:
                length = int(cramjam.lz4.decompress_into(data, output))
            else:
                length = int(cramjam.zstd.decompress_into(data, output))
        except cramjam.DecompressionError as error:
            if _OUTPUT_FULL not in str(error):
                raise CorruptBatch(f"the {name} data is not valid: {error}") from None
            if size >= limit:
                raise _too_large(name, max_bytes) from None
            size = min(limit, size * 2)
            continue
        if length > max_bytes:
            raise _too_large(name, max_bytes)
        return bytes(output) if length == size else bytes(memoryview(output)[:length])


def _snappy_decompress(data: bytes, max_bytes: int) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return _snappy_block(data, max_bytes)
    if len(data) < _XERIAL_HEADER_SIZE:
        raise CorruptBatch("the snappy data ends inside its xerial header")
    blocks: list[bytes] = []
    left = max_bytes
    position = _XERIAL_HEADER_SIZE
    end = len(data)
    while position < end:
        if position + 4 > end:
            raise CorruptBatch("the snappy data ends inside a block length")
        (length,) = _INT32.unpack_from(data, position)
        position += 4
        if length < 0 or position + length > end:
            raise CorruptBatch(f"a snappy block of {length} bytes does not fit in the data")
        block = _snappy_block(data[position : position + length], left)
        left -= len(block)
        blocks.append(block)
        position += length
    return b"".join(blocks)


def _snappy_block(data: bytes, max_bytes: int) -> bytes:
    """Raw snappy: its length comes first, checked before the output is allocated."""
    try:
        length = int(cramjam.snappy.decompress_raw_len(data))
    except cramjam.DecompressionError as error:
        raise CorruptBatch(f"the snappy data is not valid: {error}") from None
    if length > max_bytes:
        raise _too_large("snappy", max_bytes)
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as error:
        raise CorruptBatch(f"the snappy data is not valid: {error}") from None


def _gzip_decompress(data: bytes, max_bytes: int) -> bytes:
    """One gzip member after the other, each inflated with what is left of the limit."""
    members: list[bytes] = []
    left = max_bytes
    rest = data
    while True:
        inflater = zlib.decompressobj(_GZIP_WBITS)
        try:
            member = inflater.decompress(rest, left + 1)
        except zlib.error as error:
            raise CorruptBatch(f"the gzip data is not valid: {error}") from None
        if len(member) > left:
            raise _too_large("gzip", max_bytes)
        if not inflater.eof:
            raise CorruptBatch("the gzip data ends before its end")
        members.append(member)
        left -= len(member)
        rest = inflater.unused_data
        if not rest:
            return b"".join(members)


def compress(codec: int, data: bytes) -> bytes:
    """The data compressed with the codec (gzip at zlib's default level); raises
    :class:`UnsupportedCodec` for an id that is not one of Kafka's."""
    if codec == LZ4:
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == GZIP:
        return zlib.compress(data, zlib.Z_DEFAULT_COMPRESSION, _GZIP_WBITS)
    raise _unsupported(codec)
