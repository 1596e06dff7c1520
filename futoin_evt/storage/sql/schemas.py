"""The schema registry's tables and statements, spelt for either backend by its parameter
mark (``?`` for SQLite, ``%s`` for PostgreSQL).

``schemas`` holds each distinct schema text of a stream once, under its global id;
``schema_versions`` the versions of each subject (``STREAM-TYPE``), soft-deleted ones
flagged; ``schema_config`` the compatibility level of a subject, or the global one (subject
``''``). Rows go with their stream (``ON DELETE CASCADE``). A change of a subject's
versions moves the streams registry's version on, so every process hears of it the way it
hears of a stream added (the workers' channel, PostgreSQL's notification, the poll).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Final, TypeVar

from ...domain.schemas import CompiledSchema, JsonSchema, SchemaRow, check_event, compile_schema
from ..errors import SchemaChanged
from ..tables import Step
from .calls import SqlCalls

_R = TypeVar("_R")

#: The schema version that adds the registry's tables.
SCHEMAS_VERSION: Final = 11

#: (identity column, boolean type) of each backend's tables.
_SQLITE: Final = ("INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER")
_POSTGRES: Final = ("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "BOOLEAN")


def tables_sql(postgres: bool) -> tuple[str, ...]:
    """The statements of :data:`SCHEMAS_VERSION` (ids are never reused: AUTOINCREMENT, a
    sequence)."""
    identity, boolean = _POSTGRES if postgres else _SQLITE
    return (
        f"""CREATE TABLE IF NOT EXISTS schemas (
            id {identity},
            stream TEXT NOT NULL REFERENCES streams(name) ON DELETE CASCADE,
            fingerprint TEXT NOT NULL,   -- SHA-256 of the text: one id per text and stream
            schema TEXT NOT NULL,        -- canonical JSON text
            guid TEXT NOT NULL UNIQUE,
            UNIQUE (stream, fingerprint)
        )""",
        f"""CREATE TABLE IF NOT EXISTS schema_versions (
            subject TEXT NOT NULL,
            version INTEGER NOT NULL,
            stream TEXT NOT NULL REFERENCES streams(name) ON DELETE CASCADE,
            schema_id BIGINT NOT NULL REFERENCES schemas(id) ON DELETE CASCADE,
            deleted {boolean} NOT NULL DEFAULT FALSE,
            PRIMARY KEY (subject, version)
        )""",
        "CREATE INDEX IF NOT EXISTS schema_versions_by_id ON schema_versions (schema_id)",
        """CREATE TABLE IF NOT EXISTS schema_config (
            subject TEXT PRIMARY KEY,    -- '' for the global level
            stream TEXT REFERENCES streams(name) ON DELETE CASCADE,
            compatibility TEXT NOT NULL
        )""",
    )


_ROWS: Final = (
    "SELECT v.subject, v.version, v.schema_id, s.schema, s.guid, v.deleted"
    " FROM schema_versions v JOIN schemas s ON s.id = v.schema_id"
)
_ORDER: Final = " ORDER BY v.subject, v.version"


def rows_sql(mark: str, by: str | None) -> str:
    """The versions with their schemas, deleted ones too: of one subject (``by``
    ``"subject"``), of one schema id (``"id"``) or guid (``"guid"``), or all (None)."""
    where = {
        None: "",
        "subject": f" WHERE v.subject = {mark}",
        "id": f" WHERE v.schema_id = {mark}",
        "guid": f" WHERE s.guid = {mark}",
    }[by]
    return _ROWS + where + _ORDER


def rows_key(
    subject: str | None, schema_id: int | None, guid: str | None
) -> tuple[str | None, list[Any]]:
    """Which rows a store's ``schema_rows`` reads (:func:`rows_sql`'s ``by``), and the value."""
    if subject is not None:
        return "subject", [subject]
    if schema_id is not None:
        return "id", [schema_id]
    if guid is not None:
        return "guid", [guid]
    return None, []


#: The newest live version of each subject.
LATEST_SQL: Final = (
    _ROWS + " WHERE NOT v.deleted AND v.version = (SELECT MAX(w.version) FROM schema_versions w"
    " WHERE w.subject = v.subject AND NOT w.deleted)" + _ORDER
)

CONFIGS_SQL: Final = "SELECT subject, compatibility FROM schema_config"


def schema_row(row: Sequence[Any]) -> SchemaRow:
    subject, version, schema_id, schema, guid, deleted = row
    return SchemaRow(
        str(subject), int(version), int(schema_id), str(schema), str(guid), bool(deleted)
    )


def register_steps(
    stream: str, subject: str, text: str, fingerprint: str, guid: str, after: int, mark: str
) -> Generator[Step, list[Sequence[Any]], SchemaRow]:
    """One registration as statements (the backend runs each in one transaction and sends
    the rows back): KeyError when there is no such stream, :class:`SchemaChanged` when the
    subject's newest live version is no longer ``after`` (0: none)."""
    if not (yield (f"SELECT 1 FROM streams WHERE name = {mark}", [stream])):
        raise KeyError(stream)
    ((newest, live),) = yield (
        "SELECT COALESCE(MAX(version), 0),"
        " COALESCE(MAX(CASE WHEN deleted THEN 0 ELSE version END), 0)"
        f" FROM schema_versions WHERE subject = {mark}",
        [subject],
    )
    if int(live) != after:
        raise SchemaChanged(subject)
    found = yield (
        f"SELECT id, guid FROM schemas WHERE stream = {mark} AND fingerprint = {mark}",
        [stream, fingerprint],
    )
    if not found:
        found = yield (
            f"INSERT INTO schemas (stream, fingerprint, schema, guid)"
            f" VALUES ({mark}, {mark}, {mark}, {mark}) RETURNING id, guid",
            [stream, fingerprint, text, guid],
        )
    schema_id, kept_guid = found[0]
    version = int(newest) + 1
    yield (
        "INSERT INTO schema_versions (subject, version, stream, schema_id, deleted)"
        f" VALUES ({mark}, {mark}, {mark}, {mark}, FALSE)",
        [subject, version, stream, schema_id],
    )
    return SchemaRow(subject, version, int(schema_id), text, str(kept_guid), False)


def delete_steps(
    subject: str, versions: Sequence[int], permanent: bool, mark: str
) -> Generator[Step, list[Sequence[Any]], None]:
    """Soft-delete ``versions`` of ``subject``, or remove them (with the schemas no version
    uses any more, and the subject's level once it has no version left)."""
    listed = ", ".join([mark] * len(versions))
    which = f" WHERE subject = {mark} AND version IN ({listed})"
    if not permanent:
        yield "UPDATE schema_versions SET deleted = TRUE" + which, [subject, *versions]
        return
    yield "DELETE FROM schema_versions" + which, [subject, *versions]
    yield (
        "DELETE FROM schemas WHERE NOT EXISTS"
        " (SELECT 1 FROM schema_versions v WHERE v.schema_id = schemas.id)",
        [],
    )
    yield (
        f"DELETE FROM schema_config WHERE subject = {mark} AND NOT EXISTS"
        f" (SELECT 1 FROM schema_versions WHERE subject = {mark})",
        [subject, subject],
    )


def set_config_steps(subject: str, stream: str | None, level: str | None, mark: str) -> list[Step]:
    """Set a subject's level (``''``: the global one); None removes it."""
    if level is None:
        return [(f"DELETE FROM schema_config WHERE subject = {mark}", [subject])]
    return [
        (
            "INSERT INTO schema_config (subject, stream, compatibility)"
            f" VALUES ({mark}, {mark}, {mark}) ON CONFLICT (subject)"
            " DO UPDATE SET compatibility = excluded.compatibility",
            [subject, stream, level],
        )
    ]


# -- the native API's check (the server checks from memory: futoin_evt.log.schemas) ----------

#: Validators the native API compiled, by the fingerprint of their schema's text (changed
#: under the lock: applications call it from several threads).
_compiled: dict[str, CompiledSchema] = {}
_compiled_lock: Final = threading.Lock()
#: Validators kept at most (the oldest compiled goes first).
MAX_COMPILED: Final = 64


def check_steps(
    stream: str, event_type: str, data: Any, mark: str
) -> Generator[Step, list[Sequence[Any]], None]:
    """Check ``data`` (decoded JSON) of ``event_type`` against the newest live version of its
    subject on ``stream``, read in the caller's transaction (one read by the subject's
    key; a second, once per schema text and process, reads the text to compile it):
    :class:`~futoin_evt.domain.schemas.EventDataInvalid` when it does not match."""
    subject = f"{stream}-{event_type}"
    rows = yield (
        "SELECT v.version, s.fingerprint FROM schema_versions v"
        f" JOIN schemas s ON s.id = v.schema_id WHERE v.subject = {mark} AND NOT v.deleted"
        " ORDER BY v.version DESC LIMIT 1",
        [subject],
    )
    if not rows:
        return
    version, fingerprint = rows[0]
    compiled = _compiled.get(fingerprint)
    if compiled is None:
        ((text,),) = yield (
            f"SELECT schema FROM schemas WHERE stream = {mark} AND fingerprint = {mark}",
            [stream, fingerprint],
        )
        compiled = compile_schema(JsonSchema(text, json.loads(text)))
        with _compiled_lock:
            if len(_compiled) >= MAX_COMPILED:
                del _compiled[next(iter(_compiled))]
            _compiled[fingerprint] = compiled
    check_event(compiled, data, event_type, subject, int(version))


Fetch = Callable[[str, Sequence[Any]], list[Any]]


def check_data(fetch: Fetch, stream: str, event_type: str, data: Any, mark: str) -> None:
    """:func:`check_steps`, each statement run by ``fetch`` (its rows)."""
    steps = check_steps(stream, event_type, data, mark)
    try:
        step = next(steps)
        while True:
            step = steps.send(fetch(*step))
    except StopIteration:
        return


async def check_data_async(
    fetch: Callable[[str, Sequence[Any]], Awaitable[list[Any]]],
    stream: str,
    event_type: str,
    data: Any,
    mark: str,
) -> None:
    """:func:`check_data` on an asyncio connection."""
    steps = check_steps(stream, event_type, data, mark)
    try:
        step = next(steps)
        while True:
            step = steps.send(await fetch(*step))
    except StopIteration:
        return


class SchemaCalls(SqlCalls):
    """The schema registry's calls; a backend runs a change's steps
    (:meth:`_change_schemas`)."""

    async def _change_schemas(self, steps: Generator[Step, Any, _R], subject: str) -> _R:
        """Run ``steps`` in one transaction that moves the registry's and the access
        versions on, and tell the streams' listeners; :class:`SchemaChanged` for
        ``subject`` when another registration of the same moment wins."""
        raise NotImplementedError

    async def schema_rows(
        self, *, subject: str | None = None, schema_id: int | None = None, guid: str | None = None
    ) -> list[SchemaRow]:
        by, value = rows_key(subject, schema_id, guid)
        rows = await self._fetch(rows_sql(self.dialect.mark, by), value)
        return [schema_row(row) for row in rows]

    async def latest_schemas(self) -> list[SchemaRow]:
        return [schema_row(row) for row in await self._fetch(LATEST_SQL)]

    async def add_schema_version(
        self, stream: str, subject: str, text: str, fingerprint: str, *, after: int
    ) -> SchemaRow:
        guid = str(uuid.uuid4())
        mark = self.dialect.mark
        steps = register_steps(stream, subject, text, fingerprint, guid, after, mark)
        return await self._change_schemas(steps, subject)

    async def delete_schema_versions(
        self, subject: str, versions: Sequence[int], *, permanent: bool
    ) -> None:
        steps = delete_steps(subject, versions, permanent, self.dialect.mark)
        await self._change_schemas(steps, subject)

    async def schema_levels(self) -> dict[str, str]:
        rows = await self._fetch(CONFIGS_SQL)
        return {str(subject): str(level) for subject, level in rows}

    async def set_schema_level(self, subject: str, stream: str | None, level: str | None) -> None:
        for sql, params in set_config_steps(subject, stream, level, self.dialect.mark):
            await self._write(sql, params)
