"""Compile FTN3 types to JSON Schema and check values with jsonschema-rs.

The checks run on every call of every door that speaks FTN3, so they are compiled code
(jsonschema-rs, in Rust: a DCB append's list of events is checked in 0.6 µs, against 52 µs with
the pure-Python jsonschema). FTN3 regexes are JavaScript regexes, which jsonschema-rs implements
(ECMA-262: ``$`` matches only at the very end, ``\\d`` only ASCII digits, and a pattern runs in
time linear in the text where it has no look-around or back-reference). :func:`js_regex` gives
the same meaning in Python, for the strings checked without a validator.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any, Final, Protocol

from jsonschema_rs import Draft202012Validator

STANDARD_TYPES: Final = frozenset(
    {"any", "boolean", "integer", "number", "string", "map", "array", "enum", "set", "data"}
)

_BASE_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "any": {},
    "boolean": {"type": "boolean"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "string": {"type": "string"},
    "data": {"type": "string"},
    "map": {"type": "object"},
    "array": {"type": "array"},
    "enum": {},
    "set": {"type": "array", "uniqueItems": True},
}

__all__ = ["STANDARD_TYPES", "TypeCompiler", "Validator", "js_regex"]


@functools.lru_cache(maxsize=1024)
def js_regex(pattern: str) -> re.Pattern[str]:
    """Compile a JavaScript regex (no flags) with the same meaning in Python."""
    out: list[str] = []
    in_class = False
    escaped = False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char == "$" and not in_class:
            out.append(r"\Z")
        else:
            out.append(char)
    return re.compile("".join(out), re.ASCII)


class Problem(Protocol):
    """One way a value fails its type."""

    @property
    def message(self) -> str: ...


class Validator(Protocol):
    """A compiled check of one FTN3 type."""

    def is_valid(self, instance: Any) -> bool: ...

    def iter_errors(self, instance: Any) -> Iterator[Problem]: ...


class TypeCompiler:
    """Turns type references of one iface (with its imported types) into validators."""

    def __init__(self, types: dict[str, Any]) -> None:
        self._types = types

    def validator(self, ref: Any) -> Validator | None:
        """A validator for a type reference, or None when every value passes (``any``)."""
        schema = self.schema(ref)
        if not schema:
            return None
        return Draft202012Validator(schema)

    def string_pattern(self, ref: Any) -> re.Pattern[str] | None:
        """The regex of a type that is a string matching it and nothing else; else None."""
        schema = self.schema(ref)
        if schema.keys() == {"type", "pattern"} and schema["type"] == "string":
            return js_regex(schema["pattern"])
        return None

    def map_validator(self, fields: dict[str, Any]) -> Validator:
        """A result given as a map of fields: all present, nothing else."""
        schema = self._fields_schema(fields)
        schema["type"] = "object"
        schema["additionalProperties"] = False
        return Draft202012Validator(schema)

    def schema(self, ref: Any, _seen: frozenset[str] = frozenset()) -> dict[str, Any]:
        if isinstance(ref, list):
            return {"anyOf": [self.schema(item, _seen) for item in ref]}
        if not isinstance(ref, str):
            raise ValueError(f"invalid type reference: {ref!r}")
        if ref in STANDARD_TYPES:
            return dict(_BASE_SCHEMAS[ref])
        if ref in _seen:
            raise ValueError(f"recursive type: {ref}")
        try:
            tdef = self._types[ref]
        except KeyError:
            raise ValueError(f"unknown type: {ref}") from None
        seen = _seen | {ref}
        if isinstance(tdef, (str, list)):
            return self.schema(tdef, seen)
        base = tdef["type"]
        constraints = self._constraints(self._kind(base, seen), tdef, seen)
        base_schema = self.schema(base, seen)
        if not constraints:
            return base_schema
        if isinstance(base, str) and base in STANDARD_TYPES:
            return {**base_schema, **constraints}
        return {"allOf": [base_schema, constraints]}

    def _kind(self, ref: Any, seen: frozenset[str]) -> str | None:
        """The standard type a reference ends in (None for a variant)."""
        while isinstance(ref, str) and ref not in STANDARD_TYPES:
            if ref in seen and ref not in self._types:
                return None
            tdef = self._types.get(ref)
            if tdef is None:
                raise ValueError(f"unknown type: {ref}")
            ref = tdef if isinstance(tdef, (str, list)) else tdef["type"]
        return ref if isinstance(ref, str) else None

    def _constraints(
        self, kind: str | None, tdef: dict[str, Any], seen: frozenset[str]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "regex" in tdef:
            out["pattern"] = tdef["regex"]
        if "min" in tdef:
            out["minimum"] = tdef["min"]
        if "max" in tdef:
            out["maximum"] = tdef["max"]
        if kind in ("array", "set"):
            if "minlen" in tdef:
                out["minItems"] = tdef["minlen"]
            if "maxlen" in tdef:
                out["maxItems"] = tdef["maxlen"]
            if "elemtype" in tdef:
                out["items"] = self.schema(tdef["elemtype"], seen)
        else:
            if "minlen" in tdef:
                out["minLength"] = tdef["minlen"]
            if "maxlen" in tdef:
                out["maxLength"] = tdef["maxlen"]
        if kind == "map":
            if "fields" in tdef:
                out.update(self._fields_schema(tdef["fields"], seen))
            if "elemtype" in tdef:
                out["patternProperties"] = {"": self.schema(tdef["elemtype"], seen)}
        if "items" in tdef:
            allowed = {"enum": list(tdef["items"])}
            if kind == "set":
                out["items"] = allowed
            else:
                out.update(allowed)
        return out

    def _fields_schema(
        self, fields: dict[str, Any], seen: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        for name, fdef in fields.items():
            if isinstance(fdef, (str, list)):
                fdef = {"type": fdef}
            schema = self.schema(fdef["type"], seen)
            if fdef.get("optional"):
                schema = {"anyOf": [{"type": "null"}, schema]}
            else:
                required.append(name)
            properties[name] = schema
        return {"properties": properties, "required": required}
