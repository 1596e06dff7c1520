"""Transfer frames the fast way: templates that write a one-frame delivery with its fields in
fixed widths, the fields of the general path (each of the eleven written), and the reading of
an incoming transfer straight from its bytes when it holds only what transfers usually do."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any, Final

from .framing import AMQP_FRAME, encode_frame
from .performatives import Attach, Composite
from .types import encode

#: Frame and transfer performative bytes of a one-frame delivery, besides its tag: header
#: (8), described list8 (6), handle, delivery id and message format as uint (5 each), the
#: tag's vbin8 head (2), settled (1), more, rcv-settle-mode, state, resume, aborted, batchable
#: (6).
SHORT_TRANSFER: Final = 8 + 6 + 5 + 5 + 2 + 5 + 1 + 6
#: The longest tag a one-frame template takes (the list8 size is at most 255).
SHORT_TAG: Final = 255 - 1 - (SHORT_TRANSFER - 8 - 6)


def _short_transfer(tag_size: int) -> Callable[..., bytes]:
    """``pack(frame size, channel, handle, delivery id, tag, message format, settled code)``:
    a whole transfer frame (but its payload) with every field written, widths fixed."""
    layout = struct.Struct(f">IBBHBBBBBBBIBIBB{tag_size}sBIB6s")
    list_size = SHORT_TRANSFER - 8 - 6 + tag_size + 1
    pack = layout.pack

    def transfer(
        size: int, channel: int, handle: int, delivery_id: int, tag: bytes, fmt: int, settled: int
    ) -> bytes:
        return pack(size, 2, AMQP_FRAME, channel, 0, 0x53, 0x14, 0xC0, list_size, 11,
                    0x70, handle, 0x70, delivery_id, 0xA0, tag_size, tag, 0x70, fmt, settled,
                    b"\x42\x40\x40\x42\x42\x42")  # fmt: skip

    return transfer


SHORT_TRANSFERS: Final = tuple(_short_transfer(size) for size in range(SHORT_TAG + 1))


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + value.to_bytes(4, "big")


def transfer_fields(
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool,
    more: bool = False,
    tail: bytes | None = None,
) -> bytes:
    """A transfer performative with all eleven fields (some clients find the payload by
    counting them); ``tail``: its last four (state, resume, aborted, batchable) encoded."""
    items = b"".join(
        (
            _uint(handle),
            _uint(delivery_id),
            bytes((0xA0, len(tag))) if len(tag) < 256 else b"\xb0" + len(tag).to_bytes(4, "big"),
            tag,
            _uint(message_format),
            b"\x41" if settled else b"\x42",
            b"\x41" if more else b"\x42",
            b"\x40",
            tail if tail is not None else b"\x40\x42\x42\x42",
        )
    )
    if len(items) < 255:
        return b"\x00\x53\x14\xc0" + bytes((len(items) + 1, 11)) + items
    return b"\x00\x53\x14\xd0" + struct.pack(">II", len(items) + 4, 11) + items


def resumed_fields(resume: bool, state: Any) -> bytes:
    """The state, resume, aborted and batchable fields of a resumed transfer."""
    value = state.described() if isinstance(state, Composite) else state
    return encode(value) + (b"\x41" if resume else b"\x42") + b"\x42\x42"


def fit_unsettled(attach: Attach, max_frame_size: int) -> None:
    """Leave out of the attach's unsettled map what does not fit the peer's frame size (an
    attach is one frame), setting ``incomplete-unsettled`` then; the oldest entries stay."""
    unsettled = attach.unsettled
    assert unsettled is not None
    keep = len(unsettled)
    while keep and _frame_size(attach) > max_frame_size:
        keep //= 2
        attach.unsettled = dict(itertools.islice(unsettled.items(), keep))
        attach.incomplete_unsettled = True


def _frame_size(performative: Composite) -> int:
    out = bytearray()
    encode_frame(out, 0, performative, b"")
    return len(out)


def continuation_fields(handle: int, more: bool) -> bytes:
    items = (
        _uint(handle)
        + b"\x40\x40\x40\x40"
        + (b"\x41" if more else b"\x42")
        + b"\x40\x40\x42\x42\x42"
    )
    return b"\x00\x53\x14\xc0" + bytes((len(items) + 1, 11)) + items


def quick_transfer(
    body: memoryview,
) -> tuple[int, int | None, bytes | None, int | None, bool, bool, bool, int] | None:
    """A transfer's handle, delivery id, tag, message format, settled, more and aborted, and
    where its payload starts, read straight from the bytes when they hold only what
    transfers usually do (None: the general decoder reads it)."""
    code = body[3]
    if code == 0xC0:
        count, position, end = body[5], 6, 5 + body[4]
    elif code == 0xD0:
        count = int.from_bytes(body[8:12], "big")
        position, end = 12, 8 + int.from_bytes(body[4:8], "big")
    else:
        return None
    if count > 11 or end > len(body):
        return None
    fields: list[Any] = [None] * 11
    try:
        for index in range(count):
            code = body[position]
            if code == 0x40:
                position += 1
            elif code == 0x43:
                fields[index] = 0
                position += 1
            elif code == 0x52 or code == 0x50:
                fields[index] = body[position + 1]
                position += 2
            elif code == 0x70:
                fields[index] = int.from_bytes(body[position + 1 : position + 5], "big")
                position += 5
            elif code == 0x41 or code == 0x42:
                fields[index] = code == 0x41
                position += 1
            elif code == 0xA0 and index == 2:
                start = position + 2
                position = start + body[position + 1]
                fields[index] = bytes(body[start:position])
            else:
                return None  # a state, a long tag...: the general decoder
    except IndexError:
        return None
    handle = fields[0]
    if (
        position != end
        or type(handle) is not int
        or any(type(fields[i]) is bool for i in (1, 3, 6))
        or any(type(fields[i]) is int for i in (4, 5, 8, 9, 10))
    ):
        return None  # a field of the wrong type: the general decoder words the error
    return (handle, fields[1], fields[2], fields[3], bool(fields[4]), bool(fields[5]),
            bool(fields[9]), end)  # fmt: skip
