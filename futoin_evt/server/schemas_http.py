"""The schema registry over HTTP: Confluent Schema Registry's REST API for JSON Schema, under
``/schemas`` on the WebSocket port, so ``SchemaRegistryClient({"url":
"http://HOST:PORT/schemas", "basic.auth.user.info": "user:password"})`` works unchanged.

Served: ``GET /subjects``, ``GET|POST /subjects/S/versions``, ``GET|DELETE
/subjects/S/versions/V`` (``V`` a number or ``latest``) and ``.../V/schema``, ``POST|DELETE
/subjects/S`` (lookup; soft or ``?permanent=true`` delete), ``GET /schemas/ids/N`` with
``/schema``, ``/subjects`` and ``/versions``, ``GET /schemas/guids/G``, ``GET
/schemas/types``, ``POST /compatibility/subjects/S/versions[/V]`` (``?verbose=true`` adds
the reasons), ``GET|PUT|DELETE /config`` and ``/config/S`` (``?defaultToGlobal=true``),
``GET /mode``. Answers are ``application/vnd.schemaregistry.v1+json``; errors are
``{"error_code": N, "message": ...}`` with Confluent's codes (HTTP status: the code's first
three digits): 40101 without valid credentials (HTTP Basic, the server's users), 40301 on a
channel that is neither TLS nor loopback nor trusted, or without the right (the sentence of
:mod:`futoin_evt.log.access`), and those of :mod:`futoin_evt.domain.schemas`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.http11 import Request

from ..auth.users import Authenticator
from ..domain.principal import Principal
from ..domain.schemas import (
    JSON_SCHEMA_TYPE,
    SchemaRegistryError,
    SchemaRow,
    parse_level,
    parse_version,
)
from ..ftn3.messages import decode_json, encode_json
from ..log.access import Refused
from ..log.schemas import Candidate, SchemaRegistry
from ..wsio import ServerIO
from .http import Exchange, HttpEndpoint, HttpError, refused_text

SCHEMAS_PATH: Final = "/schemas"
CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
#: Confluent's codes of the security plugin: no valid credentials, not allowed.
UNAUTHORIZED: Final = 40101
FORBIDDEN: Final = 40301


def registry_error(code: int, message: str) -> HttpError:
    """A refusal in Confluent's shape; the status is the code's first three digits."""
    status = code // 100 if code >= 1000 else code
    body = encode_json({"error_code": code, "message": message}).encode()
    return HttpError(status, message, body, CONTENT_TYPE)


def _truth(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() == "true"


def _registered(row: SchemaRow, *, with_subject: bool = True) -> dict[str, Any]:
    """A version as Confluent answers it (``schemaType`` is named: JSON is not its default)."""
    answer: dict[str, Any] = (
        {"subject": row.subject, "version": row.version} if with_subject else {}
    )
    answer |= {"id": row.schema_id, "guid": row.guid, "schemaType": JSON_SCHEMA_TYPE}
    answer["schema"] = row.schema
    return answer


def _candidate(document: Any, query: dict[str, list[str]]) -> Candidate:
    if not isinstance(document, dict):
        raise registry_error(42201, "Invalid schema: the body is a JSON object with a schema.")
    return Candidate(
        document.get("schema"),
        document.get("schemaType", "AVRO"),  # Confluent's default: refused with a sentence
        normalize=_truth(query, "normalize"),
        references=document.get("references"),
        metadata=document.get("metadata"),
        rule_set=document.get("ruleSet"),
    )


class SchemaRegistryEndpoint(HttpEndpoint):
    """The registry's routes, each a call of :class:`~futoin_evt.log.schemas.SchemaRegistry`."""

    methods = ("GET", "POST", "PUT", "DELETE")
    realm = "futoin-evt schema registry"
    door = "schemas"

    def __init__(
        self,
        registry: SchemaRegistry,
        authenticator: Authenticator,
        secure: Callable[[ServerIO], bool],
        path: str = SCHEMAS_PATH,
    ) -> None:
        super().__init__(path, authenticator, secure)
        self._registry = registry

    def function(self, request: Request) -> str:
        parts = self._parts(request)
        head = parts[0] if parts else "root"
        return f"{request.method.lower()} {head}" if head in _HEADS else "unknown"

    def _parts(self, request: Request) -> list[str]:
        path = urlsplit(request.path).path[len(self.path) :]
        return [unquote(part) for part in path.split("/") if part]

    async def handle(self, io: ServerIO, request: Request, body: bytes, exchange: Exchange) -> None:
        try:
            try:
                who = await self.authorize(io, request)
            except HttpError as exc:
                code = UNAUTHORIZED if exc.status == 401 else FORBIDDEN if exc.status == 403 else 0
                if not code:
                    raise
                refusal = registry_error(code, exc.message)
                raise HttpError(exc.status, exc.message, refusal.body, CONTENT_TYPE) from None
            answer = await self._route(who, request, body)
        except SchemaRegistryError as exc:
            raise registry_error(exc.code, str(exc)) from None
        except Refused as exc:
            raise registry_error(FORBIDDEN, refused_text(exc)) from None
        exchange.respond(200, encode_json(answer).encode(), CONTENT_TYPE)

    async def _route(self, who: Principal, request: Request, body: bytes) -> Any:
        parts = self._parts(request)
        query = parse_qs(urlsplit(request.path).query, keep_blank_values=True)
        method = request.method
        head, rest = (parts[0], parts[1:]) if parts else ("", [])
        registry = self._registry
        if head == "" and method == "GET":
            return {}
        if head == "subjects":
            return await self._subjects(who, method, rest, query, body)
        if head == "schemas":
            return await self._schemas(who, method, rest)
        compatibility = len(rest) in (3, 4) and rest[0] == "subjects" and rest[2] == "versions"
        if head == "compatibility" and method == "POST" and compatibility:
            candidate = _candidate(_json(body), query)
            if len(rest) == 4:
                reasons = await registry.test(who, rest[1], candidate, parse_version(rest[3]))
            else:
                reasons = await registry.test_all(who, rest[1], candidate)
            answer: dict[str, Any] = {"is_compatible": not reasons}
            if _truth(query, "verbose"):
                answer["messages"] = reasons
            return answer
        if head == "config" and len(rest) <= 1:
            subject = rest[0] if rest else None
            if method == "GET":
                level = await registry.get_level(
                    who, subject, default_to_global=_truth(query, "defaultToGlobal")
                )
                return {"compatibilityLevel": level.value}
            if method == "PUT":
                document = _json(body)
                given = document.get("compatibility") if isinstance(document, dict) else None
                level = parse_level(given)
                await registry.set_level(who, subject, level)
                return {"compatibility": level.value}
            if method == "DELETE":
                return {"compatibilityLevel": (await registry.delete_level(who, subject)).value}
        if head == "mode" and method == "GET" and not rest:
            return {"mode": "READWRITE"}
        raise registry_error(404, "HTTP 404 Not Found")

    async def _subjects(
        self, who: Principal, method: str, rest: list[str], query: dict[str, list[str]], body: bytes
    ) -> Any:
        registry = self._registry
        deleted = _truth(query, "deleted")
        if not rest and method == "GET":
            prefix = query.get("subjectPrefix", [""])[-1]
            return await registry.subjects(
                who, deleted=deleted, deleted_only=_truth(query, "deleted_only"), prefix=prefix
            )
        subject = rest[0] if rest else ""
        if len(rest) == 1:
            if method == "POST":
                row = await registry.lookup(
                    who, subject, _candidate(_json(body), query), deleted=deleted
                )
                return _registered(row)
            if method == "DELETE":
                return await registry.delete_subject(
                    who, subject, permanent=_truth(query, "permanent")
                )
        if len(rest) == 2 and rest[1] == "versions":
            if method == "GET":
                return await registry.versions(
                    who, subject, deleted=deleted, deleted_only=_truth(query, "deleted_only")
                )
            if method == "POST":
                row = await registry.register(who, subject, _candidate(_json(body), query))
                return _registered(row, with_subject=False)
        if (
            len(rest) in (3, 4)
            and rest[1] == "versions"
            and rest[2:4] in ([rest[2]], [rest[2], "schema"])
        ):
            version = parse_version(rest[2])
            if method == "GET":
                row = await registry.version(who, subject, version, deleted=deleted)
                return _registered(row) if len(rest) == 3 else decode_json(row.schema)
            if method == "DELETE" and len(rest) == 3:
                permanent = _truth(query, "permanent")
                return await registry.delete_version(who, subject, version, permanent=permanent)
        raise registry_error(404, "HTTP 404 Not Found")

    async def _schemas(self, who: Principal, method: str, rest: list[str]) -> Any:
        if method != "GET":
            raise registry_error(405, "HTTP 405 Method Not Allowed")
        if rest == ["types"]:
            return [JSON_SCHEMA_TYPE]
        if len(rest) in (2, 3) and rest[0] in ("ids", "guids"):
            if rest[0] == "ids":
                if not rest[1].isdigit():
                    raise registry_error(40403, f"Schema {rest[1][:40]} not found.")
                rows = await self._registry.by_id(who, int(rest[1]))
            else:
                rows = await self._registry.by_guid(who, rest[1])
            tail = rest[2] if len(rest) == 3 else ""
            if tail == "":
                return {
                    "schemaType": JSON_SCHEMA_TYPE,
                    "schema": rows[0].schema,
                    "guid": rows[0].guid,
                }
            if tail == "schema":
                return decode_json(rows[0].schema)
            if tail == "subjects":
                return list(dict.fromkeys(row.subject for row in rows if not row.deleted))
            if tail == "versions":
                return [{"subject": r.subject, "version": r.version} for r in rows if not r.deleted]
        raise registry_error(404, "HTTP 404 Not Found")


#: The first part of each route (the metrics' function label is the method and it).
_HEADS: Final = frozenset({"root", "subjects", "schemas", "compatibility", "config", "mode"})


def _json(body: bytes) -> Any:
    try:
        return decode_json(body) if body else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise registry_error(400, f"The body is not JSON: {exc}.") from None
