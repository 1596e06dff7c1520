"""Event schemas: the registry's names, levels, errors and compiled validators. No I/O.

One subject per stream and event type, named ``STREAM-TYPE`` (``orders-ORDER_PLACED``): a
stream name never holds an upper-case letter and an event type never a ``-``, so the last
``-`` splits a subject in one way only. A subject's versions count from 1; each version
points at a schema id, one per distinct schema text of a stream (the same text registered
for two types of one stream shares its id; on two streams it gets two, so a stream's ids
tell nothing of another's).

Schemas are JSON Schema documents (the registry's ``schemaType`` ``JSON``), kept as their
canonical text: compact JSON, keys in the order given (sorted with ``normalize``). A schema
may refer only inside itself (``$ref`` starting with ``#``, no ``$id`` naming a place): a
registered schema never makes the server fetch anything.

Errors, each with the Confluent error code the HTTP door answers with::

    SchemaRegistryError
    ├── SubjectNotFound (40401)      VersionNotFound (40402)      SchemaNotFound (40403)
    ├── SubjectSoftDeleted (40404)   SubjectNotSoftDeleted (40405)
    ├── VersionSoftDeleted (40406)   VersionNotSoftDeleted (40407)
    ├── ConfigNotFound (40408)       Incompatible (409)
    └── InvalidSchema (42201)  InvalidVersion (42202)  InvalidCompatibility (42203)
        InvalidSubject (42208)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import jsonschema_rs

from ..quoting import quote_input
from .partition import STREAM_NAME_RE
from .stream import EventRejected

#: The one schema type kept.
JSON_SCHEMA_TYPE: Final = "JSON"
#: Event types a subject may name: those of every door but the ``-`` (DCB's, less ``-``).
SUBJECT_TYPE_RE: Final = re.compile(r"[\w.:]{1,200}", re.ASCII)
#: The longest schema text kept (a schema is not data: 256 KiB is far more than one needs).
MAX_SCHEMA_CHARS: Final = 256 * 1024
#: A schema without ``$schema`` is draft-07, as Confluent's registry takes it.
DEFAULT_DRAFT: Final = "http://json-schema.org/draft-07/schema#"


class Compatibility(StrEnum):
    """What a new version of a subject must keep (Confluent's levels)."""

    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def backward(self) -> bool:
        """The new version reads what the older ones wrote."""
        return self.name.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        """The older versions read what the new one writes."""
        return self.name.startswith(("FORWARD", "FULL"))

    @property
    def transitive(self) -> bool:
        """Checked against every live version, not only the newest."""
        return self.name.endswith("_TRANSITIVE")


DEFAULT_COMPATIBILITY: Final = Compatibility.BACKWARD


# -- errors --------------------------------------------------------------------------------


class SchemaRegistryError(Exception):
    """A refusal of the registry: one sentence, and Confluent's error code for it."""

    code = 50001


class SubjectNotFound(SchemaRegistryError):
    code = 40401

    def __init__(self, subject: str, why: str = "") -> None:
        super().__init__(f"Subject '{subject}' not found.{why and ' ' + why}")


class VersionNotFound(SchemaRegistryError):
    code = 40402

    def __init__(self, subject: str, version: object) -> None:
        super().__init__(f"Version {version} of subject '{subject}' not found.")


class SchemaNotFound(SchemaRegistryError):
    code = 40403

    def __init__(self, what: object = None) -> None:
        super().__init__("Schema not found." if what is None else f"Schema {what} not found.")


class SubjectSoftDeleted(SchemaRegistryError):
    code = 40404

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently."
        )


class SubjectNotSoftDeleted(SchemaRegistryError):
    code = 40405

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"Subject '{subject}' was not deleted first before being permanently deleted."
        )


class VersionSoftDeleted(SchemaRegistryError):
    code = 40406

    def __init__(self, subject: str, version: int) -> None:
        super().__init__(
            f"Subject '{subject}' version {version} was soft deleted."
            " Set permanent=true to delete permanently."
        )


class VersionNotSoftDeleted(SchemaRegistryError):
    code = 40407

    def __init__(self, subject: str, version: int) -> None:
        super().__init__(
            f"Subject '{subject}' version {version} was not deleted first before being"
            " permanently deleted."
        )


class ConfigNotFound(SchemaRegistryError):
    code = 40408

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"Subject '{subject}' does not have subject-level compatibility configured."
        )


class Incompatible(SchemaRegistryError):
    """The schema breaks the subject's compatibility level; ``reasons`` says where."""

    code = 409

    def __init__(self, level: Compatibility, version: int, reasons: list[str]) -> None:
        super().__init__(
            f"Schema being registered is incompatible with version {version} ({level}):"
            f" {'; '.join(reasons)}."
        )
        self.reasons = reasons


class InvalidSchema(SchemaRegistryError):
    code = 42201

    def __init__(self, why: str) -> None:
        super().__init__(f"Invalid schema: {why}.")


class InvalidVersion(SchemaRegistryError):
    code = 42202

    def __init__(self, version: object) -> None:
        super().__init__(
            f"The specified version {quote_input(version, 40)} is not a valid version id:"
            " an integer from 1, or latest."
        )


class InvalidCompatibility(SchemaRegistryError):
    code = 42203

    def __init__(self, level: object) -> None:
        levels = ", ".join(Compatibility)
        super().__init__(f"Invalid compatibility level {quote_input(level, 40)}: one of {levels}.")


class InvalidSubject(SchemaRegistryError):
    code = 42208

    def __init__(self, subject: object) -> None:
        super().__init__(
            f"Invalid subject {quote_input(subject, 80)}: a subject is STREAM-TYPE, a stream's"
            " name and an event type (letters, digits, _ . and :) joined by -."
        )


# -- subjects ------------------------------------------------------------------------------


def subject_name(stream: str, event_type: str) -> str:
    """The subject of ``event_type`` on ``stream``; :class:`InvalidSubject` when no subject
    names them (an event type with a ``-``, say)."""
    subject = f"{stream}-{event_type}"
    if parse_subject(subject) != (stream, event_type):
        raise InvalidSubject(subject)
    return subject


def parse_subject(subject: object) -> tuple[str, str]:
    """(stream, event type) named by ``subject``; :class:`InvalidSubject` otherwise."""
    if not isinstance(subject, str):
        raise InvalidSubject(subject)
    stream, dash, event_type = subject.rpartition("-")
    if (
        not dash
        or STREAM_NAME_RE.fullmatch(stream) is None
        or SUBJECT_TYPE_RE.fullmatch(event_type) is None
    ):
        raise InvalidSubject(subject)
    return stream, event_type


def parse_level(level: object) -> Compatibility:
    """A compatibility level as given (any case); :class:`InvalidCompatibility` otherwise."""
    if isinstance(level, str) and level.upper() in Compatibility.__members__:
        return Compatibility(level.upper())
    raise InvalidCompatibility(level)


def parse_version(version: object) -> int | None:
    """A version as a path or query gives it: an int from 1, or None for the latest
    (``latest``, or -1 as Confluent also takes it); :class:`InvalidVersion` otherwise."""
    text = str(version)
    if text == "latest" or text == "-1":
        return None
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise InvalidVersion(version)
    return int(text)


# -- schemas -------------------------------------------------------------------------------


class SchemaRow(NamedTuple):
    """One version of a subject, with its schema, as the registry keeps it."""

    subject: str
    version: int
    #: The global id of the schema (one per distinct text of a stream).
    schema_id: int
    #: The canonical text.
    schema: str
    guid: str
    #: Soft-deleted: kept, and shown only when asked for.
    deleted: bool


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """A schema as kept: its canonical text and the document it holds."""

    text: str
    document: Any

    @property
    def fingerprint(self) -> str:
        """What tells two schemas apart (SHA-256 of the canonical text)."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def canonical_text(document: Any, *, normalize: bool = False) -> str:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=normalize)


def parse_schema(
    text: object, schema_type: object = JSON_SCHEMA_TYPE, *, normalize: bool = False
) -> JsonSchema:
    """A schema as registered (its text and type); :class:`InvalidSchema` naming what is
    wrong: not JSON, not a JSON Schema of a known draft, a ``$ref`` outside itself, too large."""
    if schema_type != JSON_SCHEMA_TYPE:
        raise InvalidSchema(
            f"the schema type is {quote_input(schema_type, 20)}; this registry keeps JSON only"
            ' (send "schemaType": "JSON")'
        )
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchema("the schema is a JSON Schema document as a string")
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidSchema(f"the schema exceeds {MAX_SCHEMA_CHARS} characters")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidSchema(f"the schema is not JSON: {exc}") from None
    if not isinstance(document, dict | bool):
        raise InvalidSchema("a JSON Schema is an object or a boolean")
    validator_class = _validator_class(document)
    try:
        validator_class.check_schema(document)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        raise InvalidSchema(f"at #/{where}: {exc.message}") from None
    except RecursionError:
        raise InvalidSchema("the schema nests too deeply") from None
    for path, keyword, value in _references(document, ""):
        if keyword == "$ref" and not value.startswith("#"):
            raise InvalidSchema(f"at #{path}: $ref {quote_input(value, 80)} is outside the schema")
        if keyword != "$ref" and ("/" in value or ":" in value):
            raise InvalidSchema(
                f"at #{path}: {keyword} may not name a place ({quote_input(value, 80)})"
            )
    schema = JsonSchema(canonical_text(document, normalize=normalize), document)
    compile_schema(schema)  # what compiles for the registry compiles at every door
    return schema


#: Keywords whose value is a schema, or an array or map of schemas (every draft).
_ONE_SCHEMA: Final = (
    "additionalItems", "additionalProperties", "contains", "else", "if", "items", "not",
    "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
)  # fmt: skip
_SCHEMA_ARRAYS: Final = ("allOf", "anyOf", "oneOf", "items", "prefixItems")
_SCHEMA_MAPS: Final = (
    "$defs", "definitions", "dependentSchemas", "patternProperties", "properties", "dependencies",
)  # fmt: skip


def subschemas(document: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(JSON pointer, subschema) of each schema directly inside ``document``."""
    if not isinstance(document, dict):
        return
    for keyword in _ONE_SCHEMA:
        value = document.get(keyword)
        if isinstance(value, dict | bool):
            yield f"{path}/{keyword}", value
    for keyword in _SCHEMA_ARRAYS:
        value = document.get(keyword)
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield f"{path}/{keyword}/{index}", item
    for keyword in _SCHEMA_MAPS:
        value = document.get(keyword)
        if isinstance(value, dict):
            for name, item in value.items():
                if isinstance(item, dict | bool):  # dependencies may hold a list of names
                    yield f"{path}/{keyword}/{escape_pointer(name)}", item


def escape_pointer(name: str) -> str:
    """``name`` as one part of a JSON pointer."""
    return name.replace("~", "~0").replace("/", "~1")


def _references(document: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """(path, keyword, value) of each ``$ref``, ``$id``, ``id``, ``$anchor`` and
    ``$dynamicRef`` of the schema and its subschemas."""
    if isinstance(document, dict):
        for keyword in ("$ref", "$id", "id", "$dynamicRef", "$recursiveRef"):
            value = document.get(keyword)
            if isinstance(value, str):
                kind = "$ref" if keyword.endswith(("Ref", "ref")) else keyword
                yield path, kind, value
        for inner_path, inner in subschemas(document, path):
            yield from _references(inner, inner_path)


def _validator_class(document: Any) -> Any:
    default = jsonschema.validators.validator_for({"$schema": DEFAULT_DRAFT})
    return jsonschema.validators.validator_for(document, default=default)


# -- validators ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchemaViolation:
    """Why data is not valid: where (a JSON pointer into the data, ``""`` for the whole)
    and what is wrong there."""

    pointer: str
    reason: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.reason}"


#: The longest reason a refusal of event data quotes (a validator may quote the data).
MAX_REASON_CHARS: Final = 300


class EventDataInvalid(EventRejected):
    """Event data that its type's schema refuses: the sentence names the type, the version,
    the subject and the first failing place in the data (and, in a call of several events,
    which one)."""

    def __init__(
        self,
        event_type: str,
        subject: str,
        version: int,
        violation: SchemaViolation,
        position: tuple[int, int] | None = None,
    ) -> None:
        self.event_type = event_type
        self.subject = subject
        self.version = version
        self.violation = violation
        #: (index, count) of the event among those of one call; None when it came alone.
        self.position = position
        reason = violation.reason
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "…"
        which = (
            f"{event_type} event"
            if position is None
            else f"event {position[0] + 1} of {position[1]} ({event_type})"
        )
        super().__init__(
            f"{which} does not match version {version} of schema {subject}"
            f" at {violation.pointer or '/'}: {reason}"
        )


def check_event(
    compiled: CompiledSchema,
    data: Any,
    event_type: str,
    subject: str,
    version: int,
    position: tuple[int, int] | None = None,
) -> None:
    """:class:`EventDataInvalid` when ``data`` (decoded JSON) does not match ``compiled``,
    version ``version`` of ``subject``."""
    violation = compiled.violation(data)
    if violation is not None:
        raise EventDataInvalid(event_type, subject, version, violation, position)


class CompiledSchema:
    """A schema compiled once: :meth:`violation` checks one event's data."""

    __slots__ = ("violation",)

    def __init__(self, check: Callable[[Any], SchemaViolation | None]) -> None:
        #: ``violation(data)``: None when ``data`` is valid, else the first failing place
        #: (the check itself, not a method around it: it runs for every typed event).
        self.violation = check


def _no_fetching(uri: str) -> Any:
    raise ValueError(f"{uri} is outside the schema")


def compile_schema(schema: JsonSchema) -> CompiledSchema:
    """The validator of ``schema`` (jsonschema-rs, every draft; a schema without ``$schema``
    is draft-07); :class:`InvalidSchema` when it cannot be compiled. ``format`` is asserted
    where known, an unknown one ignored; a ``$ref`` is never fetched (:func:`parse_schema`
    refuses one outside the schema; the retriever is the second lock)."""
    document = schema.document
    if isinstance(document, dict) and "$schema" not in document:
        document = {**document, "$schema": DEFAULT_DRAFT}
    try:
        validator = jsonschema_rs.validator_for(
            document, validate_formats=True, retriever=_no_fetching
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        raise InvalidSchema(str(exc).split("\n", 1)[0].rstrip(".")) from None
    return CompiledSchema(_check(validator))


def _check(validator: jsonschema_rs.Validator) -> Callable[[Any], SchemaViolation | None]:
    is_valid, iter_errors = validator.is_valid, validator.iter_errors

    def check(data: Any) -> SchemaViolation | None:
        try:
            if is_valid(data):
                return None
            error = next(iter(iter_errors(data)))
        except ValueError as exc:  # what JSON cannot hold (decoded JSON never does)
            return SchemaViolation("", str(exc))
        path = "".join(f"/{escape_pointer(str(part))}" for part in error.instance_path)
        return SchemaViolation(path, error.message)

    return check


def top_properties(document: Any) -> list[tuple[str, str, bool]]:
    """(name, type, required) of each property a schema names at its top, for a listing:
    type is the ``type`` keyword as text (``integer``, ``string|null``), ``""`` when none."""
    if not isinstance(document, dict) or not isinstance(document.get("properties"), dict):
        return []
    required = document.get("required")
    needed = set(required) if isinstance(required, list) else set()
    found = []
    for name, schema in document["properties"].items():
        kind = schema.get("type", "") if isinstance(schema, dict) else ""
        text = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind)
        found.append((str(name), text, name in needed))
    return found
