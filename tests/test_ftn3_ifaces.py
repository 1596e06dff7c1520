"""Iface loading and resolution, version matching, param and result checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.domain.stream import COMPONENT_RULE, EVENT_TYPE_RULE
from futoin_evt.ftn3.errors import FTN3Error
from futoin_evt.ftn3.ifaces import IfaceRegistry, IfaceSpecError
from futoin_evt.server.app import build_registry

EVENT = {"id": "1", "type": "A", "data": None, "ts": "2024-01-02T03:04:05Z"}


@pytest.fixture(scope="module")
def registry() -> IfaceRegistry:
    return build_registry()


def test_imports_bring_functions_and_inherit_brings_parent(registry: IfaceRegistry) -> None:
    gen = registry.load("futoin.evt.gen", "1.1")
    assert set(gen.funcs) == {"addEvent", "ping"}
    assert gen.requires == {"SecureChannel"}
    push = registry.load("futoin.evt.push", "1.1")
    assert set(push.funcs) == {"ping", "registerConsumer", "pollEvents", "readyToReceive"}
    assert push.requires == {"BiDirectChannel"}


def test_limits_per_version(registry: IfaceRegistry) -> None:
    def poll_limit(iface: str, minor: int) -> int:
        return registry.resolve(iface, 1, minor).funcs["pollEvents"].max_response_bytes

    assert poll_limit("futoin.evt.poll", 0) == 64 * 1024
    assert poll_limit("futoin.evt.poll", 1) == 8 * 1024 * 1024
    # push 1.1 inherits poll 1.0, so pollEvents through it keeps 64 KiB
    assert poll_limit("futoin.evt.push", 1) == 64 * 1024
    receiver = registry.load("futoin.evt.receiver", "1.1")
    assert receiver.funcs["onEvents"].max_request_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("name", "major", "minor", "error", "desc"),
    [
        (
            "futoin.evt.gen",
            1,
            9,
            "NotSupportedVersion",
            "Iface version is too old: futoin.evt.gen:1.9",
        ),
        (
            "futoin.evt.gen",
            2,
            0,
            "NotSupportedVersion",
            "Different major version: futoin.evt.gen:2",
        ),
        ("futoin.evt.nope", 1, 0, "UnknownInterface", "Unknown interface: futoin.evt.nope"),
        ("futoin.evt.receiver", 1, 0, "UnknownInterface", "Unknown interface: futoin.evt.receiver"),
    ],
)
def test_version_errors(
    registry: IfaceRegistry, name: str, major: int, minor: int, error: str, desc: str
) -> None:
    with pytest.raises(FTN3Error) as info:
        registry.resolve(name, major, minor)
    assert (info.value.name, info.value.desc) == (error, desc)


def test_older_minor_is_served(registry: IfaceRegistry) -> None:
    assert registry.resolve("futoin.evt.gen", 1, 0).version == "1.0"
    assert registry.resolve("futoin.evt.gen", 1, 1).version == "1.1"


def _check(registry: IfaceRegistry, func: str, params: dict[str, Any]) -> dict[str, Any]:
    iface, _, name = func.rpartition(":")
    iface_name, _, version = iface.partition(":")
    return registry.load(iface_name, version).funcs[name].check_params(params)


@pytest.mark.parametrize(
    ("func", "params", "desc"),
    [
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "lower", "data": 1},
            "Type mismatch for parameter: futoin.evt.gen:1.1:addEvent(type): " + EVENT_TYPE_RULE,
        ),
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "A"},
            "Missing parameter: futoin.evt.gen:1.1:addEvent(data)",
        ),
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "A", "data": 1, "x": 1},
            "Unknown parameter: futoin.evt.gen:1.1:addEvent(x)",
        ),
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "A" * 17, "data": 1},
            "Type mismatch for parameter: futoin.evt.gen:1.1:addEvent(type): " + EVENT_TYPE_RULE,
        ),
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "A\n", "data": 1},
            "Type mismatch for parameter: futoin.evt.gen:1.1:addEvent(type): " + EVENT_TYPE_RULE,
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "C", "last_id": "0"},
            "Type mismatch for parameter: futoin.evt.poll:1.1:pollEvents(last_id)",
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "C", "last_id": 5},
            "Type mismatch for parameter: futoin.evt.poll:1.1:pollEvents(last_id)",
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "C", "want": ["A", "b"]},
            "Type mismatch for parameter: futoin.evt.poll:1.1:pollEvents(want): " + EVENT_TYPE_RULE,
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "C", "want": "A"},
            "Type mismatch for parameter: futoin.evt.poll:1.1:pollEvents(want): " + EVENT_TYPE_RULE,
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "bad-name"},
            "Type mismatch for parameter: futoin.evt.poll:1.1:pollEvents(component): "
            + COMPONENT_RULE,
        ),
        (
            "futoin.evt.gen:1.1:ping",
            {"echo": 1.5},
            "Type mismatch for parameter: futoin.evt.gen:1.1:ping(echo)",
        ),
        (
            "futoin.evt.gen:1.1:ping",
            {"echo": True},
            "Type mismatch for parameter: futoin.evt.gen:1.1:ping(echo)",
        ),
    ],
)
def test_param_errors(
    registry: IfaceRegistry, func: str, params: dict[str, Any], desc: str
) -> None:
    with pytest.raises(FTN3Error) as info:
        _check(registry, func, params)
    assert (info.value.name, info.value.desc) == ("InvalidRequest", desc)


def test_defaults_fill_in_whether_omitted_or_null(registry: IfaceRegistry) -> None:
    expected = {"component": "C", "last_id": None, "want": None}
    assert _check(registry, "futoin.evt.poll:1.1:pollEvents", {"component": "C"}) == expected
    explicit = {"component": "C", "last_id": None, "want": None}
    assert _check(registry, "futoin.evt.poll:1.1:pollEvents", explicit) == expected


@pytest.mark.parametrize(
    "data", [None, False, 0, -1.5, "", "text", [], [1, [2]], {"a": {"b": None}}]
)
def test_event_data_is_any_json(registry: IfaceRegistry, data: Any) -> None:
    params = _check(registry, "futoin.evt.gen:1.1:addEvent", {"type": "A_B", "data": data})
    assert params["data"] == data


def test_result_checks(registry: IfaceRegistry) -> None:
    poll = registry.load("futoin.evt.poll", "1.1").funcs["pollEvents"]
    assert poll.result_problem([EVENT]) is None
    assert poll.result_problem([{**EVENT, "id": "0"}]) is not None
    assert poll.result_problem([{**EVENT, "ts": "2024-01-02 03:04:05"}]) is not None
    assert poll.result_problem([EVENT] * 1001) is not None
    ping = registry.load("futoin.evt.gen", "1.1").funcs["ping"]
    assert ping.result_problem({"echo": 1}) is None
    assert ping.result_problem({"echo": 1, "more": 2}) is not None
    assert ping.result_problem({}) is not None


def test_declared_errors(registry: IfaceRegistry) -> None:
    poll = registry.load("futoin.evt.poll", "1.1").funcs["pollEvents"]
    assert poll.may_raise("NotRegistered")
    assert poll.may_raise("SecurityError")
    assert not poll.may_raise("LiveNotAllowed")


def test_broken_definitions_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.b-1.0-iface.json").write_text(json.dumps({"iface": "a.b", "version": "2.0"}))
    registry = IfaceRegistry(tmp_path)
    with pytest.raises(IfaceSpecError, match="does not define"):
        registry.load("a.b", "1.0")
    with pytest.raises(IfaceSpecError, match="no definition"):
        registry.load("a.c", "1.0")
