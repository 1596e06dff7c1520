"""Outgoing performatives with every field written out.

AMQP lets an encoder leave trailing null fields out of a performative, and proton does. Some
clients read every field by position regardless (the Event Hubs SDK's pyamqp reads ``begin``'s
and ``attach``'s ``properties``, and finds a transfer's payload after its eleventh field), so
performatives are padded with nulls to their full length on the way out. Complete ones pass
through untouched; the scan costs one header read per frame.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Final

_FRAME_HEADER: Final = struct.Struct(">IBBH")
_FRAME_SIZE: Final = struct.Struct(">IBB")
_AMQP_FRAME: Final = 0
_PROTOCOL_HEADER_PREFIX: Final = b"AMQP"
_PROTOCOL_HEADER_BYTES: Final = 8
#: Performative descriptor (small ulong) -> number of fields it has (AMQP 1.0 part 2.7).
FULL_FIELDS: Final = {
    0x10: 10,  # open
    0x11: 8,  # begin
    0x12: 14,  # attach
    0x13: 11,  # flow
    0x14: 11,  # transfer
    0x15: 6,  # disposition
    0x16: 3,  # detach
    0x17: 1,  # end
    0x18: 1,  # close
}
_NULL: Final = 0x40
_LIST0: Final = 0x45
_LIST8: Final = 0xC0
_LIST32: Final = 0xD0


class FramePadder:
    """Feed it the engine's output in order; it returns the same bytes with short performatives
    padded. Holds back only an incomplete frame."""

    def __init__(self) -> None:
        self._carry = b""
        self._header_seen = False

    def feed(self, data: bytes | bytearray) -> bytes | bytearray:
        data = self._carry + data if self._carry else data
        self._carry = b""
        size_of, length = _FRAME_SIZE.unpack_from, len(data)
        position = 0
        if not self._header_seen:
            if length < _PROTOCOL_HEADER_BYTES:
                self._carry = bytes(data)
                return b""
            self._header_seen = True
            if data[:4] == _PROTOCOL_HEADER_PREFIX:
                position = _PROTOCOL_HEADER_BYTES
        out: list[bytes | bytearray] = []
        start = 0
        while position + _FRAME_HEADER.size <= length:
            size, doff, kind = size_of(data, position)
            end = position + size
            if size < _FRAME_HEADER.size or end > length:
                break
            body = position + doff * 4
            if kind == _AMQP_FRAME and data[body + 1] == 0x53 and data[body] == 0:
                fields = FULL_FIELDS.get(data[body + 2], 0)
                if fields and _is_short(data, body + 3, fields):
                    out.append(data[start:position])
                    out.append(_padded(bytes(data[position:end]), doff * 4, fields))
                    start = end
            position = end
        self._carry = bytes(data[position:])
        if not out:  # nothing padded: the bytes as they came, without a copy when whole
            return data if position == length else data[:position]
        out.append(data[start:position])
        return b"".join(out)


def _is_short(data: bytes | bytearray, list_at: int, fields: int) -> bool:
    """Whether the list at ``list_at`` has fewer than ``fields`` items."""
    code = data[list_at]
    if code == _LIST8:
        return data[list_at + 2] < fields
    if code == _LIST32:
        return int.from_bytes(data[list_at + 5 : list_at + 9], "big") < fields
    return code == _LIST0


def _padded(frame: bytes, body_offset: int, fields: int) -> bytes:
    """The frame with its performative's field list padded to ``fields``; unchanged when it
    is complete already or not a list we can read."""
    list_at = body_offset + 3
    code = frame[list_at] if list_at < len(frame) else None
    if code == _LIST0:
        count, items = 0, b""
    elif code == _LIST8 and list_at + 3 <= len(frame):
        size, count = frame[list_at + 1], frame[list_at + 2]
        items = frame[list_at + 3 : list_at + 2 + size]
    elif code == _LIST32 and list_at + 9 <= len(frame):
        size, count = struct.unpack_from(">II", frame, list_at + 1)
        items = frame[list_at + 9 : list_at + 5 + size]
    else:
        return frame
    end = list_at + 1 + (0 if code == _LIST0 else 2 if code == _LIST8 else 8) + len(items)
    if count >= fields or end > len(frame):
        return frame
    items += bytes([_NULL]) * (fields - count)
    if len(items) + 1 <= 255:
        encoded = bytes([_LIST8, len(items) + 1, fields]) + items
    else:
        encoded = bytes([_LIST32]) + struct.pack(">II", len(items) + 4, fields) + items
    rebuilt = frame[4:list_at] + encoded + frame[end:]
    return struct.pack(">I", len(rebuilt) + 4) + rebuilt


#: Event Hubs' batch message format: each ``data`` section of the body is a whole message.
BATCH_FORMAT: Final = 0x8001_3700
_ATTACH: Final = 0x12
_TRANSFER: Final = 0x14
#: Bytes of a frame read to find the fields we want; the rest is skipped unread.
_PREFIX_BYTES: Final = 256
#: Batch deliveries remembered at once (a peer that never completes them cannot grow it).
_MAX_BATCHES: Final = 4096
_BATCH_FORMAT_BYTES: Final = b"\x70" + BATCH_FORMAT.to_bytes(4, "big")


class BatchSniffer:
    """Finds the deliveries sent with :data:`BATCH_FORMAT` among the incoming frames.

    proton does not tell a delivery's message format, so the incoming bytes are read on their
    way to it: an ``attach`` gives each (channel, handle) its link name, and a ``transfer``
    with the batch format marks (link name, delivery tag). Only the first bytes of a frame are
    read, where they lie in the chunk; what cannot be parsed is left to proton, which refuses
    it.
    """

    def __init__(self) -> None:
        #: The start of a frame (or of the protocol header) that the next chunk completes.
        self._head = b""
        #: Bytes of the current frame still to come that need no reading.
        self._skip = 0
        self._header_seen = False
        self._lost = False
        self._links: dict[tuple[int, int], str] = {}
        self._batches: set[tuple[str, str]] = set()

    def feed(self, data: bytes) -> None:
        if self._lost:
            return
        if self._skip or self._head or not self._header_seen:
            data = self._align(data)
        size_of, length = _FRAME_SIZE.unpack_from, len(data)
        position = 0
        while position + _FRAME_HEADER.size <= length:
            size, doff, kind = size_of(data, position)
            if size < _FRAME_HEADER.size or doff < 2:
                self._lost = True  # not AMQP framing: proton refuses it and closes
                return
            prefix_end = position + min(size, _PREFIX_BYTES)
            if prefix_end > length:
                break
            if kind == _AMQP_FRAME:
                channel = int.from_bytes(data[position + 6 : position + 8], "big")
                self._read(channel, data[position + doff * 4 : prefix_end])
            position += size
        if position > length:
            self._skip = position - length
        elif position < length:
            self._head = data[position:]

    def _align(self, data: bytes) -> bytes:
        """Finish what earlier chunks began (skipped bytes, the protocol header, the first
        bytes of a frame); what is returned starts at a frame."""
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        if not self._header_seen:
            data, self._head = self._head + data, b""
            if len(data) < _PROTOCOL_HEADER_BYTES:
                self._head = data
                return b""
            self._header_seen = True
            return data[_PROTOCOL_HEADER_BYTES:]
        if self._head:
            data, self._head = self._head + data, b""
        return data

    def is_batch(self, link_name: str, tag: str) -> bool:
        """Whether that delivery was sent as a batch (asked once per delivery; ``tag`` as
        proton gives it, decoded as UTF-8)."""
        key = (link_name, tag)
        if key in self._batches:
            self._batches.discard(key)
            return True
        return False

    def _read(self, channel: int, body: bytes) -> None:
        if len(body) < 3 or body[1] != 0x53 or body[0] != 0:
            return
        kind = body[2]
        if kind == _TRANSFER:
            if _BATCH_FORMAT_BYTES not in body:
                return
        elif kind != _ATTACH:
            return
        fields = _leading_fields(body[3:], 4 if kind == _TRANSFER else 2)
        if kind == _ATTACH:
            if len(fields) == 2 and isinstance(fields[0], str) and isinstance(fields[1], int):
                self._links[(channel, fields[1])] = fields[0]
            return
        if len(fields) < 4 or fields[3] != BATCH_FORMAT or not isinstance(fields[2], bytes):
            return
        name = self._links.get((channel, fields[0])) if isinstance(fields[0], int) else None
        if name is not None and len(self._batches) < _MAX_BATCHES:
            # A tag that is not UTF-8 cannot come from proton either: it is not remembered.
            with contextlib.suppress(UnicodeDecodeError):
                self._batches.add((name, fields[2].decode("utf-8")))


_Field = int | str | bytes | None


def _leading_fields(encoded: bytes, count: int) -> list[_Field]:
    """The first ``count`` fields of a list, as far as they are nulls, uints, binaries or
    strings (what attach and transfer start with); fewer when the list is shorter or cut."""
    if not encoded:
        return []
    code = encoded[0]
    if code == _LIST8 and len(encoded) >= 3:
        available, position = encoded[2], 3
    elif code == _LIST32 and len(encoded) >= 9:
        available, position = int.from_bytes(encoded[5:9], "big"), 9
    else:
        return []
    fields: list[_Field] = []
    while len(fields) < min(count, available):
        field, position = _field(encoded, position)
        if position < 0:
            break
        fields.append(field)
    return fields


def _field(encoded: bytes, position: int) -> tuple[_Field, int]:
    """One primitive at ``position`` and where the next starts (-1: not one we read)."""
    if position >= len(encoded):
        return None, -1
    code = encoded[position]
    start = position + 1
    if code == _NULL:
        return None, start
    if code == 0x43:  # uint0
        return 0, start
    if code == 0x52:  # smalluint
        return (encoded[start], start + 1) if start < len(encoded) else (None, -1)
    if code == 0x70:  # uint
        end = start + 4
        return (
            (int.from_bytes(encoded[start:end], "big"), end) if end <= len(encoded) else (None, -1)
        )
    if code in (0xA0, 0xA1, 0xB0, 0xB1):  # binary / string, 1- or 4-byte length
        width = 1 if code in (0xA0, 0xA1) else 4
        length = int.from_bytes(encoded[start : start + width], "big")
        end = start + width + length
        if end > len(encoded):
            return None, -1
        raw = encoded[start + width : end]
        if code in (0xA0, 0xB0):
            return raw, end
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError:
            return None, -1
    return None, -1
