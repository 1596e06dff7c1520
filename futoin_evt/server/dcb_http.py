"""The DCB API over HTTP: ``POST /dcb/v1/append`` and ``POST /dcb/v1/read`` with JSON bodies.

These serve the stream ``events``; ``/dcb/v1/streams/NAME/append`` and ``.../read`` serve
the stream ``NAME`` when it has one partition (400 ``PartitionedStream`` when it has more,
404 ``UnknownStream``, 400 ``InvalidStream`` for what cannot be a stream's name).

Authentication is HTTP Basic with the server's users, as on the feed. A read needs the read
right on the stream, an append the write right (and read as well for a condition: see
:meth:`~futoin_evt.dcb.service.DcbService.append` for a writer without read): without it,
403 ``AccessDenied`` with the sentence naming the right and the stream, also for a name
that names no stream unless the user holds some right on that name (then 404
``UnknownStream``). Errors are
``{"error": NAME, "message": ...}`` with 400 (the message names the field), 401, 403, 409
(``AppendConditionFailed``, ``EventIdConflict``) or 413. A read streams its answer a page
at a time: ``{"events": [...], "head": N}``, or NDJSON (one event a line, then
``{"head": N}``) when the request asks for ``Accept: application/x-ndjson``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from websockets.http11 import Request

from ..auth.users import Authenticator
from ..dcb.model import (
    limit_value,
    parse_condition,
    parse_events,
    parse_query,
    position,
)
from ..dcb.service import MAX_WAIT_SECONDS, DcbService, DcbStreamRefused, ReadRequest
from ..domain.dcb import DcbInputError
from ..domain.principal import Principal
from ..domain.rights import Right
from ..ftn3.messages import decode_json, encode_json, holds_lone_surrogate
from ..stats import UNKNOWN
from ..wsio import ServerIO
from .http import Exchange, HttpEndpoint, HttpError, refused_text

DCB_PATH: Final = "/dcb/v1"
#: ``/streams/NAME/append``: the calls on a named stream.
STREAMS: Final = "/streams/"
ACTIONS: Final = ("/append", "/read")
NDJSON: Final = "application/x-ndjson"
JSON: Final = "application/json"


def refusal(status: int, error: str, message: str) -> HttpError:
    body = encode_json({"error": error, "message": message}).encode()
    return HttpError(status, message, body, JSON)


class DcbEndpoint(HttpEndpoint):
    methods = ("POST",)
    realm = "futoin-evt DCB"
    door = "dcb"

    def __init__(
        self,
        service: DcbService,
        authenticator: Authenticator,
        secure: Callable[[ServerIO], bool],
        path: str = DCB_PATH,
        stream_service: Callable[[Principal, str, Right], DcbService] | None = None,
    ) -> None:
        """``stream_service(who, name, right)``: the service of a named stream for a call of
        ``who`` that needs ``right`` on it, or DcbStreamRefused, or
        :class:`~futoin_evt.log.access.AccessDenied`; None: only ``events`` is served."""
        super().__init__(path, authenticator, secure)
        self._service = service
        self._stream_service = stream_service

    def _route(self, request: Request) -> tuple[str | None, str]:
        """(stream name or None for ``events``, action) of the path; action "" when none."""
        subpath = self.subpath(request)
        if subpath.startswith(STREAMS) and self._stream_service is not None:
            name, _, action = subpath[len(STREAMS) :].partition("/")
            return name, "/" + action if action else ""
        return None, subpath if subpath in ACTIONS else ""

    def function(self, request: Request) -> str:
        _name, action = self._route(request)
        return action[1:] if action in ACTIONS else UNKNOWN

    def fault_error(self, status: int, name: str, exc: Exception) -> HttpError:
        """A refusal of the request's content starts with the field it names, as it is
        spelled (``events[0].type: ...``); any other is a capitalised sentence."""
        if status in (400, 409):
            return refusal(status, name, f"{exc}.")
        return refusal(status, name, refused_text(exc))

    async def handle(self, io: ServerIO, request: Request, body: bytes, exchange: Exchange) -> None:
        who = await self.authorize(io, request)
        name, action = self._route(request)
        if action not in ACTIONS:
            raise refusal(
                404,
                "NotFound",
                f"No such resource: {self.path}/append and /read are"
                f" (and {self.path}/streams/NAME/append and /read).",
            )
        service = self._service
        if name is not None:
            assert self._stream_service is not None
            right = Right.WRITE if action == "/append" else Right.READ
            try:
                service = self._stream_service(who, name, right)
            except DcbStreamRefused as exc:
                raise refusal(exc.status, exc.error, exc.message) from None
        try:
            document = decode_json(body) if body else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise refusal(400, "InvalidRequest", f"The body is not JSON: {exc}.") from None
        if not isinstance(document, dict):
            raise refusal(400, "InvalidRequest", "The body is a JSON object.")
        if holds_lone_surrogate(body, document):
            raise refusal(400, "InvalidRequest", "Text with a lone surrogate is not Unicode.")
        if action == "/append":
            await self._append(who, service, document, exchange)
        else:
            await self._read(who, service, document, request, exchange)

    async def _append(
        self, who: Principal, service: DcbService, document: dict[str, Any], exchange: Exchange
    ) -> None:
        _only(document, {"events", "condition"})
        events = parse_events(document.get("events"))
        condition = parse_condition(document.get("condition"))
        last = await service.append(who, events, condition)
        exchange.respond(200, f'{{"position":{last}}}'.encode(), JSON)

    async def _read(
        self,
        who: Principal,
        service: DcbService,
        document: dict[str, Any],
        request: Request,
        exchange: Exchange,
    ) -> None:
        _only(document, {"query", "after", "backwards", "limit", "wait"})
        after = document.get("after")
        backwards = document.get("backwards", False)
        if not isinstance(backwards, bool):
            raise DcbInputError("backwards", "true or false")
        wait = document.get("wait", 0)
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not (0 <= wait <= MAX_WAIT_SECONDS)
        ):
            raise DcbInputError("wait", f"seconds from 0 to {MAX_WAIT_SECONDS:g}")
        read = await service.read(
            who,
            ReadRequest(
                query=parse_query(document.get("query")),
                after=None if after is None else position(after, "after"),
                limit=limit_value(document.get("limit")),
                backwards=backwards,
                wait_seconds=float(wait),
            ),
        )
        ndjson = NDJSON in request.headers.get("Accept", "")
        exchange.start_stream(NDJSON if ndjson else JSON)
        separator = b"" if ndjson else b'{"events":['
        async for page in read.pages():
            if ndjson:
                chunk = b"".join(event.to_json().encode() + b"\n" for event in page)
            else:
                chunk = separator + b",".join(event.to_json().encode() for event in page)
                separator = b","
            await exchange.write(chunk)
        if ndjson:
            await exchange.write(f'{{"head":{read.head}}}\n'.encode())
        else:
            opening = b'{"events":[' if separator != b"," else b""
            await exchange.write(opening + f'],"head":{read.head}}}'.encode())
        exchange.end_stream()


def _only(document: dict[str, Any], fields: set[str]) -> None:
    unknown = document.keys() - fields
    if unknown:
        raise DcbInputError(sorted(unknown)[0], "unknown field")
