"""The web console on the WebSocket port: GETs and form POSTs under ``/console``.

The console (:mod:`futoin_evt.console`) has no wire in it; this endpoint hands it each request
and writes its answer, streaming a live tail's Server-Sent Events chunk by chunk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from websockets.http11 import Request

from ..auth.users import Authenticator
from ..console.app import CONSOLE_DOOR, Console, ConsoleRequest, PageError
from ..console.overview import Door, Workers
from ..log.users import UserAdmin
from ..slots import TOO_MANY_CONNECTIONS
from ..stats import CONNECTION
from ..wsio import ServerIO
from .executor import peer_host
from .http import Exchange, HttpEndpoint, HttpError

if TYPE_CHECKING:
    from ..amqp.listener import AmqpListener
    from ..ftn18.notify import NotifyService
    from ..kafka.listener import KafkaListener
    from .metrics import MetricsListener
    from .peers import PeerChannel
    from .websocket import WebSocketTransport

#: The request headers the console reads.
HEADERS: Final = ("cookie", "origin", "host", "sec-fetch-site")
#: Paths the metrics name one by one; others count as ``page``.
FUNCTIONS: Final = frozenset(
    {"login", "logout", "overview", "streams", "stream", "consumers", "consumer", "publish"}
    | {"event", "tail", "events", "dcb", "users", "user", "connections"}
)
#: The HTTP doors on the WebSocket port, by their metrics' name, as the overview names them.
HTTP_DOORS: Final = {
    "feed": "HTTP feed",
    "dcb": "DCB over HTTP",
    "schemas": "Schema registry",
    "asyncapi": "AsyncAPI document",
    CONSOLE_DOOR: "Web console",
}


class Server(Protocol):
    """What the console reads and changes of the server beyond the streams
    (:class:`futoin_evt.server.app.EventServer`)."""

    users: UserAdmin

    http_endpoints: list[HttpEndpoint]
    notify: NotifyService
    amqp: AmqpListener | None
    kafka: KafkaListener | None
    metrics: MetricsListener | None
    channel: PeerChannel | None

    @property
    def transport(self) -> WebSocketTransport: ...


def attach(console: Console, server: Server) -> None:
    """Hand ``console`` the server's doors and workers (its overview), its users (the
    users pages) and its open connections (the connections page)."""
    console.facts = ServerFacts(server)
    console.users = server.users
    console.connections = server.transport.connections


class ServerFacts:
    """The doors and workers of a running server, as the console's overview shows them."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def doors(self) -> list[Door]:
        server = self._server
        transport = server.transport
        counts = Counter(io.door for io in transport.slots.established_sockets())
        notify = min(server.notify.connections, counts["websocket"])
        base = transport.url.replace("ws", "http", 1).rstrip("/")
        doors = [
            Door("FTN18 over WebSocket", transport.url, counts["websocket"] - notify),
            Door("Event notification (FTN3)", transport.url, notify),
        ]
        for endpoint in server.http_endpoints:
            name = HTTP_DOORS.get(endpoint.door, endpoint.door)
            doors.append(Door(name, base + endpoint.path, counts[endpoint.door]))
        if server.amqp is not None:
            doors.append(Door("AMQP 1.0", server.amqp.url, server.amqp.slots.established))
        if server.kafka is not None:
            doors.append(Door("Kafka", server.kafka.url, server.kafka.slots.established))
        if server.metrics is not None:
            doors.append(Door("Metrics", server.metrics.url, None))
        return doors

    def workers(self) -> Workers:
        channel = self._server.channel
        if channel is None:
            return Workers(1, 1)
        return Workers(channel.place.slot + 1, channel.place.count)


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
        except PageError as exc:
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
