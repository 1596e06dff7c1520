"""The official FutoIn JavaScript client (futoin-invoker, futoin-eventstream) against our server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.server.app import EventServer

from .support.js import run_js
from .support.servers import ROOT

pytestmark = [pytest.mark.functional, pytest.mark.interop]

DATA_KINDS: list[Any] = [
    None,
    True,
    False,
    0,
    12.5,
    "",
    "ünïcode ✓",
    [],
    [1, [2, None]],
    {},
    {"a": {"b": "c"}},
]


def endpoint(server: EventServer) -> str:
    # secure+ tells the official client that plain ws here is a secure channel (loopback)
    return "secure+" + server.url


async def calls(
    js_peer: Path, server: EventServer, credentials: str | None, *items: dict[str, Any]
) -> list[Any]:
    scenario = {"endpoint": endpoint(server), "credentials": credentials, "calls": list(items)}
    return await run_js(js_peer, "calls.js", scenario)


def call(face: str, version: str, method: str, *args: Any) -> dict[str, Any]:
    return {"face": face, "version": version, "method": method, "args": list(args)}


def raw(f: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"raw": f, "method": method, "params": params}


async def test_ping_add_every_data_kind_and_poll_back(js_peer: Path, server: EventServer) -> None:
    out = await calls(
        js_peer,
        server,
        "alice:alice-pw",
        call("gen", "1.1", "ping", 123),
        *(call("gen", "1.1", "addEvent", "KIND", data) for data in DATA_KINDS),
        call("poll", "1.1", "registerConsumer", "JS"),
        call("poll", "1.1", "pollEvents", "JS", None, None),
    )
    assert out[0] == {"ok": 123}
    ids = [r["ok"] for r in out[1 : 1 + len(DATA_KINDS)]]
    assert ids == [str(i) for i in range(1, len(DATA_KINDS) + 1)]
    assert out[-2] == {"ok": True}
    events = out[-1]["ok"]
    assert [e["id"] for e in events] == ids
    assert [e["data"] for e in events] == DATA_KINDS


async def test_polling_through_each_version(js_peer: Path, server: EventServer) -> None:
    out = await calls(
        js_peer,
        server,
        "alice:alice-pw",
        call("gen", "1.0", "addEvent", "A", 1),
        call("gen", "1.1", "addEvent", "B", 2),
        call("gen", "1.1", "addEvent", "A", 3),
        call("poll", "1.0", "registerConsumer", "V"),
        call("poll", "1.0", "pollEvents", "V", None, None),
        call("push", "1.1", "pollEvents", "V", "1", None),
        call("poll", "1.1", "pollEvents", "V", "2", ["A"]),
        call("poll", "1.1", "pollEvents", "V", "3", ["A"]),
        call("push", "1.1", "pollEvents", "LIVE", "1", ["B"]),
    )
    assert [r["ok"] for r in out[:3]] == ["1", "2", "3"]
    assert [e["id"] for e in out[4]["ok"]] == ["1", "2", "3"]
    assert [e["id"] for e in out[5]["ok"]] == ["2", "3"]
    assert [e["id"] for e in out[6]["ok"]] == ["3"]
    assert out[7] == {"ok": []}
    assert [e["id"] for e in out[8]["ok"]] == ["2"]


async def test_error_names(js_peer: Path, server: EventServer) -> None:
    out = await calls(
        js_peer,
        server,
        "alice:alice-pw",
        call("poll", "1.1", "registerConsumer", "LIVE"),
        call("poll", "1.1", "pollEvents", "UNKNOWN", None, None),
        call("push", "1.1", "pollEvents", "UNKNOWN", None, None),
        raw("futoin.evt.gen:1.1", "addEvent", {"type": "lower", "data": 1}),
        raw("futoin.evt.gen:1.1", "addEvent", {"type": "A"}),
        raw("futoin.evt.gen:1.9", "addEvent", {"type": "A", "data": 1}),
        raw("futoin.evt.gen:2.0", "addEvent", {"type": "A", "data": 1}),
        raw("futoin.evt.nope:1.0", "x", {}),
    )
    assert [r.get("error") for r in out] == [
        "LiveNotAllowed",
        "NotRegistered",
        "NotRegistered",
        "InvalidRequest",
        "InvalidRequest",
        "NotSupportedVersion",
        "NotSupportedVersion",
        "UnknownInterface",
    ]


async def test_wrong_password_and_anonymous(js_peer: Path, server: EventServer) -> None:
    wrong = await calls(js_peer, server, "alice:nope", call("gen", "1.1", "addEvent", "A", 1))
    assert wrong == [{"error": "SecurityError", "desc": "Invalid credentials"}]
    anonymous = await calls(
        js_peer,
        server,
        None,
        raw("futoin.evt.gen:1.1", "addEvent", {"type": "A", "data": 1}),
        raw("futoin.evt.gen:1.9", "addEvent", {"type": "A", "data": 1}),
    )
    assert [r["error"] for r in anonymous] == ["SecurityError", "UnknownInterface"]
    assert anonymous[0]["desc"] == "Anonymous not allowed"


def test_our_iface_definitions_match_the_published_ones(js_peer: Path) -> None:
    published = js_peer / "node_modules" / "@futoin" / "specs" / "final" / "meta"
    # futoinevt.*, futoin.evt.dcb, futoin.evt.notify(.receiver) and futoin.evt.gen 1.2 are
    # this server's own; the rest must be FutoIn's as published
    own = (".dcb-", ".notify-", ".notify.", ".gen-1.2-")
    ours = sorted(
        p
        for p in (ROOT / "ifaces").glob("futoin.*-iface.json")
        if not any(mark in p.name for mark in own)
    )
    assert len(ours) == 11
    for path in ours:
        assert json.loads(path.read_text()) == json.loads((published / path.name).read_text()), (
            path.name
        )
    # gen 1.2 is the published 1.1 with an optional key on addEvent, and nothing else
    gen = json.loads((ROOT / "ifaces" / "futoin.evt.gen-1.2-iface.json").read_text())
    key = gen["funcs"]["addEvent"]["params"].pop("key")
    assert key == {"type": "EventKey", "default": None}
    event_key = gen.pop("types")["EventKey"]
    assert (event_key["type"], event_key["regex"]) == ("string", "^[A-Za-z0-9._:-]{1,64}$")
    expected = json.loads((published / "futoin.evt.gen-1.1-iface.json").read_text())
    assert gen == {**expected, "version": "1.2"}
