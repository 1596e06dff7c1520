"""Every refusal says what to do: the event type, key, consumer component and stream name
rules, one sentence each, at every door in its own form and from the command line before it
sends; a selector comparing the event type with a name that is no attribute; ``GET /`` on
the WebSocket port; failed logins in the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proton import Message
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.login_log import FailedLogins
from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.client.notify import NOTIFY
from futoin_evt.console.config import ConsoleConfig
from futoin_evt.domain.stream import (
    COMPONENT_RULE,
    EVENT_KEY_RULE,
    EVENT_TYPE_RULE,
    STREAM_NAME_RULE,
)
from futoin_evt.server.app import EventServer

from .support.console import console_login
from .support.servers import USERS, ServerFactory, ServerProcess, free_port

pytestmark = pytest.mark.functional

CLI = [sys.executable, "-m", "futoin_evt"]
ALICE = ("alice", USERS["alice"])
UNQUOTED_TYPE = "quote an event type, eventType = 'ORDER_PLACED'"


# -- the command line, before it sends --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "order_placed", "{}"], EVENT_TYPE_RULE),
        (["add", "ORDER-PLACED", "{}"], EVENT_TYPE_RULE),
        (["add", "ORDER_PLACED", "{}", "--key", "bad key!"], EVENT_KEY_RULE),
        (["poll", "C2", "--want", "order_placed"], EVENT_TYPE_RULE),
        (["poll", "C-2"], COMPONENT_RULE),
        (["tail", "C2", "--want", "ORDER_PLACED,order_shipped"], EVENT_TYPE_RULE),
        (["tail", "--selector", "eventType = 'X'"], "--selector needs --live"),
        (["tail", "--live", "--selector", "eventType = ORDER_PLACED"], UNQUOTED_TYPE),
    ],
)
def test_the_command_line_checks_names_before_it_sends(args: list[str], says: str) -> None:
    """Nothing listens at the URL: the check comes first, in one sentence."""
    env = {**os.environ, "FUTOIN_EVT_URL": f"ws://127.0.0.1:{free_port()}/",
           "FUTOIN_EVT_USER": "alice", "FUTOIN_EVT_PASSWORD": "x"}  # fmt: skip
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode != 0, result.stderr
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- the doors --------------------------------------------------------------------------------


@pytest.fixture
async def served(start_server: ServerFactory) -> AsyncIterator[tuple[EventServer, Any]]:
    server = await start_server(amqp=AmqpConfig(port=0))
    client = await EventStreamClient.connect(server.url, credentials=":".join(ALICE))
    yield server, client
    await client.close()


async def _desc(call: Any) -> str:
    with pytest.raises(RemoteError) as info:
        await call
    return str(info.value.desc)


async def test_ftn3_says_each_rule(served: tuple[EventServer, EventStreamClient]) -> None:
    _server, alice = served
    assert EVENT_TYPE_RULE in await _desc(alice.add_event("order_placed", {}))
    assert EVENT_KEY_RULE in await _desc(alice.add_event("ORDER_PLACED", {}, "bad key!"))
    assert EVENT_TYPE_RULE in await _desc(alice.poll_events("C2", None, ["order_placed"]))
    assert COMPONENT_RULE in await _desc(alice.register_consumer("C-2"))
    described = alice.ftn3.call(OPS, "describeStream", {"name": "Orders"})
    assert STREAM_NAME_RULE in await _desc(described)
    subscribed = alice.ftn3.call(NOTIFY, "subscribe", {"selector": "eventType = ORDER_PLACED"})
    unquoted = await _desc(subscribed)
    assert UNQUOTED_TYPE in unquoted
    assert "eventType, id, ts, stream, partition" in unquoted
    stream = alice.ftn3.call(NOTIFY, "subscribe", {"selector": "id > 1 AND stream = orders"})
    assert "quote a stream name, stream = 'orders'" in await _desc(stream)


async def test_http_doors_say_each_rule(served: tuple[EventServer, EventStreamClient]) -> None:
    server, _alice = served
    base = server.url.replace("ws", "http", 1)
    async with httpx.AsyncClient(auth=ALICE, base_url=base, timeout=60) as http:
        feed = await http.get("/feeds/Bad!")
        assert (feed.status_code, STREAM_NAME_RULE in feed.text) == (404, True), feed.text
        token = (await http.get("/feed")).json()["token"]
        typed = await http.get(
            "/feed/events",
            params={"token": token, "partition": "0", "cursor": "_first",
                    "event-types": "order_placed"},
        )  # fmt: skip
        assert (typed.status_code, EVENT_TYPE_RULE in typed.text) == (400, True), typed.text
        selected = await http.get(
            "/feed", params={"n": "1", "cursor0": "_first", "selector": "eventType = ORDER_PLACED"}
        )
        assert selected.status_code == 400
        assert UNQUOTED_TYPE in selected.text
        event = {"type": "A", "data": {}, "tags": []}
        dcb = await http.post("/dcb/v1/streams/Bad!/append", json={"events": [event]})
        assert (dcb.status_code, STREAM_NAME_RULE in dcb.text) == (400, True), dcb.text


async def test_amqp_says_the_event_type_rule(
    served: tuple[EventServer, EventStreamClient],
) -> None:
    server, _alice = served
    url = server.amqp_url
    assert url is not None

    def send() -> str:
        conn = BlockingConnection(
            url, user=ALICE[0], password=ALICE[1], allowed_mechs="PLAIN", timeout=30
        )
        try:
            link: Any = conn.create_sender("events").link
            delivery: Any = link.send(Message(subject="order_placed", body={}))
            conn.wait(lambda: delivery.remote_state != 0)
            condition = delivery.remote.condition
            assert condition is not None
            return f"{condition.name}: {condition.description}"
        finally:
            conn.close()

    rejected = await asyncio.to_thread(send)
    assert rejected.startswith("amqp:invalid-field")
    assert EVENT_TYPE_RULE in rejected


# -- GET / on the WebSocket port --------------------------------------------------------------


@pytest.mark.parametrize("console", [True, False])
async def test_get_slash_links_what_the_port_serves(
    start_server: ServerFactory, console: bool
) -> None:
    server = await start_server(console=ConsoleConfig() if console else None)
    base = server.url.replace("ws", "http", 1)
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        page = await http.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "cannot access a WebSocket server" not in page.text
    assert 'href="/feed"' in page.text
    assert 'href="/asyncapi.json"' in page.text
    assert ('href="/console/"' in page.text) is console
    # the same path still takes WebSocket clients
    client = await EventStreamClient.connect(server.url, credentials=":".join(ALICE))
    try:
        assert await client.ping(7) == 7
    finally:
        await client.close()


# -- failed logins in the log -----------------------------------------------------------------


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    db = tmp_path / "logins.sqlite"
    subprocess.run(
        [*CLI, "user", "add", "alice", "--password-stdin", "--db", str(db)],
        input=USERS["alice"] + "\n", text=True, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    process = ServerProcess(db, 0, "--amqp", f"127.0.0.1:{free_port()}", "--console")
    yield process
    if process.proc.poll() is None:
        process.kill()


async def _ftn3_login(url: str, credentials: str) -> str:
    """How a call with these credentials is answered."""
    try:
        client = await EventStreamClient.connect(url, credentials=credentials)
        try:
            await client.ping(1)
        finally:
            await client.close()
    except RemoteError as exc:
        return exc.name
    return "accepted"


async def test_failed_logins_are_logged_at_warning_by_every_door(
    server_process: ServerProcess,
) -> None:
    process = server_process
    secret = "wr0ng-s3cret"
    base = process.url.replace("ws", "http", 1)
    assert await _ftn3_login(process.url, f"mallory:{secret}") == "SecurityError"
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        assert (await http.get("/feed", auth=("trudy", secret))).status_code == 401
    async with httpx.AsyncClient(base_url=base + "console/", timeout=60) as console:
        assert (await console_login(console, "oscar", secret)).status_code != 303
    assert process.amqp_url is not None

    def amqp_login() -> None:
        with contextlib.suppress(Exception):
            BlockingConnection(
                process.amqp_url, user="eve", password=secret, allowed_mechs="PLAIN", timeout=30
            ).close()

    await asyncio.to_thread(amqp_login)
    status, logged = process.stop_and_read_log(timeout=60)
    assert status == 0, logged
    lines = [line for line in logged.splitlines() if "login failed" in line]
    for door, user in [("FTN3", "mallory"), ("HTTP", "trudy"), ("Console", "oscar"),
                       ("AMQP", "eve")]:  # fmt: skip
        (line,) = [line for line in lines if f"{door} login failed for '{user}'" in line]
        assert " WARNING " in line
        assert "from 127.0.0.1" in line
    assert secret not in logged


def test_a_failed_login_is_logged_at_most_once_a_second_per_user_and_peer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    logins = FailedLogins(interval=1.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "futoin_evt.auth")
    written = [logins.note("websocket", "bob", "10.0.0.1", "Invalid credentials")
               for _ in range(5)]  # fmt: skip
    assert written == [True, False, False, False, False]
    assert logins.note("websocket", "bob", "10.0.0.2", "Invalid credentials")  # another peer
    assert logins.note("websocket", "carol", "10.0.0.1", "Invalid credentials")  # another name
    now[0] += 1.0
    assert logins.note("websocket", "bob", "10.0.0.1", "Invalid credentials")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4
    assert messages[-1] == (
        "FTN3 login failed for 'bob' from 10.0.0.1 (Invalid credentials;"
        " 4 more since the last line)"
    )
