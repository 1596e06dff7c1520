"""AMQP frames (part 2.3): cutting a byte stream into frames, and writing them.

A frame is an 8-byte header (size, data offset in 4-byte words, type, channel), an extended
header nobody uses, and a body: a described performative and, for a transfer, the payload
after it.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from .performatives import BadComposite, Composite, composite_class
from .types import DecodeError, Described, Symbol, ULong, encode_into

HEADER: Final = struct.Struct(">IBBH")
HEADER_BYTES: Final = 8
AMQP_FRAME: Final = 0
SASL_FRAME: Final = 1
AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
#: The spec's floor for max-frame-size: every peer takes frames this large.
MIN_MAX_FRAME_SIZE: Final = 512
EMPTY_FRAME: Final = HEADER.pack(HEADER_BYTES, 2, AMQP_FRAME, 0)


class FramingError(DecodeError):
    """A frame header that breaks the framing: the connection cannot go on."""


class FrameReader:
    """Cuts bytes into frames of at most ``max_frame_size`` bytes. Holds only the start of an
    incomplete frame."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        #: Bytes the incomplete frame needs before it is worth reading again.
        self._needed = HEADER_BYTES

    @property
    def buffered(self) -> int:
        return self._pending_bytes

    def feed(self, data: bytes) -> list[tuple[int, int, memoryview]]:
        """(type, channel, body) of each complete frame; an empty frame has an empty body.
        The bodies stay valid (they view bytes nobody changes). Raises :class:`FramingError`
        at a header that cannot be a frame of ours."""
        if self._pending:
            self._pending.append(data)
            self._pending_bytes += len(data)
            if self._pending_bytes < self._needed:
                return []
            buffer = b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
        else:
            buffer = data
        view = memoryview(buffer)
        frames = []
        position, length = 0, len(buffer)
        unpack = HEADER.unpack_from
        needed = HEADER_BYTES
        while length - position >= HEADER_BYTES:
            size, doff, kind, channel = unpack(buffer, position)
            if size < HEADER_BYTES:
                raise FramingError(f"a frame of {size} bytes is smaller than its header")
            if size > self.max_frame_size:
                raise FramingError(
                    f"a frame of {size} bytes is above the maximum of {self.max_frame_size}"
                )
            if doff < 2 or doff * 4 > size:
                raise FramingError(f"a data offset of {doff} words in a {size}-byte frame")
            end = position + size
            if end > length:
                needed = size
                break
            frames.append((kind, channel, view[position + doff * 4 : end]))
            position = end
        if position < length:
            rest = buffer[position:] if position else buffer
            self._pending.append(bytes(rest))
            self._pending_bytes = len(rest)
        self._needed = needed
        return frames


def decode_body(body: memoryview) -> tuple[Composite, memoryview]:
    """The performative (or SASL frame) of a frame body, and the payload after it.

    Raises :class:`DecodeError` (:class:`BadComposite` with the AMQP condition to close with).
    """
    from .types import decode_value  # local: keep the hot names below few

    value, end = decode_value(body, 0)
    if not isinstance(value, Described):
        raise BadComposite("a frame body that is not a described performative", "amqp:decode-error")
    descriptor = value.descriptor
    cls = composite_class(descriptor) if type(descriptor) is ULong else None
    if cls is None and type(descriptor) is Symbol:
        from .performatives import _BY_NAME

        cls = _BY_NAME.get(descriptor)
    if cls is None:
        raise BadComposite(f"not a performative: {descriptor!r:.60}", "amqp:decode-error")
    return cls.from_fields(value.value), body[end:]


def encode_frame(
    out: bytearray,
    channel: int,
    performative: Composite | Described,
    payload: bytes | memoryview = b"",
    kind: int = AMQP_FRAME,
) -> None:
    """Append one frame to ``out``."""
    start = len(out)
    out += EMPTY_FRAME
    if isinstance(performative, Composite):
        performative.encode_into(out)
    else:
        encode_into(performative, out)
    out += payload
    HEADER.pack_into(out, start, len(out) - start, 2, kind, channel)


def frame_bytes(channel: int, performative: Any, payload: bytes = b"", kind: int = 0) -> bytes:
    out = bytearray()
    encode_frame(out, channel, performative, payload, kind)
    return bytes(out)
