"""``futoin-evt schema``: the event types' schemas, in the database (``--db``) or on a running
server (``--url``, through its schema registry under ``/schemas``, with the user's rights:
adding takes manage on the stream, reading takes read)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import quote, urlsplit, urlunsplit

from ..domain.schemas import (
    SchemaRegistryError,
    SchemaRow,
    parse_subject,
    subject_name,
)
from ..log.access import Refused
from ..log.schemas import OPERATOR, Candidate, SchemaRegistry
from ..log.streams import StreamRegistry
from .common import (
    BadSetting,
    CliError,
    Commands,
    add_where,
    opened_store,
    print_json,
    read_credentials,
)

#: The schema registry's path on a server's port.
SCHEMAS_PATH: Final = "/schemas"
CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
#: Refusals that are the input's fault (exit 2): invalid subject, schema, version, level.
_BAD_INPUT: Final = frozenset({42201, 42202, 42203, 42208})


def add_commands(commands: Commands) -> None:
    schema = commands.add_parser(
        "schema", help="event types' JSON schemas (the schema registry)"
    ).add_subparsers(dest="schema_command", required=True, metavar="ACTION")
    add = schema.add_parser("add", help="register FILE as the next version of a type's schema")
    _add_subject(add)
    add.add_argument("file", type=Path, metavar="FILE", help="a JSON Schema document; - for stdin")
    add.add_argument("--normalize", action="store_true", help="sort the keys before keeping it")
    add_where(add)
    add.set_defaults(run=_add)
    listing = schema.add_parser("list", help="the types with a schema, and their newest version")
    listing.add_argument(
        "stream", nargs="?", metavar="STREAM", help="only this stream's (default: every stream)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_where(listing)
    listing.set_defaults(run=_list)
    show = schema.add_parser("show", help="a type's schema")
    _add_subject(show)
    show.add_argument("--version", type=int, metavar="V", help="this version (default: the newest)")
    show.add_argument("--json", action="store_true", help="the version as JSON, schema included")
    add_where(show)
    show.set_defaults(run=_show)
    check = schema.add_parser(
        "check", help="whether FILE may be the next version (exit 1 with the reasons if not)"
    )
    _add_subject(check)
    check.add_argument(
        "file", type=Path, metavar="FILE", help="a JSON Schema document; - for stdin"
    )
    add_where(check)
    check.set_defaults(run=_check)


def _add_subject(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stream", metavar="STREAM", help="the stream the type's events are in")
    parser.add_argument("type", metavar="TYPE", help="the event type, e.g. ORDER_PLACED")


def _version(row: SchemaRow | dict[str, Any]) -> dict[str, Any]:
    """A version as the commands print it with ``--json``."""
    if isinstance(row, dict):
        return {k: row[k] for k in ("subject", "version", "id", "schema")}
    return {
        "subject": row.subject,
        "version": row.version,
        "id": row.schema_id,
        "schema": row.schema,
    }


class SchemaAdmin(Protocol):
    """Where the commands act. Refusals are :class:`SchemaRegistryError` (or a
    :class:`CliError` from a server)."""

    async def add(self, subject: str, text: str, normalize: bool) -> dict[str, Any]: ...

    async def latest(self, stream: str | None) -> list[dict[str, Any]]: ...

    async def show(self, subject: str, version: int | None) -> dict[str, Any]: ...

    async def check(self, subject: str, text: str) -> list[str]: ...


class _InDatabase:
    """As the database's owner (every right), through the registry's rules."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry

    async def add(self, subject: str, text: str, normalize: bool) -> dict[str, Any]:
        return _version(
            await self._registry.register(OPERATOR, subject, Candidate(text, normalize=normalize))
        )

    async def latest(self, stream: str | None) -> list[dict[str, Any]]:
        subjects = await self._registry.subjects(OPERATOR)
        return [
            _version(await self._registry.version(OPERATOR, subject, None))
            for subject in subjects
            if stream is None or parse_subject(subject)[0] == stream
        ]

    async def show(self, subject: str, version: int | None) -> dict[str, Any]:
        return _version(await self._registry.version(OPERATOR, subject, version))

    async def check(self, subject: str, text: str) -> list[str]:
        return await self._registry.test_all(OPERATOR, subject, Candidate(text))


class _OnServer:
    """Through the server's registry (Confluent's REST API), as the user."""

    def __init__(self, url: str, credentials: tuple[str, str]) -> None:
        parts = urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        if scheme not in ("http", "https"):
            raise BadSetting(f"--url is the server's ws:// or http:// URL, not {url}.")
        self._base = urlunsplit((scheme, parts.netloc, SCHEMAS_PATH, "", ""))
        token = base64.b64encode(":".join(credentials).encode()).decode()
        self._auth = f"Basic {token}"

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        return await asyncio.to_thread(self._request, method, path, body)

    def _request(self, method: str, path: str, body: Any) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._base + path, data=data, method=method)
        request.add_header("Authorization", self._auth)
        request.add_header("Accept", CONTENT_TYPE)
        if data is not None:
            request.add_header("Content-Type", CONTENT_TYPE)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise CliError(f"cannot reach {self._base}: {getattr(exc, 'reason', exc)}.") from None

    async def add(self, subject: str, text: str, normalize: bool) -> dict[str, Any]:
        path = f"/subjects/{quote(subject, safe='')}/versions?normalize={str(normalize).lower()}"
        await self._call("POST", path, {"schema": text, "schemaType": "JSON"})
        return await self.show(subject, None)  # the version the registration kept or found

    async def latest(self, stream: str | None) -> list[dict[str, Any]]:
        subjects = await self._call("GET", "/subjects")
        return [
            await self.show(subject, None)
            for subject in subjects
            if stream is None or parse_subject(subject)[0] == stream
        ]

    async def show(self, subject: str, version: int | None) -> dict[str, Any]:
        which = "latest" if version is None else str(version)
        return _version(
            await self._call("GET", f"/subjects/{quote(subject, safe='')}/versions/{which}")
        )

    async def check(self, subject: str, text: str) -> list[str]:
        path = f"/compatibility/subjects/{quote(subject, safe='')}/versions?verbose=true"
        answer = await self._call("POST", path, {"schema": text, "schemaType": "JSON"})
        return (
            [] if answer.get("is_compatible") else list(answer.get("messages") or ["incompatible"])
        )


class _Refused(SchemaRegistryError):
    """A refusal a server answered (its code and sentence)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _refusal(exc: urllib.error.HTTPError) -> Exception:
    try:
        answer = json.loads(exc.read())
        return _Refused(int(answer["error_code"]), str(answer["message"]))
    except (ValueError, KeyError, TypeError):
        return CliError(f"the server answered HTTP {exc.code} {exc.reason}.")


@contextlib.asynccontextmanager
async def _admin(args: argparse.Namespace) -> AsyncIterator[SchemaAdmin]:
    try:
        if args.url is not None:
            yield _OnServer(args.url, read_credentials(args))
        else:
            async with opened_store(args.db) as store:
                streams = await StreamRegistry.open(store)
                try:
                    yield _InDatabase(SchemaRegistry(store, streams))
                finally:
                    await streams.close()
    except SchemaRegistryError as exc:
        message = str(exc).rstrip(".") + "."
        if exc.code in _BAD_INPUT:
            raise BadSetting(message) from None
        raise CliError(message) from None
    except Refused as exc:
        raise CliError(f"{exc}.") from None


def _subject(args: argparse.Namespace) -> str:
    try:
        return subject_name(args.stream, args.type)
    except SchemaRegistryError as exc:
        raise BadSetting(str(exc)) from None


def _read(path: Path) -> str:
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadSetting(f"cannot read {path}: {exc}.") from None


async def _add(args: argparse.Namespace) -> int:
    subject, text = _subject(args), _read(args.file)
    async with _admin(args) as admin:
        kept = await admin.add(subject, text, args.normalize)
    print(f"{subject}: version {kept['version']}, schema id {kept['id']}")
    return 0


async def _list(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        versions = await admin.latest(args.stream)
    if args.json:
        print_json(versions)
        return 0
    for version in versions:
        print(f"{version['subject']}  version {version['version']}  schema id {version['id']}")
    return 0


async def _show(args: argparse.Namespace) -> int:
    subject = _subject(args)
    async with _admin(args) as admin:
        version = await admin.show(subject, args.version)
    if args.json:
        print_json(version)
        return 0
    print(f"# {subject} version {version['version']}, schema id {version['id']}")
    print(json.dumps(json.loads(version["schema"]), indent=2, ensure_ascii=False))
    return 0


async def _check(args: argparse.Namespace) -> int:
    subject, text = _subject(args), _read(args.file)
    async with _admin(args) as admin:
        reasons = await admin.check(subject, text)
    if reasons:
        print(f"{subject}: incompatible:", file=sys.stderr)
        for reason in reasons:
            print(f"  {reason}", file=sys.stderr)
        return 1
    print(f"{subject}: compatible")
    return 0
