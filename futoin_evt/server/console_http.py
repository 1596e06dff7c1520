"""The web console on the WebSocket port: GETs and form POSTs under ``/console``.

The console (:mod:`futoin_evt.console`) has no wire in it; this endpoint hands it each request
and writes its answer, streaming a live tail's Server-Sent Events chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from websockets.http11 import Request

from ..auth.users import Authenticator
from ..console.app import CONSOLE_DOOR, Console, ConsoleRequest, Refused
from ..slots import TOO_MANY_CONNECTIONS
from ..stats import CONNECTION
from ..wsio import ServerIO
from .executor import peer_host
from .http import Exchange, HttpEndpoint, HttpError

#: The request headers the console reads.
HEADERS: Final = ("cookie", "origin", "host")
#: Paths the metrics name one by one; others count as ``page``.
FUNCTIONS: Final = frozenset({"login", "logout", "streams", "consumers", "tail", "events", "dcb"})


class ConsoleEndpoint(HttpEndpoint):
    methods = ("GET", "POST")
    realm = "futoin-evt console"
    door = CONSOLE_DOOR

    def __init__(
        self,
        console: Console,
        authenticator: Authenticator,
        secure: Callable[[ServerIO], bool],
        tls: bool,
    ) -> None:
        super().__init__(console.base, authenticator, secure)
        self.console = console
        self._tls = tls

    def function(self, request: Request) -> str:
        first = self.subpath(request).strip("/").split("/", 1)[0]
        return first if first in FUNCTIONS else "page"

    async def handle(
        self, io: ServerIO, request: Request, body: bytes, exchange: Exchange
    ) -> int | None:
        console_request = ConsoleRequest(
            method=request.method,
            target=request.path,
            headers={
                name: request.headers.get(name, "") for name in HEADERS if name in request.headers
            },
            body=body,
            peer=peer_host(io.peer),
            secure_channel=self._secure(io),
            tls=self._tls,
        )
        try:
            response = await self.console.handle(console_request)
        except Refused as exc:
            response = self.console.error(exc.status, exc.message)
        if response.user is not None:
            # a session's connection is past its login, as a feed request with credentials
            CONNECTION.set((self.door, io.peer, response.user))
            if not io.log_in():
                if response.stream is not None:
                    await response.stream.aclose()
                raise HttpError(503, TOO_MANY_CONNECTIONS.capitalize() + ".")
        if response.stream is None:
            exchange.respond(
                response.status, response.body, response.content_type, response.headers
            )
            return response.status
        exchange.start_stream(response.content_type, response.headers)
        try:
            async for chunk in response.stream:
                await exchange.write(chunk)
        finally:
            await response.stream.aclose()
        exchange.end_stream()
        return None
