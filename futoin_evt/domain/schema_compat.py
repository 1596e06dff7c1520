"""Compatibility of two JSON Schemas: does one accept every document the other accepts? No I/O.

``uncovered(wider, narrower)`` lists the reasons some document valid under ``narrower`` may
be invalid under ``wider`` (empty: every one is valid there too, as far as it judges).
BACKWARD asks it of (new, old): the new version reads what the old one wrote; FORWARD of
(old, new); FULL both. It is Confluent's rule for JSON Schema, and as strict: in an open
content model (``additionalProperties`` absent or true) an old document may hold any
property, so a property the new version adds, even optional, narrows what it accepts.

Judged, keyword by keyword, into nested objects and arrays: ``type`` (``integer`` is a
``number``), ``enum`` and ``const``, ``required``, ``properties`` and
``additionalProperties`` (closed, opened, or a schema), ``items`` (one schema or a tuple),
the bounds (``minimum``, ``maximum``, their exclusive forms, ``minLength``, ``maxLength``,
``minItems``, ``maxItems``, ``minProperties``, ``maxProperties``), ``multipleOf``,
``uniqueItems``, ``pattern`` and ``format`` (equal or absent), ``anyOf`` (each branch of the
narrower covered by a branch of the wider), ``$ref`` inside the document. Not judged, so a
change to them is refused rather than passed: ``allOf``, ``oneOf``, ``not``,
``if``/``then``/``else``, ``patternProperties``, ``dependencies`` and their 2019 forms,
``propertyNames``, ``contains``, ``unevaluated*``, ``prefixItems``; equal on both sides
they are fine. Annotations (``title``, ``description``, ``default``, ``examples``...) are
never judged.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypeGuard

from .schemas import Compatibility, escape_pointer

_TYPES: Final = ("array", "boolean", "integer", "null", "number", "object", "string")
#: Keywords compared as a whole: equal, or the change is refused.
_UNJUDGED: Final = (
    "allOf", "oneOf", "not", "if", "then", "else", "patternProperties", "dependencies",
    "dependentRequired", "dependentSchemas", "propertyNames", "contains", "minContains",
    "maxContains", "unevaluatedItems", "unevaluatedProperties", "prefixItems",
    "additionalItems",
)  # fmt: skip
#: (keyword, the type it constrains, True for a lower bound).
_BOUNDS: Final = (
    ("minimum", "number", True), ("maximum", "number", False),
    ("minLength", "string", True), ("maxLength", "string", False),
    ("minItems", "array", True), ("maxItems", "array", False),
    ("minProperties", "object", True), ("maxProperties", "object", False),
)  # fmt: skip
#: How deep ``$ref`` chains are followed before the check gives up (refusing).
MAX_DEPTH: Final = 64


def incompatibilities(
    level: Compatibility, candidate: Any, earlier: list[tuple[int, Any]]
) -> tuple[int, list[str]] | None:
    """The first of ``earlier`` (version, document), newest first, that ``candidate`` breaks
    ``level`` with, and the reasons; None when it keeps the level with all it is checked
    against (the newest only unless the level is transitive)."""
    if level is Compatibility.NONE:
        return None
    for version, document in earlier if level.transitive else earlier[:1]:
        reasons: list[str] = []
        if level.backward:
            reasons += [f"new {r}" for r in uncovered(candidate, document)]
        if level.forward:
            reasons += [f"old {r}" for r in uncovered(document, candidate)]
        if reasons:
            return version, reasons
    return None


def uncovered(wider: Any, narrower: Any) -> list[str]:
    """Why some document valid under ``narrower`` may be refused by ``wider`` (each reason
    names the place, as a JSON pointer into the schema, and what narrows there)."""
    return _Check(wider, narrower).compare(wider, narrower, "#", 0)


class _Check:
    def __init__(self, wider_root: Any, narrower_root: Any) -> None:
        self._roots = (wider_root, narrower_root)
        #: Pairs being compared: met again through a ``$ref``, they hold (the recursion
        #: proves nothing new).
        self._active: set[tuple[int, int]] = set()

    def compare(self, wider: Any, narrower: Any, at: str, depth: int) -> list[str]:
        if depth > MAX_DEPTH:
            return [f"{at}: refers too deeply to be judged"]
        wider = self._resolve(wider, 0, depth)
        narrower = self._resolve(narrower, 1, depth)
        if isinstance(wider, str) or isinstance(narrower, str):
            return [f"{at}: {wider if isinstance(wider, str) else narrower}"]
        if not _constraining(wider) or narrower is False:
            return []
        if wider is False:
            return [f"{at}: accepts nothing where it accepted something"]
        if narrower is True:
            narrower = {}
        pair = (id(wider), id(narrower))
        if pair in self._active:
            return []
        self._active.add(pair)
        try:
            return self._compare(wider, narrower, at, depth)
        finally:
            self._active.discard(pair)

    def _compare(
        self, wider: dict[str, Any], narrower: dict[str, Any], at: str, depth: int
    ) -> list[str]:
        reasons: list[str] = []
        types = _types(narrower)
        wider_types = _types(wider)
        lost = sorted(t for t in types if not _covered(t, wider_types))
        if lost:
            reasons.append(f"{at}: type {'|'.join(lost)} is no longer accepted")
        reasons += self._values(wider, narrower, at)
        shared = {t for t in types if _covered(t, wider_types)}
        reasons += _bounds(wider, narrower, at, shared)
        if "object" in shared:
            reasons += self._object(wider, narrower, at, depth)
        if "array" in shared:
            reasons += self._array(wider, narrower, at, depth)
        reasons += self._any_of(wider, narrower, at, depth)
        for keyword in _UNJUDGED:
            if wider.get(keyword) != narrower.get(keyword) and keyword in wider:
                reasons.append(f"{at}/{keyword}: changed, which the check does not judge")
        return reasons

    def _resolve(self, schema: Any, side: int, depth: int) -> Any:
        """Follow a ``$ref`` inside the document; a reason (a string) when it cannot."""
        seen = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            seen += 1
            if seen + depth > MAX_DEPTH:
                return "refers too deeply to be judged"
            target = _pointer(self._roots[side], schema["$ref"])
            if target is None:
                return f"$ref {schema['$ref']} cannot be judged"
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if _constraining(rest):  # a $ref beside other keywords (2019 and later)
                return f"$ref {schema['$ref']} beside other keywords cannot be judged"
            schema = target
        return schema

    def _values(self, wider: dict[str, Any], narrower: dict[str, Any], at: str) -> list[str]:
        allowed = _enum(wider)
        if allowed is None:
            return []
        given = _enum(narrower)
        if given is None:
            return [f"{at}: enum added (only {_list(allowed)} accepted)"]
        removed = [v for v in given if v not in allowed]
        return [f"{at}: enum no longer accepts {_list(removed)}"] if removed else []

    def _object(
        self, wider: dict[str, Any], narrower: dict[str, Any], at: str, depth: int
    ) -> list[str]:
        reasons: list[str] = []
        required = set(_names(narrower.get("required")))
        added = [n for n in _names(wider.get("required")) if n not in required]
        if added:
            reasons.append(f"{at}: required property {_list(added)} added")
        props = _props(wider)
        narrower_props = _props(narrower)
        open_wider = _schema(wider.get("additionalProperties", True))
        open_narrower = _schema(narrower.get("additionalProperties", True))
        for name, schema in narrower_props.items():
            where = f"{at}/properties/{escape_pointer(name)}"
            if name in props:
                reasons += self.compare(props[name], schema, where, depth + 1)
            elif open_wider is False and schema is not False:
                reasons.append(f"{where}: property no longer allowed")
            elif open_wider is not False:
                reasons += self.compare(open_wider, schema, where, depth + 1)
        if open_narrower is False:
            return reasons
        # the narrower's other properties: any name, valid under its additionalProperties
        for name, schema in props.items():
            if name not in narrower_props and self.compare(schema, open_narrower, at, depth + 1):
                reasons.append(
                    f"{at}/properties/{escape_pointer(name)}: property added to an open content"
                    " model (close the model with additionalProperties: false to add one)"
                )
        if open_wider is False:
            reasons.append(f"{at}/additionalProperties: closed where it was open")
        else:
            reasons += self.compare(
                open_wider, open_narrower, f"{at}/additionalProperties", depth + 1
            )
        return reasons

    def _array(
        self, wider: dict[str, Any], narrower: dict[str, Any], at: str, depth: int
    ) -> list[str]:
        items, narrower_items = wider.get("items", True), narrower.get("items", True)
        if isinstance(items, list) or isinstance(narrower_items, list):
            if items != narrower_items:
                return [f"{at}/items: tuple items changed, which the check does not judge"]
            return []
        reasons = self.compare(items, narrower_items, f"{at}/items", depth + 1)
        if wider.get("uniqueItems") is True and narrower.get("uniqueItems") is not True:
            reasons.append(f"{at}: uniqueItems added")
        return reasons

    def _any_of(
        self, wider: dict[str, Any], narrower: dict[str, Any], at: str, depth: int
    ) -> list[str]:
        branches = wider.get("anyOf")
        if not isinstance(branches, list):
            return []
        given = narrower.get("anyOf")
        for index, branch in enumerate(given if isinstance(given, list) else [narrower]):
            if not any(not self.compare(b, branch, at, depth + 1) for b in branches):
                where = f"{at}/anyOf/{index}" if isinstance(given, list) else at
                return [f"{where}: not covered by any branch of anyOf"]
        return []


def _types(schema: dict[str, Any]) -> set[str]:
    given = schema.get("type")
    if isinstance(given, str):
        found = {given}
    elif isinstance(given, list):
        found = {t for t in given if isinstance(t, str)}
    else:
        branches = schema.get("anyOf")
        found = set(_TYPES)
        if isinstance(branches, list) and all(isinstance(b, dict) for b in branches):
            found = set().union(*(_types(b) for b in branches))
    values = _enum(schema)
    if values is not None:  # an enum narrows the types to those of its values
        found = {_type_of(v) for v in values if _covered(_type_of(v), found)}
    return found


def _covered(kind: str, types: set[str]) -> bool:
    """Whether values of type ``kind`` are of one of ``types`` (an integer is a number)."""
    return kind in types or (kind == "integer" and "number" in types)


def _schema(value: Any) -> Any:
    """``additionalProperties`` as a schema: absent or an empty object is True."""
    return True if value == {} else value


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _enum(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return list(values) if isinstance(values, list) else None


def _bounds(wider: dict[str, Any], narrower: dict[str, Any], at: str, types: set[str]) -> list[str]:
    reasons = []
    for keyword, kind, lower in _BOUNDS:
        if kind not in types and not (kind == "number" and "integer" in types):
            continue
        bound, given = wider.get(keyword), narrower.get(keyword)
        if not _number(bound):
            continue
        if not _number(given) or (given < bound if lower else given > bound):
            reasons.append(f"{at}: {keyword} {bound} narrows it")
    if "number" in types or "integer" in types:
        for keyword in ("exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            bound, given = wider.get(keyword), narrower.get(keyword)
            if bound is None or bound is False or bound == given or _within(keyword, bound, given):
                continue
            reasons.append(f"{at}: {keyword} {bound} narrows it")
    if "string" in types:
        for keyword in ("pattern", "format"):
            if keyword in wider and wider[keyword] != narrower.get(keyword):
                reasons.append(f"{at}: {keyword} {wider[keyword]!r} narrows it")
    return reasons


def _within(keyword: str, bound: Any, given: Any) -> bool:
    """Whether the narrower's numeric ``given`` is at least as strict as ``bound``."""
    if not (_number(bound) and _number(given)):
        return False
    if keyword == "multipleOf":
        return bool((given / bound).is_integer())
    return bool(given >= bound if keyword == "exclusiveMinimum" else given <= bound)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _names(value: Any) -> list[str]:
    return [n for n in value if isinstance(n, str)] if isinstance(value, list) else []


def _props(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


#: Keywords that only annotate: a schema holding nothing else accepts everything.
_ANNOTATIONS: Final = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
     "writeOnly", "$schema", "$id", "id", "$anchor", "$defs", "definitions"}
)  # fmt: skip


def _constraining(schema: Any) -> bool:
    if isinstance(schema, bool):
        return not schema
    return isinstance(schema, dict) and bool(schema.keys() - _ANNOTATIONS)


def _pointer(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _list(values: list[Any]) -> str:
    return ", ".join(json.dumps(v, ensure_ascii=False) for v in values[:5]) + (
        ", ..." if len(values) > 5 else ""
    )
