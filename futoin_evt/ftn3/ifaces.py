"""FTN3 iface definitions: loading, resolution (imports, inherit), versions and param checks.

An iface file is ``<name>-<major>.<minor>-iface.json``. Resolving an iface merges the functions
and types of what it ``inherit``s and ``imports``; types compile to JSON Schema (see
:mod:`.schema`) once, at load time, so a call only runs prepared validators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Final

from .errors import (
    INVALID_REQUEST,
    NOT_SUPPORTED_VERSION,
    STANDARD_ERRORS,
    UNKNOWN_INTERFACE,
    FTN3Error,
)
from .messages import DEFAULT_MESSAGE_LIMIT, parse_size
from .schema import TypeCompiler, Validator

ALLOW_ANONYMOUS: Final = "AllowAnonymous"
SECURE_CHANNEL: Final = "SecureChannel"
BIDIRECT_CHANNEL: Final = "BiDirectChannel"

_MISSING: Final = object()


class IfaceSpecError(Exception):
    """An iface definition on disk is broken (our bug, not the peer's)."""


#: Distinct valid string values remembered per param (event types, components repeat).
_VALID_STRINGS_MEMO: Final = 1024


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    validator: Validator | None  # None: any value passes
    default: Any = _MISSING
    #: Strings that passed the validator already; checked again only when the memo is full.
    valid_strings: set[str] = field(default_factory=set, compare=False, repr=False)
    #: For a type that is a string matching a regex and nothing else: the regex, which
    #: checks a string without the validator (values that never repeat, such as keys).
    pattern: re.Pattern[str] | None = None
    #: What a value of the param's type must be, said after "Type mismatch" (see
    #: :class:`IfaceRegistry`'s ``rules``); empty when nothing is said.
    rule: str = ""

    @property
    def optional(self) -> bool:
        return self.default is not _MISSING

    def is_valid(self, value: Any) -> bool:
        if self.validator is None:
            return True
        if type(value) is str:
            if value in self.valid_strings:
                return True
            if self.pattern is not None:
                if self.pattern.search(value) is None:
                    return False
            elif not self.validator.is_valid(value):
                return False
            if len(self.valid_strings) < _VALID_STRINGS_MEMO:
                self.valid_strings.add(value)
            return True
        return bool(self.validator.is_valid(value))


@dataclass(frozen=True, slots=True)
class FuncSpec:
    iface: str
    version: str
    name: str
    params: dict[str, ParamSpec]
    result: Validator | None
    throws: frozenset[str]
    max_request_bytes: int
    max_response_bytes: int

    @property
    def f(self) -> str:
        return f"{self.iface}:{self.version}:{self.name}"

    def check_params(self, given: dict[str, Any]) -> dict[str, Any]:
        """Return the params with defaults filled in; InvalidRequest on any mismatch."""
        for name in given:
            if name not in self.params:
                raise FTN3Error(INVALID_REQUEST, f"Unknown parameter: {self.f}({name})")
        checked: dict[str, Any] = {}
        for name, spec in self.params.items():
            value = given.get(name, _MISSING)
            if value is _MISSING or (value is None and spec.default is None):
                if not spec.optional:
                    raise FTN3Error(INVALID_REQUEST, f"Missing parameter: {self.f}({name})")
                checked[name] = spec.default
                continue
            if not spec.is_valid(value):
                rule = f": {spec.rule}" if spec.rule else ""
                raise FTN3Error(
                    INVALID_REQUEST, f"Type mismatch for parameter: {self.f}({name}){rule}"
                )
            checked[name] = value
        return checked

    def result_problem(self, result: Any) -> str | None:
        """Why ``result`` does not match the declared result, or None when it does."""
        if self.result is None:
            return None
        error = next(iter(self.result.iter_errors(result)), None)
        return None if error is None else f"Result mismatch for {self.f}: {error.message}"

    def may_raise(self, error_name: str) -> bool:
        return error_name in STANDARD_ERRORS or error_name in self.throws


@dataclass(frozen=True, slots=True)
class IfaceSpec:
    name: str
    major: int
    minor: int
    funcs: dict[str, FuncSpec]
    requires: frozenset[str]
    types: dict[str, Any] = field(repr=False)

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}"


def default_iface_dir() -> Traversable:
    """The iface definitions: ``ifaces/`` of the source checkout this code runs from, else the
    package data (an editable install may point at another checkout's)."""
    checkout = Path(__file__).resolve().parents[2] / "ifaces"
    if (checkout / "__init__.py").is_file():
        return checkout
    return resources.files("futoin_evt.ifaces")


class IfaceRegistry:
    """Loads iface definitions and answers which served version handles a request."""

    def __init__(
        self, directory: Traversable | Path | None = None, rules: Mapping[str, str] | None = None
    ) -> None:
        """``rules``: type name -> what a value of it must be, in one sentence, added to the
        InvalidRequest of a param of that type (or of a list of it)."""
        self._dir = directory if directory is not None else default_iface_dir()
        self._rules: Mapping[str, str] = rules or {}
        self._raw: dict[tuple[str, str], dict[str, Any]] = {}
        self._resolved: dict[tuple[str, str], IfaceSpec] = {}
        self._served: dict[str, dict[int, list[IfaceSpec]]] = {}

    def raw(self, name: str, version: str) -> dict[str, Any]:
        key = (name, version)
        if key not in self._raw:
            path = self._dir / f"{name}-{version}-iface.json"
            try:
                spec = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise IfaceSpecError(f"no definition for {name}:{version}") from None
            if spec.get("iface") != name or spec.get("version") != version:
                raise IfaceSpecError(f"{path} does not define {name}:{version}")
            self._raw[key] = spec
        return self._raw[key]

    def load(self, name: str, version: str) -> IfaceSpec:
        """Resolve one iface version with everything it inherits and imports."""
        key = (name, version)
        if key not in self._resolved:
            self._resolved[key] = self._build(name, version)
        return self._resolved[key]

    def serve(self, name: str, versions: Iterable[str]) -> None:
        for version in versions:
            spec = self.load(name, version)
            by_major = self._served.setdefault(name, {}).setdefault(spec.major, [])
            by_major.append(spec)
            by_major.sort(key=lambda s: s.minor)

    def resolve(self, name: str, major: int, minor: int) -> IfaceSpec:
        """The served version for a request: same major, the lowest minor that is >= asked.

        The lowest such minor keeps each version's own limits (poll 1.0 answers within 64 KiB,
        poll 1.1 within 8 MiB).
        """
        majors = self._served.get(name)
        if majors is None:
            raise FTN3Error(UNKNOWN_INTERFACE, f"Unknown interface: {name}")
        candidates = majors.get(major)
        if candidates is None:
            raise FTN3Error(NOT_SUPPORTED_VERSION, f"Different major version: {name}:{major}")
        for spec in candidates:
            if spec.minor >= minor:
                return spec
        raise FTN3Error(NOT_SUPPORTED_VERSION, f"Iface version is too old: {name}:{major}.{minor}")

    # -- building ---------------------------------------------------------------------------

    def _build(self, name: str, version: str) -> IfaceSpec:
        raw = self.raw(name, version)
        types: dict[str, Any] = {}
        raw_funcs: dict[str, tuple[str, str, dict[str, Any]]] = {}
        requires = set(raw.get("requires", []))
        for ref in raw.get("imports", []):
            imported = self._split(ref)
            sub = self.load(*imported)
            types.update(sub.types)
            raw_funcs.update(self._raw_funcs_of(*imported))
        if "inherit" in raw:
            parent = self.load(*self._split(raw["inherit"]))
            types.update(parent.types)
            requires |= parent.requires
            raw_funcs.update(self._raw_funcs_of(*self._split(raw["inherit"])))
        types.update(raw.get("types", {}))
        for func_name, func in raw.get("funcs", {}).items():
            raw_funcs[func_name] = (name, version, func)
        compiler = TypeCompiler(types)
        funcs = {
            func_name: self._build_func(compiler, types, name, version, func_name, func)
            for func_name, (_origin, _ver, func) in raw_funcs.items()
        }
        major, minor = (int(part) for part in version.split("."))
        return IfaceSpec(name, major, minor, funcs, frozenset(requires), types)

    def _raw_funcs_of(self, name: str, version: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """Functions an iface brings along, with the types context they were declared in."""
        raw = self.raw(name, version)
        funcs: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for ref in raw.get("imports", []):
            funcs.update(self._raw_funcs_of(*self._split(ref)))
        if "inherit" in raw:
            funcs.update(self._raw_funcs_of(*self._split(raw["inherit"])))
        for func_name, func in raw.get("funcs", {}).items():
            funcs[func_name] = (name, version, func)
        return funcs

    @staticmethod
    def _split(ref: str) -> tuple[str, str]:
        name, _, version = ref.partition(":")
        if not version:
            raise IfaceSpecError(f"iface reference without version: {ref}")
        return name, version

    def _rule(self, types: dict[str, Any], ref: Any) -> str:
        """The rule said for a type: its own, or that of the type it names or lists."""
        seen: set[str] = set()
        while isinstance(ref, str) and ref not in seen:
            rule = self._rules.get(ref)
            if rule is not None:
                return rule
            seen.add(ref)
            tdef = types.get(ref)
            ref = tdef.get("elemtype", tdef.get("type")) if isinstance(tdef, dict) else tdef
        return ""

    def _build_func(
        self,
        compiler: TypeCompiler,
        types: dict[str, Any],
        iface: str,
        version: str,
        name: str,
        func: dict[str, Any],
    ) -> FuncSpec:
        params: dict[str, ParamSpec] = {}
        for param_name, pdef in func.get("params", {}).items():
            if isinstance(pdef, (str, list)):
                pdef = {"type": pdef}
            validator = compiler.validator(pdef["type"])
            default = pdef.get("default", _MISSING)
            pattern = compiler.string_pattern(pdef["type"])
            rule = self._rule(types, pdef["type"])
            params[param_name] = ParamSpec(
                param_name, validator, default, pattern=pattern, rule=rule
            )
        result = func.get("result")
        result_validator: Validator | None = None
        if isinstance(result, dict):
            result_validator = compiler.map_validator(result)
        elif result is not None:
            result_validator = compiler.validator(result)
        return FuncSpec(
            iface=iface,
            version=version,
            name=name,
            params=params,
            result=result_validator,
            throws=frozenset(func.get("throws", [])),
            max_request_bytes=parse_size(func.get("maxreqsize", DEFAULT_MESSAGE_LIMIT)),
            max_response_bytes=parse_size(func.get("maxrspsize", DEFAULT_MESSAGE_LIMIT)),
        )
