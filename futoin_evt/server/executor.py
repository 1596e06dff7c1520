"""The FTN3 executor: from a checked request to a reply, with security and validation.

Order of checks: credentials, iface/version/function (masked as UnknownInterface for an
anonymous caller, so nobody probes without credentials), iface constraints (anonymous,
secure channel), request size, params. Errors a function does not declare go out as
InternalError and are logged with their traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..auth import Authenticator
from ..ftn3.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    NOT_IMPLEMENTED,
    SECURITY_ERROR,
    UNKNOWN_INTERFACE,
    FTN3Error,
)
from ..ftn3.ifaces import ALLOW_ANONYMOUS, BIDIRECT_CHANNEL, SECURE_CHANNEL, IfaceRegistry
from ..ftn3.messages import EncodedJson, Request, decode_json, encode_error, encode_result
from ..services import CallContext

log = logging.getLogger(__name__)

Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Any]]
#: iface name -> wire function name -> handler
Routes = Mapping[str, Mapping[str, Handler]]


@dataclass(frozen=True, slots=True)
class Channel:
    """What the executor needs to know about the connection a request came on."""

    peer: str
    secure: bool
    bidirect: bool = True


class Executor:
    def __init__(
        self,
        registry: IfaceRegistry,
        routes: Routes,
        authenticator: Authenticator,
        *,
        check_results: bool = False,
    ) -> None:
        self._registry = registry
        self._routes = routes
        self._auth = authenticator
        self._check_results = check_results

    async def call(self, request: Request, size: int, channel: Channel) -> bytes:
        """Run one request; always returns the encoded reply (result or error)."""
        try:
            result, max_response = await self._call(request, size, channel)
        except FTN3Error as exc:
            return encode_error(request.rid, exc.name, exc.desc)
        except Exception:
            log.exception("%s from %s failed", request.f, channel.peer)
            return encode_error(request.rid, INTERNAL_ERROR, "Internal error")
        reply = encode_result(request.rid, result)
        if len(reply) > max_response:
            log.error("%s: reply of %d bytes exceeds %d", request.f, len(reply), max_response)
            return encode_error(request.rid, INTERNAL_ERROR, "Response too large")
        return reply

    async def _call(self, request: Request, size: int, channel: Channel) -> tuple[Any, int]:
        principal = await self._auth.authenticate(request.sec) if request.sec else None
        try:
            iface = self._registry.resolve(request.iface, request.major, request.minor)
            func = iface.funcs.get(request.func)
            if func is None:
                raise FTN3Error(INVALID_REQUEST, f"Not defined interface function: {request.f}")
        except FTN3Error as exc:
            if principal is None:
                raise FTN3Error(UNKNOWN_INTERFACE, f"Unknown interface: {request.iface}") from exc
            raise
        if principal is None and ALLOW_ANONYMOUS not in iface.requires:
            raise FTN3Error(SECURITY_ERROR, "Anonymous not allowed")
        if SECURE_CHANNEL in iface.requires and not channel.secure:
            raise FTN3Error(SECURITY_ERROR, "Insecure channel")
        if BIDIRECT_CHANNEL in iface.requires and not channel.bidirect:
            raise FTN3Error(SECURITY_ERROR, "Bi-directional channel is required")
        if size > func.max_request_bytes:
            raise FTN3Error(INVALID_REQUEST, f"Request exceeds {func.max_request_bytes} bytes")
        params = func.check_params(request.params)
        handler = self._routes.get(iface.name, {}).get(func.name)
        if handler is None:
            raise FTN3Error(NOT_IMPLEMENTED, f"Not implemented: {request.f}")
        assert principal is not None  # no served iface allows anonymous callers
        ctx = CallContext(principal, func.max_response_bytes)
        try:
            result = await handler(ctx, params)
        except FTN3Error as exc:
            if not func.may_raise(exc.name):
                log.error("%s raised undeclared %s: %s", request.f, exc.name, exc.desc)
                raise FTN3Error(INTERNAL_ERROR, "Internal error") from exc
            raise
        if self._check_results:
            value = decode_json(result.text) if isinstance(result, EncodedJson) else result
            problem = func.result_problem(value)
            if problem is not None:
                raise AssertionError(problem)
        return result, func.max_response_bytes
