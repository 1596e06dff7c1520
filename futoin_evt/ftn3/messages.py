"""FTN3 messages: decoding frames, checking requests, encoding replies. No I/O.

JSON goes through orjson where it gives exactly what the standard library's strict decoder
and encoder give, and through the standard library otherwise (see :func:`decode_json` and
:func:`encode_json`), so the refusals and the exact values are the same either way.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .errors import INVALID_REQUEST, FTN3Error, ProtocolViolation, RefusedMessage

#: Message size limit when a function does not raise it (FTN3).
DEFAULT_MESSAGE_LIMIT: Final = 64 * 1024

#: Version parts are small numbers; longer ones are not FTN3 (and would cost to convert).
FUNC_RE: Final = re.compile(
    r"^(?P<iface>[a-z][a-z0-9]*(?:\.[a-z][a-z0-9]*)*):"
    r"(?P<major>[0-9]{1,9})\.(?P<minor>[0-9]{1,9}):(?P<func>[a-z][a-zA-Z0-9]*)\Z"
)
PARAM_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_]*\Z")
RID_RE: Final = re.compile(r"^[CS][0-9]{1,10}\Z")
REQUEST_KEYS: Final = frozenset({"f", "p", "rid", "sec", "forcersp", "obf"})
RESPONSE_KEYS: Final = frozenset({"r", "e", "edesc", "rid", "sec"})
_SIZE_RE: Final = re.compile(r"^([0-9]+)([KM]?)\Z")


@dataclass(frozen=True, slots=True)
class EncodedJson:
    """A value already encoded as JSON text, spliced into a message as it is."""

    text: str


@dataclass(slots=True)
class Request:
    rid: str
    iface: str
    major: int
    minor: int
    func: str
    params: dict[str, Any]
    sec: str | dict[str, Any] | None

    @property
    def f(self) -> str:
        return f"{self.iface}:{self.major}.{self.minor}:{self.func}"


@dataclass(frozen=True, slots=True)
class Response:
    rid: str
    result: Any = None
    error: str | None = None
    error_desc: str = ""


#: The longest integer literal accepted: Python's own limit for converting decimal text.
MAX_INT_DIGITS: Final = sys.get_int_max_str_digits() or 4300
#: Only where a frame holds one of these can a decoded string hold a lone surrogate.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES: Final = re.compile(rb"\\u[dD][89a-fA-F]")


class _NumberRefused(ValueError):
    """JSON that holds a number this server cannot keep exactly."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NumberRefused(f"the number {text[:40]} is out of range for a 64-bit float")
    return value


# Built once: json.loads/json.dumps with options build a new decoder/encoder on every call.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


#: Maps every digit to ``0`` and every other byte to a space: a run of digits stays a run.
_DIGITS_ONLY: Final = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
#: orjson turns an integer beyond 64 bits into a float; 19 digits may already be one.
_LONG_DIGIT_RUN: Final = b"0" * 19
#: orjson writes NaN and Infinity as ``null``; output without it cannot have held them.
_NULL: Final = b"null"
#: What orjson would encode but the standard library refuses: handed back to it.
_ORJSON_STRICT: Final = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def decode_json(data: str | bytes) -> Any:
    """Strict JSON in UTF-8: no NaN/Infinity; ValueError on anything that is not JSON.

    Bytes without a run of 19 digits go to orjson first: it refuses NaN, Infinity, numbers
    beyond a float's range, lone surrogates and invalid UTF-8, and keeps integers of up to 18
    digits exact. Whatever it refuses, and anything with a longer run of digits, is decoded
    by the standard library, which gives the value or the error it always gave.
    """
    if isinstance(data, bytes) and _LONG_DIGIT_RUN not in data.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        return _DECODER.decode(data if isinstance(data, str) else data.decode("utf-8"))
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def encode_json(value: Any) -> str:
    """Compact JSON that always encodes to valid UTF-8 (lone surrogates get escaped).

    orjson encodes it when it can, and its output is used when it holds no ``null`` (orjson
    writes NaN and Infinity as null, which the standard library refuses). Anything else,
    integers beyond 64 bits and lone surrogates included, goes to the standard library.
    """
    try:
        encoded = orjson.dumps(value, option=_ORJSON_STRICT)
    except (TypeError, orjson.JSONEncodeError):
        pass
    else:
        if _NULL not in encoded:
            return encoded.decode()
    text: str = _ENCODER.encode(value)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _ASCII_ENCODER.encode(value)
    return text


def decode_frame(frame: str | bytes) -> dict[str, Any]:
    """Decode one WebSocket frame into a message object that carries a usable ``rid``.

    Raises :class:`RefusedMessage` for valid JSON that this server does not take (integers
    over :data:`MAX_INT_DIGITS` digits, floats out of range, lone surrogates), so that the
    sender gets an answer, and :class:`ProtocolViolation` when there is nobody to answer.
    """
    if isinstance(frame, bytes) and _LONG_DIGIT_RUN not in frame.translate(_DIGITS_ONLY):
        try:
            fast = orjson.loads(frame)  # Any: mypyc checks the type where it is narrowed
        except orjson.JSONDecodeError:
            pass  # decoded again below, for the same error or refusal as ever
        else:
            _rid_of(fast)  # no lone surrogate: orjson refuses them
            checked: dict[str, Any] = fast
            return checked
    try:
        text = frame if isinstance(frame, str) else frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolViolation(f"frame is not valid UTF-8: {exc.reason}") from None
    try:
        msg = decode_json(text)
    except ValueError as exc:
        raise _refusal(text, exc) from None
    rid = _rid_of(msg)
    if _SURROGATE_ESCAPE.search(text) is not None and _holds_lone_surrogate(msg):
        raise RefusedMessage(rid, INVALID_REQUEST, "Text with a lone surrogate is not Unicode")
    message: dict[str, Any] = msg
    return message


def _rid_of(msg: Any) -> str:
    if not isinstance(msg, dict):
        raise ProtocolViolation("message is not a JSON object")
    rid = msg.get("rid")
    if not isinstance(rid, str) or RID_RE.match(rid) is None:
        raise ProtocolViolation("message has no valid rid")
    return rid


def _refusal(text: str, exc: ValueError) -> ProtocolViolation:
    """What to raise for a frame the strict decoder refused: a :class:`RefusedMessage` when it
    is JSON with numbers out of bounds and a rid to answer, else a close."""
    too_long: list[int] = []

    def any_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            too_long.append(len(digits))
            return 0
        return int(digits)

    lenient = json.JSONDecoder(parse_constant=_reject_constant, parse_int=any_int)
    try:
        msg = lenient.decode(text)
    except (ValueError, RecursionError):
        return ProtocolViolation(f"frame is not valid JSON: {exc}")
    rid = _rid_of(msg)
    if too_long:
        reason = f"Integers of more than {MAX_INT_DIGITS} digits are not accepted"
    elif isinstance(exc, _NumberRefused):
        reason = str(exc).capitalize()
    else:
        return ProtocolViolation(f"frame is not valid JSON: {exc}")
    return RefusedMessage(rid, INVALID_REQUEST, reason)


def holds_lone_surrogate(text: str | bytes, value: Any) -> bool:
    """Whether ``value``, decoded from the JSON ``text``, has a string with a lone surrogate
    (which no UTF-8 can carry on to other doors). Cheap when the text escapes none."""
    if isinstance(text, bytes):
        escaped = _SURROGATE_ESCAPE_BYTES.search(text) is not None
    else:
        escaped = _SURROGATE_ESCAPE.search(text) is not None
    return escaped and _holds_lone_surrogate(value)


def _holds_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[Any] = [item]
        elif isinstance(item, dict):
            strings = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for string in strings:
            try:
                string.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def is_request(msg: dict[str, Any], *, peer_prefix: str) -> bool:
    """Requests from a peer carry its own rid prefix (``C`` from a client, ``S`` from a server)."""
    rid: str = msg["rid"]
    return rid[0] == peer_prefix


#: How many distinct ``f`` values and param names are remembered as checked (they repeat).
_MEMO_SIZE: Final = 1024
_checked_f: dict[str, tuple[str, int, int, str]] = {}
_checked_param_names: set[str] = set()


def parse_request(msg: dict[str, Any]) -> Request:
    """Check the envelope of a decoded request; raise InvalidRequest when it is not FTN3."""
    if not REQUEST_KEYS.issuperset(msg):
        unknown = msg.keys() - REQUEST_KEYS
        raise FTN3Error(INVALID_REQUEST, f"Unknown request key: {sorted(unknown)[0]}")
    f = msg.get("f")
    parts = _checked_f.get(f) if type(f) is str else None
    if parts is None:
        parts = _parse_f(f)
    params = msg.get("p", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FTN3Error(INVALID_REQUEST, "Invalid req.p")
    for name in params:
        if name not in _checked_param_names:
            if PARAM_NAME_RE.match(name) is None:
                raise FTN3Error(INVALID_REQUEST, f"Invalid parameter name: {name[:64]}")
            if len(_checked_param_names) < _MEMO_SIZE:
                _checked_param_names.add(name)
    sec = msg.get("sec")
    if sec is not None and not isinstance(sec, (str, dict)):
        raise FTN3Error(INVALID_REQUEST, "Invalid req.sec")
    iface, major, minor, func = parts
    return Request(msg["rid"], iface, major, minor, func, params, sec)


def _parse_f(f: Any) -> tuple[str, int, int, str]:
    """``iface:major.minor:func``, remembered once valid."""
    match = FUNC_RE.match(f) if isinstance(f, str) else None
    if match is None:
        raise FTN3Error(INVALID_REQUEST, "Invalid req.f")
    parts = (match["iface"], int(match["major"]), int(match["minor"]), match["func"])
    if len(_checked_f) < _MEMO_SIZE:
        _checked_f[f] = parts
    return parts


def parse_response(msg: dict[str, Any]) -> Response:
    """A reply to one of our requests; unknown keys make it an InternalError, as FTN3 says."""
    rid: str = msg["rid"]
    if msg.keys() - RESPONSE_KEYS:
        return Response(rid, error="InternalError", error_desc="Unexpected response keys")
    error = msg.get("e")
    if error is not None:
        return Response(rid, error=str(error), error_desc=str(msg.get("edesc", "")))
    return Response(rid, result=msg.get("r"))


def encode_result(rid: str, result: Any) -> bytes:
    body = result.text if isinstance(result, EncodedJson) else encode_json(result)
    return f'{{"r":{body},"rid":"{rid}"}}'.encode()


def encode_error(rid: str, name: str, desc: str = "") -> bytes:
    return encode_json({"e": name, "edesc": desc, "rid": rid}).encode()


def encode_request(rid: str, f: str, params: dict[str, Any], sec: str | None = None) -> bytes:
    msg: dict[str, Any] = {"f": f, "p": params, "rid": rid}
    if sec is not None:
        msg["sec"] = sec
    return encode_json(msg).encode()


def parse_size(value: str | int) -> int:
    """``maxreqsize``/``maxrspsize`` values: bytes, or a number with a K or M suffix."""
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise ValueError(f"invalid message size: {value!r}")
    scale = {"": 1, "K": 1024, "M": 1024 * 1024}[match[2]]
    return int(match[1]) * scale
