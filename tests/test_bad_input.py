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
