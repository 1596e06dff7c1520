"""Whatever a peer sends, it gets an FTN3 error or a clean close, and nobody else notices."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.server.app import EventServer
from futoin_evt.server.websocket import Limits

from .support.servers import ServerFactory

pytestmark = pytest.mark.functional

SEC = "alice:alice-pw"


async def _closed_with(ws: ClientConnection) -> int | None:
    """Read until the server closes; return the close code."""
    async with asyncio.timeout(10):
        try:
            while True:
                await ws.recv()
        except ConnectionClosed:
            return ws.close_code


async def _call(ws: ClientConnection, msg: dict[str, Any] | str | bytes) -> dict[str, Any]:
    await ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))
    async with asyncio.timeout(10):
        reply: dict[str, Any] = json.loads(await ws.recv())
    return reply


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\x00\x01garbage", "not valid JSON"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        ('{"f": "futoin.evt.gen:1.1:ping", "p": {"echo": 1}}', "no valid rid"),
        ('{"rid": 7, "f": "futoin.evt.gen:1.1:ping"}', "no valid rid"),
        ("[" * 50_000, "not valid JSON"),
    ],
)
async def test_unanswerable_frames_close_only_that_connection(
    server: EventServer, alice: EventStreamClient, frame: str | bytes, reason: str
) -> None:
    bystander_before = await alice.ping(1)
    async with connect(server.url) as ws:
        await ws.send(frame)
        assert await _closed_with(ws) == 1008
        assert reason in (ws.close_reason or "")
    assert bystander_before == await alice.ping(2) - 1
    assert await alice.add_event("STILL_OK", 1) >= 1


async def test_a_huge_frame_is_refused_by_closing(
    server: EventServer, alice: EventStreamClient
) -> None:
    async with connect(server.url, max_size=None) as ws:
        await ws.send(b"{" + b" " * (2 * 1024 * 1024) + b"}")
        assert await _closed_with(ws) == 1009
    assert await alice.ping(3) == 3


@pytest.mark.parametrize("as_text", [True, False])
async def test_text_and_binary_frames_are_answered_in_binary(
    server: EventServer, as_text: bool
) -> None:
    msg = json.dumps({"f": "futoin.evt.gen:1.1:ping", "p": {"echo": 9}, "rid": "C1", "sec": SEC})
    async with connect(server.url) as ws:
        await ws.send(msg if as_text else msg.encode())
        reply = await ws.recv()
    assert isinstance(reply, bytes)
    assert json.loads(reply) == {"r": {"echo": 9}, "rid": "C1"}


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        ({"rid": "C1", "f": "bad"}, "InvalidRequest"),
        ({"rid": "C1", "f": "futoin.evt.gen:1.1:addEvent", "p": [], "sec": SEC}, "InvalidRequest"),
        ({"rid": "C1", "f": "futoin.evt.gen:1.1:addEvent", "zz": 1, "sec": SEC}, "InvalidRequest"),
        ({"rid": "C1", "f": "futoin.evt.nope:1.0:x", "sec": SEC}, "UnknownInterface"),
        (
            {"rid": "C1", "f": "futoin.evt.gen:1.1:addEvent", "p": {"type": "A"}, "sec": SEC},
            "InvalidRequest",
        ),
        (
            {
                "rid": "C1",
                "f": "futoin.evt.gen:1.1:addEvent",
                "p": {"type": "A", "data": 1},
                "sec": 5,
            },
            "InvalidRequest",
        ),
        (
            {
                "rid": "C1",
                "f": "futoin.evt.gen:1.1:addEvent",
                "p": {"type": "A", "data": 1},
                "sec": "-hmac:a:b:c",
            },
            "SecurityError",
        ),
    ],
)
async def test_bad_requests_get_ftn3_errors_and_the_connection_stays(
    server: EventServer, msg: dict[str, Any], error: str
) -> None:
    async with connect(server.url) as ws:
        reply = await _call(ws, msg)
        assert reply["e"] == error
        assert reply["rid"] == "C1"
        assert set(reply) == {"e", "edesc", "rid"}
        ok = await _call(
            ws, {"rid": "C2", "f": "futoin.evt.gen:1.1:ping", "p": {"echo": 1}, "sec": SEC}
        )
        assert ok == {"r": {"echo": 1}, "rid": "C2"}


async def test_nan_is_not_json(server: EventServer) -> None:
    frame = '{"rid": "C1", "f": "futoin.evt.gen:1.1:addEvent", "p": {"type": "A", "data": NaN}}'
    async with connect(server.url) as ws:
        await ws.send(frame)
        assert await _closed_with(ws) == 1008


async def test_disconnect_mid_call_loses_nothing_acknowledged_and_harms_nobody(
    server: EventServer, alice: EventStreamClient
) -> None:
    async with connect(server.url) as ws:
        for i in range(50):
            await ws.send(
                json.dumps(
                    {
                        "rid": f"C{i + 1}",
                        "f": "futoin.evt.gen:1.1:addEvent",
                        "p": {"type": "GONE", "data": i},
                        "sec": SEC,
                    }
                )
            )
    # the connection is gone before (most of) the replies; the server keeps serving
    marker = await alice.add_event("AFTER", None)
    events = await alice.poll_events("LIVE")
    gone = [e for e in events if e.type == "GONE"]
    # whatever was stored is whole and ordered; the marker comes after it
    assert [e.data for e in gone] == sorted(e.data for e in gone)
    assert events[-1].id == marker


async def test_unexpected_reply_frames_are_ignored(server: EventServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(json.dumps({"rid": "S99", "r": True}))
        ok = await _call(
            ws, {"rid": "C1", "f": "futoin.evt.gen:1.1:ping", "p": {"echo": 4}, "sec": SEC}
        )
        assert ok["r"] == {"echo": 4}


def _cut(value: str) -> str:
    """How a refusal shows a value longer than 40 characters."""
    return f"'{value[:40]}…' ({len(value)} characters)"


async def test_http_refusals_quote_input_whole_or_say_where_it_was_cut(
    server: EventServer,
) -> None:
    """A quoted value is the value sent, or visibly cut with its length: never a shorter
    value that reads as another one (``'99999999999999999999'`` for 40 nines)."""
    assert server.feed_url is not None
    long_cursor = "1" * 45 + "x"
    cases = [
        ("pagesizehint", "0", "Bad pagesizehint '0': use a positive integer."),
        ("pagesizehint", "000", "Bad pagesizehint '000'"),
        ("pagesizehint", "-3", "Bad pagesizehint '-3'"),
        ("pagesizehint", "1e3", "Bad pagesizehint '1e3'"),
        ("pagesizehint", "\u00b2", "Bad pagesizehint '\u00b2'"),
        ("pagesizehint", "", "Bad pagesizehint ''"),
        ("pagesizehint", "-" + "9" * 40, "Bad pagesizehint " + _cut("-" + "9" * 40)),
        ("wait", "9" * 25, f"Bad wait '{'9' * 25}'"),
        ("wait", "9" * 60, "Bad wait " + _cut("9" * 60)),
        ("cursor", long_cursor, "Bad cursor " + _cut(long_cursor)),
        ("partition", "7" * 50, "Unknown partition " + _cut("7" * 50)),
        ("event-types", "a" * 41, "Bad event-types " + _cut("a" * 41)),
    ]
    async with httpx.AsyncClient(auth=("alice", "alice-pw"), timeout=10) as http:
        token = (await http.get(server.feed_url)).json()["token"]
        for name, value, message in cases:
            params = {"token": token, "partition": "0", "cursor": "_first", name: value}
            response = await http.get(server.feed_url + "/events", params=params)
            assert response.status_code == 400, (name, value)
            assert response.text.startswith(message), (name, value, response.text)
        response = await http.get(
            server.feed_url, params={"n": "1", "cursor0": "_first", "cursor" + "9" * 50: "1"}
        )
        assert response.status_code == 400
        assert "Unknown partition in " + _cut("cursor" + "9" * 50) in response.text
        dcb = server.url.replace("ws", "http", 1) + "dcb/v1/append"
        long_type = "T" * 99 + "!"
        response = await http.post(dcb, json={"events": [{"type": long_type, "data": 1}]})
        assert response.status_code == 400
        assert response.json()["message"].startswith("events[0].type: " + _cut(long_type))


@pytest.mark.parametrize(
    "frame",
    [
        "this is not json",
        b"\xff\xfe not UTF-8",
        "[1, 2]",
        '{"f": "futoin.evt.gen:1.1:ping", "p": {"echo": 1}}',
    ],
    ids=["not-json", "not-utf8", "not-an-object", "no-rid"],
)
async def test_calls_read_before_an_unanswerable_frame_are_answered_before_the_close(
    server: EventServer, frame: str | bytes
) -> None:
    """A fresh server: the calls wait on the first password check when the bad frame comes.
    Each is answered (a result or an FTN3 error), then the connection closes with 1008, and
    nothing sent after the bad frame is acted on."""
    calls = {
        f"C{i}": {
            "f": f"futoin.evt.gen:1.{9 if i % 3 == 1 else 1}:ping",
            "p": {"echo": i},
            "rid": f"C{i}",
            "sec": SEC,
        }
        for i in range(1, 7)
    }
    after = {
        "f": "futoin.evt.gen:1.1:addEvent",
        "p": {"type": "AFTER_BAD", "data": 1},
        "rid": "C7",
        "sec": SEC,
    }
    replies: dict[str, dict[str, Any]] = {}  # every reply before the close
    async with connect(server.url) as ws:
        for msg in calls.values():
            await ws.send(json.dumps(msg))
        await ws.send(frame)
        await ws.send(json.dumps(after))
        async with asyncio.timeout(10):
            try:
                while True:
                    reply = json.loads(await ws.recv())
                    replies[reply["rid"]] = reply
            except ConnectionClosed:
                pass
        assert ws.close_code == 1008
    assert sorted(replies) == sorted(calls)
    for rid, reply in replies.items():
        if calls[rid]["f"] == "futoin.evt.gen:1.9:ping":
            assert (reply["e"], reply["rid"]) == ("NotSupportedVersion", rid)
        else:
            assert reply == {"r": {"echo": int(rid[1:])}, "rid": rid}
    client = await EventStreamClient.connect(server.url, credentials=SEC)
    try:
        assert [e.type for e in await client.poll_events("LIVE")] == []
    finally:
        await client.close()


async def test_calls_that_do_not_finish_hold_the_close_only_for_drain_seconds(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for calls read before an unanswerable frame is bounded: a password check that
    never ends does not keep the connection open."""
    server = await start_server(limits=Limits(drain_seconds=0.2))
    released = asyncio.Event()

    class HeldUsers:
        async def get_user(self, name: str) -> None:
            await released.wait()

    monkeypatch.setattr(server.authenticator, "_users", HeldUsers())
    try:
        async with connect(server.url) as ws:
            msg = {"f": "futoin.evt.gen:1.1:ping", "p": {"echo": 1}, "rid": "C1", "sec": SEC}
            await ws.send(json.dumps(msg))
            await ws.send("this is not json")
            assert await _closed_with(ws) == 1008
            assert "not valid JSON" in (ws.close_reason or "")
    finally:
        released.set()
