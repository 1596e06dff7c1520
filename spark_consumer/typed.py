"""Typed ``data``: an event type's JSON Schema from the registry as a Spark type.

:func:`spark_type` maps a JSON Schema: ``object`` with ``properties`` to a ``StructType``
(a property is nullable unless ``required``), ``array`` to an ``ArrayType`` of its
``items``, ``integer`` to ``LongType``, ``number`` to ``DoubleType``, ``string`` to
``StringType``, ``boolean`` to ``BooleanType``. ``"type": [T, "null"]`` is ``T``, nullable.
Local ``$ref`` (``#/...``) are followed. What it cannot map (``oneOf``, ``anyOf``, ``allOf``,
``not``, ``if``; no ``type``; several types; an object without ``properties``; a ``$ref``
that loops) is a ``StringType`` column: a string as it is, any other value as its JSON text.

:func:`typed_value` fits one event's data to that type, as Spark's ``from_json`` does in its
permissive mode: a property the schema does not name is left out, and a value that does not
fit its column (data stored before the schema was registered) is null; where the column may
not be null (a required property), the enclosing object is null instead, up to ``data``.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

_SCALARS: Final[dict[str, DataType]] = {
    "integer": LongType(),
    "number": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
}
#: Keywords whose data may take more than one shape: their value is kept as JSON text.
_COMBINATORS: Final = ("oneOf", "anyOf", "allOf", "not", "if")
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class SchemaFetchError(Exception):
    """The registry has no schema to read for the event type, or refused to tell."""


def spark_type(schema: Any) -> DataType:
    """The Spark type of data valid against the JSON Schema ``schema`` (see the module)."""
    return _mapped(schema, schema, frozenset())[0]


def _mapped(schema: Any, root: Any, refs: frozenset[str]) -> tuple[DataType, bool]:
    """(type, whether the schema itself allows null)."""
    if not isinstance(schema, dict):
        return StringType(), True
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _local(root, ref)
        if target is None or ref in refs:
            return StringType(), True
        return _mapped(target, root, refs | {ref})
    if any(key in schema for key in _COMBINATORS):
        return StringType(), True
    types = schema.get("type")
    names = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    null = "null" in names
    names = [name for name in names if name != "null"]
    if len(names) != 1:
        return StringType(), True
    name = names[0]
    if name in _SCALARS:
        return _SCALARS[name], null
    if name == "array":
        items = schema.get("items")
        return ArrayType(
            _mapped(items, root, refs)[0] if isinstance(items, dict) else StringType()
        ), null
    properties = schema.get("properties")
    if name != "object" or not isinstance(properties, dict) or not properties:
        return StringType(), True
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    fields = []
    for key, sub in properties.items():
        data_type, may_be_null = _mapped(sub, root, refs)
        fields.append(StructField(key, data_type, nullable=may_be_null or key not in needed))
    return StructType(fields), null


def _local(root: Any, ref: str) -> Any:
    """What the local reference ``#/a/b`` points at in ``root``; None if it points nowhere."""
    if not ref.startswith("#"):
        return None
    node = root
    for raw in ref[1:].split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


class _Misfit(Exception):
    pass


def typed_value(value: Any, data_type: DataType) -> Any:
    """``value`` (parsed JSON) as a value of ``data_type``; None where it does not fit."""
    try:
        return _fit(value, data_type)
    except _Misfit:
        return None


def _fit(value: Any, data_type: DataType) -> Any:
    if value is None:
        return None
    if isinstance(data_type, StructType):
        if not isinstance(value, dict):
            raise _Misfit
        row = {}
        for fld in data_type.fields:
            try:
                row[fld.name] = _fit(value.get(fld.name), fld.dataType)
            except _Misfit:
                row[fld.name] = None
            if row[fld.name] is None and not fld.nullable:
                raise _Misfit
        return row
    if isinstance(data_type, ArrayType):
        if not isinstance(value, list):
            raise _Misfit
        return [typed_value(item, data_type.elementType) for item in value]
    if isinstance(data_type, LongType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Misfit
        if isinstance(value, float) and not value.is_integer():
            raise _Misfit
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Misfit
        return int(value)
    if isinstance(data_type, DoubleType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Misfit
        return float(value)
    if isinstance(data_type, BooleanType):
        if not isinstance(value, bool):
            raise _Misfit
        return value
    if isinstance(data_type, StringType):
        # a string where the schema says string; anything else kept as its JSON text
        return value if isinstance(value, str) else _json_text(value)
    raise _Misfit


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def subject(stream: str, event_type: str) -> str:
    """The registry's subject of an event type of a stream."""
    return f"{stream}-{event_type}"


def latest_schema(registry: str, name: str, credentials: tuple[str, str]) -> Mapping[str, Any]:
    """The newest schema of the subject ``name`` from the registry at ``registry`` (its
    ``/schemas`` URL), read with the user's credentials."""
    url = f"{registry}/subjects/{quote(name, safe='')}/versions/latest"
    token = base64.b64encode(":".join(credentials).encode()).decode("ascii")
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = json.load(reply)
    except urllib.error.HTTPError as exc:
        message = _registry_message(exc)
        if exc.code == 404:
            raise SchemaFetchError(
                f"the schema registry has no subject {name}: register a schema for it"
                f" first ({message})"
            ) from None
        raise SchemaFetchError(f"cannot read the schema of {name}: {message}") from None
    except (OSError, ValueError) as exc:
        raise SchemaFetchError(f"cannot read the schema of {name} from {registry}: {exc}") from None
    try:
        schema: Any = json.loads(body["schema"])
    except (KeyError, TypeError, ValueError):
        raise SchemaFetchError(f"the registry's answer for {name} holds no JSON schema") from None
    if not isinstance(schema, dict):
        raise SchemaFetchError(f"the schema of {name} is not a JSON object")
    return schema


def _registry_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(exc)["message"])
    except (KeyError, TypeError, ValueError, OSError):
        return f"HTTP {exc.code}"
