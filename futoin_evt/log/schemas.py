"""The schema registry: subjects ``STREAM-TYPE``, their versions and levels, with the rules
every door meets (names, rights, compatibility), and the schema each event type is checked
against.

Rights: reading a subject (its versions, schemas, level, a compatibility test) needs read
on its stream; registering, deleting and setting its level need manage; the global level
needs manage on every stream (a grant on ``*``). A caller with no right on a stream's name
is refused the same way whether it exists or not; a listing shows only the subjects of
streams the caller may read, and a schema id only to those who may read a stream using it.

:meth:`SchemaRegistry.schema_of` is what the event log (:mod:`.eventlog`) calls for each
event appended: the newest live version of the type's subject on the stream, from memory
(one dictionary lookup), compiled once per version on first use. Every process keeps that
memory: it reloads it when the streams registry's version moves on, which every change of a
subject's versions does. A registration or delete returns once the change is in use in this
process and in the other workers of the same server (they confirm through their channel);
other processes on PostgreSQL have it once they hear the notification the commit sends
(milliseconds later), on SQLite within the registry's poll (1 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ..domain.principal import Principal
from ..domain.rights import ANY_STREAM, Right
from ..domain.schema_compat import incompatibilities
from ..domain.schemas import (
    DEFAULT_COMPATIBILITY,
    JSON_SCHEMA_TYPE,
    Compatibility,
    CompiledSchema,
    ConfigNotFound,
    EventDataInvalid,
    Incompatible,
    InvalidSchema,
    JsonSchema,
    SchemaNotFound,
    SchemaRow,
    SchemaViolation,
    SubjectNotFound,
    SubjectNotSoftDeleted,
    SubjectSoftDeleted,
    VersionNotFound,
    VersionNotSoftDeleted,
    VersionSoftDeleted,
    compile_schema,
    parse_schema,
    parse_subject,
    top_properties,
)
from ..domain.stream import UserId
from ..storage.base import Schemas
from ..storage.errors import SchemaChanged
from .access import Access

logger = logging.getLogger(__name__)

#: The global level's key among the subjects' levels.
GLOBAL: Final = ""
#: How often a registration that lost a race with another is checked again.
MAX_TRIES: Final = 8
#: Who acts for the command line with ``--db``: the database's owner.
OPERATOR: Final = Principal(UserId(0), "operator", True)


class StreamsView(Protocol):
    """What the registry needs of the streams registry (:class:`~.streams.StreamRegistry`)."""

    access: Access

    def reachable(self, who: Principal, name: str, right: Right) -> Any: ...

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A schema as a request gives it: its text, type and options."""

    text: Any
    schema_type: Any = JSON_SCHEMA_TYPE
    #: Keys sorted before it is kept and compared (Confluent's ``normalize``).
    normalize: bool = False
    #: References to other subjects (not kept: a schema refers only inside itself).
    references: Any = None
    #: Confluent's metadata and rule sets (not kept either).
    metadata: Any = None
    rule_set: Any = None

    def parse(self) -> JsonSchema:
        """The schema; :class:`InvalidSchema` when it is not one this registry keeps."""
        if self.references:
            raise InvalidSchema(
                "references to other subjects are not kept: refer inside the schema"
            )
        if self.metadata or self.rule_set:
            raise InvalidSchema("metadata and rule sets are not kept")
        return parse_schema(self.text, self.schema_type, normalize=self.normalize)


@dataclass(slots=True)
class TypeSchema:
    """The newest live version of one event type's subject: what its events are checked
    against."""

    subject: str
    version: int
    schema_id: int
    text: str
    _document: Any = field(default=None, repr=False)
    _compiled: CompiledSchema | None = field(default=None, repr=False)

    @property
    def document(self) -> Any:
        if self._document is None:
            self._document = json.loads(self.text)
        return self._document

    @property
    def compiled(self) -> CompiledSchema:
        """Compiled on first use (some 60 µs), then kept."""
        if self._compiled is None:
            self._compiled = compile_schema(JsonSchema(self.text, self.document))
        return self._compiled

    def violation(self, data: Any) -> SchemaViolation | None:
        """None when ``data`` (decoded JSON) is valid, else where and why it is not."""
        return self.compiled.violation(data)

    def check(self, event_type: str, data: Any, position: tuple[int, int] | None = None) -> None:
        """:class:`~futoin_evt.domain.schemas.EventDataInvalid` when ``data`` (decoded JSON)
        is not valid; ``position``: (index, count) of the event among those of one call."""
        violation = (self._compiled or self.compiled).violation(data)
        if violation is not None:
            raise EventDataInvalid(event_type, self.subject, self.version, violation, position)


class SchemaRegistry:
    """``server.schemas``: the registry's calls on a user's behalf, and the schema of each
    typed event (:meth:`schema_of`)."""

    def __init__(self, store: Schemas, streams: StreamsView) -> None:
        self._store = store
        self._streams = streams
        self._access = streams.access
        self._latest: dict[tuple[str, str], TypeSchema] = {}
        self._reloading: asyncio.Task[None] | None = None
        self._again = False
        self._stop_listening: Callable[[], None] | None = None
        #: Tells the other workers of this server that schemas changed; done once each has
        #: them in use (``PeerChannel.grants_changed``).
        self.tell_others: Callable[[], Awaitable[None]] | None = None

    async def start(self) -> None:
        """Load the newest schemas, then follow every change of the streams registry."""
        await self.reload()
        self._stop_listening = self._streams.listen(self._moved)

    async def close(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
        if self._reloading is not None:
            self._reloading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloading

    # -- what the doors that append call -------------------------------------------------------

    def schema_of(self, stream: str, event_type: str) -> TypeSchema | None:
        """The schema events of ``event_type`` on ``stream`` are checked against; None when
        the type has none (its events are not checked)."""
        return self._latest.get((stream, event_type))

    def type_of_schema(self, stream: str, schema_id: int) -> str | None:
        """The event type of ``stream`` whose newest schema is ``schema_id`` (what a value in
        Confluent's wire format names); None when no type of the stream has it."""
        for (name, event_type), schema in self._latest.items():
            if name == stream and schema.schema_id == schema_id:
                return event_type
        return None

    def typed(self, stream: str) -> list[TypeSchema]:
        """The schemas of the types of ``stream`` that have one, by subject."""
        found = [s for (name, _t), s in self._latest.items() if name == stream]
        return sorted(found, key=lambda s: s.subject)

    def attributes(self, stream: str) -> list[tuple[str, list[str]]]:
        """(event type, the names of the top-level properties its schema gives a scalar or
        no type) of each typed event type of ``stream``: what GET-EVENTS lists for it."""
        return [
            (parse_subject(schema.subject)[1], [
                name for name, kind, _required in top_properties(schema.document)
                if not set(kind.split("|")) & {"object", "array"}
            ])
            for schema in self.typed(stream)
        ]  # fmt: skip

    async def reload(self) -> None:
        """Read the newest live version of every subject (a version already known keeps
        its compiled validator)."""
        rows = await self._store.latest_schemas()
        known = self._latest
        latest: dict[tuple[str, str], TypeSchema] = {}
        for row in rows:
            stream, event_type = parse_subject(row.subject)
            had = known.get((stream, event_type))
            if had is not None and had.schema_id == row.schema_id and had.version == row.version:
                latest[(stream, event_type)] = had
            else:
                latest[(stream, event_type)] = TypeSchema(
                    row.subject, row.version, row.schema_id, row.schema
                )
        self._latest = latest

    async def catch_up(self) -> None:
        """Schemas changed (here, or a worker of this server says so): returns once the
        newest are in use here."""
        self._moved()
        reloading = self._reloading
        if reloading is not None:
            await asyncio.shield(reloading)

    async def _changed_here(self) -> None:
        """A change made here: returns once it is in use here and in the other workers of
        this server, so the next append on any of them meets it."""
        told = self.tell_others() if self.tell_others is not None else None
        await self.catch_up()
        if told is not None:
            await told

    def _moved(self) -> None:
        """The streams registry moved on (a stream or a subject changed): reload soon."""
        if self._reloading is not None and not self._reloading.done():
            self._again = True
            return
        self._reloading = asyncio.get_running_loop().create_task(self._reload_soon())

    async def _reload_soon(self) -> None:
        while True:
            self._again = False
            try:
                await self.reload()
            except Exception as exc:  # the database is away: the next change or poll
                logger.warning("the schemas could not be reloaded: %s", exc)
            if not self._again:
                return

    # -- subjects and versions -----------------------------------------------------------------

    def _subject(self, who: Principal, subject: str, right: Right) -> str:
        """The stream of ``subject`` for a call that needs ``right`` on it:
        :class:`~futoin_evt.log.access.AccessDenied`, or SubjectNotFound when there is no
        such stream."""
        stream, _event_type = parse_subject(subject)
        if self._streams.reachable(who, stream, right) is None:
            raise SubjectNotFound(subject, f"There is no stream {stream}.")
        return stream

    async def _rows(self, who: Principal, subject: str, right: Right) -> list[SchemaRow]:
        """Every version of ``subject``, deleted ones too; SubjectNotFound when none."""
        self._subject(who, subject, right)
        rows = await self._store.schema_rows(subject=subject)
        if not rows:
            raise SubjectNotFound(subject)
        return rows

    async def subjects(
        self, who: Principal, *, deleted: bool = False, deleted_only: bool = False, prefix: str = ""
    ) -> list[str]:
        """The subjects of the streams ``who`` may read: those with a live version, those
        with only soft-deleted ones too (``deleted``), or those only (``deleted_only``)."""
        live: dict[str, bool] = {}
        for row in await self._store.schema_rows():
            live[row.subject] = live.get(row.subject, False) or not row.deleted
        return [
            subject
            for subject, alive in live.items()
            if subject.startswith(prefix)
            and (not alive if deleted_only else alive or deleted)
            and self._readable(who, subject)
        ]

    def _readable(self, who: Principal, subject: str) -> bool:
        stream, _type = parse_subject(subject)
        return self._access.allows(who, Right.READ, stream)

    async def versions(
        self, who: Principal, subject: str, *, deleted: bool = False, deleted_only: bool = False
    ) -> list[int]:
        rows = await self._rows(who, subject, Right.READ)
        found = [
            r.version for r in rows if (r.deleted if deleted_only else deleted or not r.deleted)
        ]
        if not found:
            raise SubjectNotFound(subject)
        return found

    async def version(
        self, who: Principal, subject: str, version: int | None, *, deleted: bool = False
    ) -> SchemaRow:
        """Version ``version`` of ``subject``, or its newest live one (None)."""
        rows = await self._rows(who, subject, Right.READ)
        return _pick(subject, rows, version, deleted)

    async def by_id(self, who: Principal, schema_id: int) -> list[SchemaRow]:
        """The versions using schema ``schema_id`` that ``who`` may read (the schema is
        each one's ``schema``); SchemaNotFound when none."""
        return self._shown(who, await self._store.schema_rows(schema_id=schema_id), schema_id)

    async def by_guid(self, who: Principal, guid: str) -> list[SchemaRow]:
        return self._shown(who, await self._store.schema_rows(guid=guid), guid)

    def _shown(self, who: Principal, rows: list[SchemaRow], what: object) -> list[SchemaRow]:
        shown = [row for row in rows if self._readable(who, row.subject)]
        if not shown:
            raise SchemaNotFound(what)
        return shown

    async def lookup(
        self, who: Principal, subject: str, candidate: Candidate, *, deleted: bool = False
    ) -> SchemaRow:
        """The version of ``subject`` that holds ``candidate``; SchemaNotFound when none."""
        rows = await self._rows(who, subject, Right.READ)
        schema = candidate.parse()
        for row in reversed(rows):
            if (deleted or not row.deleted) and _same(row.schema, schema, candidate.normalize):
                return row
        raise SchemaNotFound()

    async def register(self, who: Principal, subject: str, candidate: Candidate) -> SchemaRow:
        """Add ``candidate`` as the next version of ``subject``, or return the live version
        that holds it already. Incompatible when it breaks the subject's level."""
        stream = self._subject(who, subject, Right.MANAGE)
        schema = candidate.parse()
        for _try in range(MAX_TRIES):
            rows = await self._store.schema_rows(subject=subject)
            live = [row for row in rows if not row.deleted]
            for row in live:
                if _same(row.schema, schema, candidate.normalize):
                    return row
            level = await self.level(subject)
            _check(level, schema, live)
            try:
                added = await self._store.add_schema_version(
                    stream,
                    subject,
                    schema.text,
                    schema.fingerprint,
                    after=live[-1].version if live else 0,
                )
            except SchemaChanged:
                continue  # another registration came first: check against it
            except KeyError:
                raise SubjectNotFound(subject, f"There is no stream {stream}.") from None
            await self._changed_here()
            return added
        raise SchemaChanged(subject)

    async def test(
        self, who: Principal, subject: str, candidate: Candidate, version: int | None
    ) -> list[str]:
        """Why ``candidate`` would break the level of ``subject`` with one version (None:
        the newest live one); empty when it keeps it. Needs read (it tells of schemas)."""
        rows = await self._rows(who, subject, Right.READ)
        against = _pick(subject, rows, version, deleted=False)
        return _reasons(await self.level(subject), candidate.parse(), [against])

    async def test_all(self, who: Principal, subject: str, candidate: Candidate) -> list[str]:
        """Why ``candidate`` would be refused as the next version of ``subject`` (a subject
        with no version takes any); empty when it would not."""
        self._subject(who, subject, Right.READ)
        live = [row for row in await self._store.schema_rows(subject=subject) if not row.deleted]
        return _reasons(await self.level(subject), candidate.parse(), live)

    async def delete_subject(
        self, who: Principal, subject: str, *, permanent: bool = False
    ) -> list[int]:
        """Soft-delete every live version (permanent: remove the soft-deleted subject);
        the versions deleted."""
        rows = await self._rows(who, subject, Right.MANAGE)
        live = [row.version for row in rows if not row.deleted]
        if permanent:
            if live:
                raise SubjectNotSoftDeleted(subject)
            live = [row.version for row in rows]
        elif not live:
            raise SubjectSoftDeleted(subject)
        await self._store.delete_schema_versions(subject, live, permanent=permanent)
        await self._changed_here()
        return live

    async def delete_version(
        self, who: Principal, subject: str, version: int | None, *, permanent: bool = False
    ) -> int:
        """Soft-delete one version (None: the newest live one), or remove a soft-deleted one."""
        rows = await self._rows(who, subject, Right.MANAGE)
        row = _pick(subject, rows, version, deleted=permanent)
        if permanent and not row.deleted:
            raise VersionNotSoftDeleted(subject, row.version)
        if not permanent and row.deleted:
            raise VersionSoftDeleted(subject, row.version)
        await self._store.delete_schema_versions(subject, [row.version], permanent=permanent)
        await self._changed_here()
        return row.version

    # -- levels --------------------------------------------------------------------------------

    async def level(self, subject: str) -> Compatibility:
        """The level a registration of ``subject`` meets: its own, else the global one."""
        levels = await self._store.schema_levels()
        return Compatibility(levels.get(subject) or levels.get(GLOBAL) or DEFAULT_COMPATIBILITY)

    async def get_level(
        self, who: Principal, subject: str | None = None, *, default_to_global: bool = False
    ) -> Compatibility:
        """The global level (None), or the level set for ``subject``: ConfigNotFound when it
        has none, unless ``default_to_global``."""
        levels = await self._store.schema_levels()
        if subject is not None:
            self._subject(who, subject, Right.READ)
            if subject in levels:
                return Compatibility(levels[subject])
            if not default_to_global:
                raise ConfigNotFound(subject)
        return Compatibility(levels.get(GLOBAL) or DEFAULT_COMPATIBILITY)

    async def set_level(self, who: Principal, subject: str | None, level: Compatibility) -> None:
        stream = self._level_stream(who, subject)
        await self._store.set_schema_level(subject or GLOBAL, stream, level.value)

    async def delete_level(self, who: Principal, subject: str | None) -> Compatibility:
        """Remove the level of ``subject`` (ConfigNotFound when none), or reset the global
        one; the level it had."""
        stream = self._level_stream(who, subject)
        levels = await self._store.schema_levels()
        had = levels.get(subject or GLOBAL)
        if had is None and subject is not None:
            raise ConfigNotFound(subject)
        await self._store.set_schema_level(subject or GLOBAL, stream, None)
        return Compatibility(had or DEFAULT_COMPATIBILITY)

    def _level_stream(self, who: Principal, subject: str | None) -> str | None:
        """The stream whose level a change sets (None: the global one, manage on ``*``)."""
        if subject is None:
            self._access.check(who, Right.MANAGE, ANY_STREAM)
            return None
        return self._subject(who, subject, Right.MANAGE)


def _pick(subject: str, rows: list[SchemaRow], version: int | None, deleted: bool) -> SchemaRow:
    """Version ``version`` of the rows (soft-deleted ones with ``deleted``), or the newest
    live one (None)."""
    if version is None:
        live = [row for row in rows if not row.deleted]
        if not live:
            raise VersionNotFound(subject, "latest")
        return live[-1]
    for row in rows:
        if row.version == version and (deleted or not row.deleted):
            return row
    raise VersionNotFound(subject, version)


def _same(text: str, schema: JsonSchema, normalize: bool) -> bool:
    if not normalize:
        return text == schema.text
    return parse_schema(text, normalize=True).text == schema.text


def _check(level: Compatibility, schema: JsonSchema, live: list[SchemaRow]) -> None:
    """Incompatible when ``schema`` breaks ``level`` with the live versions (oldest first)."""
    earlier = [(row.version, json.loads(row.schema)) for row in reversed(live)]
    found = incompatibilities(level, schema.document, earlier)
    if found is not None:
        raise Incompatible(level, *found)


def _reasons(level: Compatibility, schema: JsonSchema, live: list[SchemaRow]) -> list[str]:
    try:
        _check(level, schema, live)
    except Incompatible as exc:
        return exc.reasons
    return []
