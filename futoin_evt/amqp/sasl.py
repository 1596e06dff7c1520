"""The server side of AMQP 1.0 SASL (part 5.3), as plain state with no I/O.

The few SASL frames: the peer's protocol header, ``sasl-mechanisms``, ``sasl-init`` and
``sasl-outcome``. Everything after a successful outcome is the AMQP protocol proper and goes
to the engine (:mod:`.engine.protocol`).

The owner feeds bytes to :meth:`SaslServer.receive`, sends :meth:`SaslServer.data_to_send`,
checks the :class:`SaslInit` it is handed (asynchronously, as it likes) and answers with
:meth:`SaslServer.outcome`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..quoting import quote_input
from .engine.types import DecodeError, Described, UByte, ULong, decode, encode, symbols

SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
_SASL_FRAME_TYPE: Final = 1
_MECHANISMS: Final = 0x40
_INIT: Final = 0x41
_OUTCOME: Final = 0x44
#: SASL frames are small; a larger one is an attack or a bug (the spec's minimum is 512).
MAX_SASL_FRAME: Final = 4096
#: What a peer may send ahead of the outcome (its AMQP header and first frames).
MAX_PIPELINED: Final = 64 * 1024
_FRAME_HEADER: Final = struct.Struct(">IBBH")


class Outcome(enum.IntEnum):
    """``sasl-code`` values."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


class SaslError(Exception):
    """The peer broke the SASL exchange; the connection is closed after what is to send."""


@dataclass(frozen=True, slots=True)
class SaslInit:
    mechanism: str
    initial_response: bytes


class _State(enum.Enum):
    HEADER = enum.auto()
    INIT = enum.auto()
    CHECKING = enum.auto()
    AMQP_HEADER = enum.auto()
    DONE = enum.auto()
    FAILED = enum.auto()


def encode_sasl_frame(descriptor: int, fields: list[Any]) -> bytes:
    encoded = encode(Described(ULong(descriptor), fields))
    return _FRAME_HEADER.pack(_FRAME_HEADER.size + len(encoded), 2, _SASL_FRAME_TYPE, 0) + encoded


class SaslServer:
    """Offers ``mechanisms``, hands over the peer's choice, sends the outcome."""

    def __init__(self, mechanisms: Sequence[str]) -> None:
        self._mechanisms = tuple(mechanisms)
        self._state = _State.HEADER
        self._buffer = bytearray()
        self._out = bytearray()

    @property
    def done(self) -> bool:
        """Authenticated and the peer's AMQP header is in: the rest is AMQP."""
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.FAILED

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    def receive(self, data: bytes) -> SaslInit | None:
        """Take bytes from the peer; returns the ``sasl-init`` once it is complete.

        Raises :class:`SaslError` when the peer breaks the exchange.
        """
        if self._state is _State.FAILED:
            return None
        self._buffer += data
        if len(self._buffer) > MAX_PIPELINED and self._state is not _State.DONE:
            self._state = _State.FAILED
            raise SaslError("too much data before the SASL outcome")
        try:
            return self._advance()
        except SaslError:
            self._state = _State.FAILED
            raise

    def take_rest(self) -> bytes:
        """After :attr:`done`: the bytes that followed the peer's AMQP header."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return rest

    def outcome(self, code: Outcome) -> None:
        """Answer the ``sasl-init``; anything but OK ends the connection after it is sent."""
        if self._state is not _State.CHECKING:
            raise RuntimeError("no sasl-init to answer")
        self._out += encode_sasl_frame(_OUTCOME, [UByte(int(code))])
        if code is Outcome.OK:
            self._state = _State.AMQP_HEADER
            try:
                self._advance()
            except SaslError:
                self._state = _State.FAILED
                raise
        else:
            self._state = _State.FAILED

    def _advance(self) -> SaslInit | None:
        if self._state is _State.HEADER:
            if len(self._buffer) < len(SASL_HEADER):
                if not SASL_HEADER.startswith(bytes(self._buffer)):
                    self._refuse_header()
                return None
            if self._buffer[: len(SASL_HEADER)] != SASL_HEADER:
                self._refuse_header()
            del self._buffer[: len(SASL_HEADER)]
            offered = symbols(*self._mechanisms)
            self._out += SASL_HEADER + encode_sasl_frame(_MECHANISMS, [offered])
            self._state = _State.INIT
        if self._state is _State.INIT:
            init = self._read_init()
            if init is not None:
                self._state = _State.CHECKING
            return init
        if self._state is _State.AMQP_HEADER and len(self._buffer) >= len(AMQP_HEADER):
            if self._buffer[: len(AMQP_HEADER)] != AMQP_HEADER:
                raise SaslError("expected the AMQP protocol header after SASL")
            del self._buffer[: len(AMQP_HEADER)]
            self._state = _State.DONE
        return None

    def _refuse_header(self) -> None:
        # Answer with the header we speak, as the spec asks, then close.
        self._out += SASL_HEADER
        raise SaslError("a SASL protocol header is required (authenticate with PLAIN)")

    def _read_init(self) -> SaslInit | None:
        if len(self._buffer) < _FRAME_HEADER.size:
            return None
        size, doff, frame_type, _channel = _FRAME_HEADER.unpack_from(self._buffer)
        if frame_type != _SASL_FRAME_TYPE or doff < 2 or size > MAX_SASL_FRAME:
            raise SaslError("bad SASL frame header")
        if size < doff * 4:
            raise SaslError("bad SASL frame size")
        if len(self._buffer) < size:
            return None
        body = bytes(self._buffer[doff * 4 : size])
        del self._buffer[:size]
        return _decode_init(body, self._mechanisms)


def _decode_init(body: bytes, mechanisms: Sequence[str]) -> SaslInit:
    try:
        frame = decode(body)
    except DecodeError as exc:
        raise SaslError(f"undecodable SASL frame: {exc}") from None
    if not isinstance(frame, Described) or frame.descriptor != _INIT:
        raise SaslError("expected sasl-init")
    fields = frame.value if isinstance(frame.value, list) else []
    mechanism = fields[0] if fields else None
    if not isinstance(mechanism, str) or mechanism not in mechanisms:
        raise SaslError(f"mechanism not offered: {quote_input(mechanism)}")
    response = fields[1] if len(fields) > 1 and fields[1] is not None else b""
    if not isinstance(response, bytes | memoryview):
        raise SaslError("the initial response is not binary")
    return SaslInit(str(mechanism), bytes(response))
