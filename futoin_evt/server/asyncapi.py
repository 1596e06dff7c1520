"""``GET /asyncapi.json`` on the WebSocket port: an AsyncAPI 3.0 document of the streams the
caller may read, as the doors serve them, with the event types' schemas of the registry.

Servers: ``ftn3`` (the FTN18 WebSocket door), ``amqp`` (when the AMQP listener is on) and
``feed`` (when the HTTP feed is on), each on the host the request came to. Channels: one per
stream, partition and door (``NAME.P.ftn18`` at ``/NAME/P``, ``NAME.P.amqp`` at
``NAME/Partitions/P``, ``NAME.P.feed`` at ``/feeds/NAME/events?partition=P``); operations:
receive on each, send on the FTN18 and AMQP ones when the caller may also write. Messages:
one per event type with a schema (its newest live version, as JSON Schema draft 7) and
``event`` for the rest. Authentication is that of the other HTTP doors (HTTP Basic with the
server's users); without valid credentials the answer is 401 and tells nothing of the
streams.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from websockets.http11 import Request

from .. import __version__
from ..auth.users import Authenticator
from ..domain.partition import StreamInfo
from ..domain.rights import Right
from ..domain.schemas import parse_subject
from ..ftn3.messages import encode_json
from ..log.schemas import TypeSchema
from ..log.streams import StreamRegistry
from ..wsio import ServerIO
from .http import STREAM_FEEDS_PATH, Exchange, HttpEndpoint

ASYNCAPI_PATH: Final = "/asyncapi.json"
#: How AsyncAPI 3.0 names a JSON Schema payload of a draft (draft-07: the one every AsyncAPI
#: tool supports, and that of a schema without ``$schema``).
JSON_SCHEMA_FORMAT: Final = "application/schema+json;version={}"
#: The draft a ``$schema`` names: ``draft-04`` to ``draft-07``, ``2019-09``, ``2020-12``.
_DRAFT_RE: Final = re.compile(r"json-schema\.org/(?:(draft-0[467])/|draft/(2019-09|2020-12)/)")
#: The message of the events whose type has no schema.
GENERIC_MESSAGE: Final = "event"
#: What a Host header may hold to be named as the servers' host (else the listening address).
_HOST_RE: Final = re.compile(r"(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
#: Characters AsyncAPI does not take in a component's key.
_NOT_KEY_RE: Final = re.compile(r"[^\w.-]")


@dataclass(frozen=True, slots=True)
class Doors:
    """Where the doors listen, as the document names them."""

    #: ``host[:port]`` of the WebSocket port (also the HTTP feed's), as the client named it.
    host: str
    #: TLS on the WebSocket port.
    tls: bool
    #: ``amqp(s)://host:port`` of the AMQP listener, or None when it is off.
    amqp_url: str | None
    #: Whether the HTTP feed is on.
    feed: bool


def asyncapi_document(
    doors: Doors,
    streams: Iterable[tuple[StreamInfo, bool]],
    typed: Callable[[str], list[TypeSchema]],
) -> dict[str, Any]:
    """The document of ``streams`` (each with whether the caller may write to it);
    ``typed(name)`` gives the schemas of a stream's event types."""
    servers: dict[str, Any] = {
        "ftn3": {
            "host": doors.host,
            "protocol": "wss" if doors.tls else "ws",
            "description": "FTN18 (FutoIn event streams) over FTN3 JSON on WebSocket.",
        }
    }
    hostname = doors.host if doors.host.endswith("]") else doors.host.rsplit(":", 1)[0]
    if doors.amqp_url is not None:
        amqp = urlsplit(doors.amqp_url)
        servers["amqp"] = {
            "host": f"{hostname}:{amqp.port}",
            "protocol": amqp.scheme,
            "protocolVersion": "1.0",
            "description": "AMQP 1.0 (OASIS event streams, Azure Event Hubs addresses).",
        }
    if doors.feed:
        servers["feed"] = {
            "host": doors.host,
            "protocol": "https" if doors.tls else "http",
            "description": "The HTTP feed (FeedAPI v2, ZeroEventHub v1).",
        }
    document: dict[str, Any] = {
        "asyncapi": "3.0.0",
        "info": {
            "title": "futoin-evt",
            "version": __version__,
            "description": "The event streams this user may read, as each door serves them.",
        },
        "defaultContentType": "application/json",
        "servers": servers,
    }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {
        GENERIC_MESSAGE: {
            "name": GENERIC_MESSAGE,
            "title": "An event",
            "summary": "The data of an event whose type has no schema: any JSON value.",
            "contentType": "application/json",
            "payload": {},
        }
    }
    for info, writable in streams:
        keys = [_typed_message(schema, messages) for schema in typed(info.name)]
        refs = {key: {"$ref": f"#/components/messages/{key}"} for key in [*keys, GENERIC_MESSAGE]}
        for number in range(len(info.partitions)):
            # (door, address, server, (receive operation, send operation or None))
            bindings: list[tuple[str, str, str, tuple[str, str | None]]] = [
                ("ftn18", f"/{info.name}/{number}", "ftn3", ("push", "addEvent"))
            ]
            if doors.amqp_url is not None:
                address = f"{info.name}/Partitions/{number}"
                bindings.append(("amqp", address, "amqp", ("AMQP receive", "AMQP send")))
            if doors.feed:
                feed = f"{STREAM_FEEDS_PATH}/{info.name}/events?partition={number}"
                bindings.append(("feed", feed, "feed", ("feed", None)))
            for door, address, server, (receive, send) in bindings:
                channel = f"{info.name}.{number}.{door}"
                channels[channel] = {
                    "address": address,
                    "title": f"{info.name} partition {number} ({door})",
                    "servers": [{"$ref": f"#/servers/{server}"}],
                    "messages": refs,
                }
                actions = [("receive", receive)]
                if send is not None and writable:
                    actions.append(("send", send))
                for action, what in actions:
                    operations[f"{channel}.{action}"] = {
                        "action": action,
                        "channel": {"$ref": f"#/channels/{channel}"},
                        "summary": what,
                        "messages": [
                            {"$ref": f"#/channels/{channel}/messages/{key}"} for key in refs
                        ],
                    }
    document |= {
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }
    return document


def _typed_message(schema: TypeSchema, messages: dict[str, Any]) -> str:
    """Adds the message of one typed event type to ``messages``; its key there."""
    stream, event_type = parse_subject(schema.subject)
    key = base = _NOT_KEY_RE.sub("_", schema.subject)
    count = 1
    while key in messages:  # ``:`` in a type becomes ``_``: two subjects may meet
        count += 1
        key = f"{base}_{count}"
    messages[key] = {
        "name": event_type,
        "title": schema.subject,
        "summary": (
            f"The data of an event {event_type} of the stream {stream}"
            f" (schema version {schema.version}, id {schema.schema_id})."
        ),
        "contentType": "application/json",
        "payload": {"schemaFormat": schema_format(schema.document), "schema": schema.document},
    }
    return key


def schema_format(document: Any) -> str:
    """AsyncAPI's ``schemaFormat`` of a registered JSON Schema: its own draft."""
    draft = document.get("$schema") if isinstance(document, dict) else None
    found = _DRAFT_RE.search(draft) if isinstance(draft, str) else None
    return JSON_SCHEMA_FORMAT.format(found[1] or found[2] if found else "draft-07")


class AsyncApiEndpoint(HttpEndpoint):
    """``GET /asyncapi.json``: :func:`asyncapi_document` of the streams the caller may read."""

    realm = "futoin-evt"
    door = "asyncapi"

    def __init__(
        self,
        streams: StreamRegistry,
        typed: Callable[[str], list[TypeSchema]],
        authenticator: Authenticator,
        secure: Callable[[ServerIO], bool],
        ws_url: Callable[[], str],
        feed: bool,
        path: str = ASYNCAPI_PATH,
    ) -> None:
        super().__init__(path, authenticator, secure)
        self._streams = streams
        self._typed = typed
        self._ws_url = ws_url
        self._feed = feed
        #: ``amqp(s)://host:port``, set once the AMQP listener is on.
        self.amqp_url: str | None = None

    def serves(self, path: str) -> bool:
        return path == self.path

    def function(self, request: Request) -> str:
        return "document"

    async def handle(self, io: ServerIO, request: Request, body: bytes, exchange: Exchange) -> None:
        who = await self.authorize(io, request)
        access = self._streams.access
        readable = [
            (info, access.allows(who, Right.WRITE, info.name))
            for info in sorted(self._streams, key=lambda info: info.name)
            if access.allows(who, Right.READ, info.name)
        ]
        url = urlsplit(self._ws_url())
        doors = Doors(
            self._host(request, url.netloc), url.scheme == "wss", self.amqp_url, self._feed
        )
        document = asyncapi_document(doors, readable, self._typed)
        exchange.respond(200, encode_json(document).encode(), "application/json")

    @staticmethod
    def _host(request: Request, listening: str) -> str:
        """The Host header when it is ``host[:port]``, else the listening address."""
        given = request.headers.get("Host", "")
        return given if _HOST_RE.fullmatch(given) is not None else listening
