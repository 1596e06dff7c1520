"""A call refused for its arguments, its rights or its data changes nothing: it registers no
consumer, moves no position, adds no event, creates no stream and writes no file. Each
door's refused calls, one table, against a real server on a real SQLite file; then the
command line's ``poll C2 --want order_placed``, which once left C2 registered."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from proton import symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.client.notify import NOTIFY
from futoin_evt.server.app import EventServer

from .support.servers import USERS, ServerFactory, ServerProcess

pytestmark = pytest.mark.functional

#: A user with no right on any stream.
NOBODY = ("nobody", "nobody-pw")
ALICE = ("alice", USERS["alice"])


@dataclass
class Doors:
    server: EventServer
    alice: EventStreamClient
    nobody: EventStreamClient
    http: httpx.AsyncClient
    http_nobody: httpx.AsyncClient


def snapshot(db: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The files beside the database, and every row of every table that a call could
    change (read from the file, as another process would)."""
    files = sorted(path.name for path in db.parent.iterdir())
    rows: dict[str, list[str]] = {}
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        tables = [
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_") and name not in ("meta", "console_sessions")
        ]
        for table in tables:
            rows[table] = sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{table}"'))
    return files, rows


@pytest.fixture
async def doors(start_server: ServerFactory, db_path: Path) -> AsyncIterator[Doors]:
    server = await start_server(amqp=AmqpConfig(port=0))
    user_id = await server.store.add_user(NOBODY[0], hash_password(NOBODY[1]))
    assert user_id
    await server.store.add_stream("orders", 2)
    await server.streams.refresh()
    await server.access.changed_here()
    alice = await EventStreamClient.connect(server.url, credentials=":".join(ALICE))
    nobody = await EventStreamClient.connect(server.url, credentials=":".join(NOBODY))
    base = server.url.replace("ws", "http", 1)
    async with (
        httpx.AsyncClient(auth=ALICE, base_url=base, timeout=60) as http,
        httpx.AsyncClient(auth=NOBODY, base_url=base, timeout=60) as http_nobody,
    ):
        await alice.add_event("BEFORE", {"n": 1})
        await alice.register_consumer("KEPT")
        assert await alice.poll_events("KEPT", None) != []
        yield Doors(server, alice, nobody, http, http_nobody)
    await alice.close()
    await nobody.close()


async def refused_ftn3(call: Awaitable[Any]) -> str:
    with pytest.raises(RemoteError) as info:
        await call
    return info.value.name


async def refused_http(response: Awaitable[httpx.Response]) -> str:
    reply = await response
    assert reply.status_code >= 400, reply.text
    return str(reply.status_code)


def amqp_refused(doors: Doors, user: tuple[str, str], address: str, **link: Any) -> str:
    """Attach a receiver; the server refuses it (detaches, or closes the connection)."""
    url = doors.server.amqp_url
    assert url is not None
    conn = BlockingConnection(
        url, user=user[0], password=user[1], allowed_mechs="PLAIN", timeout=30
    )
    try:
        receiver = conn.create_receiver(address, credit=10, **link)
        # a link the server accepts would deliver; one it refuses ends first
        conn.wait(lambda: receiver.link.state & receiver.link.REMOTE_CLOSED, timeout=30)
        condition = receiver.link.remote_condition
        return condition.name if condition is not None else "detached"
    except Exception as exc:  # refused at the attach
        return type(exc).__name__
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def group(name: str) -> dict[str, Any]:
    """The link option of a receiver in consumer group ``name``."""

    class Group(LinkOption):
        def apply(self, link: Any) -> None:
            link.properties = {symbol("event-streams-consumer-group"): name}

    return {"options": Group()}


async def positions(server: EventServer) -> list[tuple[str, str, int]]:
    """Every consumer of ``events``/0 with its position, as ``consumer list`` shows them."""
    return [(c.user, c.component, c.position) for c in await server.store.consumers()]


Refusal = Callable[[Doors], Awaitable[str]]


def add_stream(client: EventStreamClient, name: str) -> Awaitable[str]:
    return refused_ftn3(client.ftn3.call(OPS, "addStream", {"name": name, "partitions": 1}))


def subscribe(client: EventStreamClient, selector: str, **more: str) -> Awaitable[str]:
    return refused_ftn3(client.ftn3.call(NOTIFY, "subscribe", {"selector": selector, **more}))


def dcb_append(http: httpx.AsyncClient, path: str, event_type: str = "A") -> Awaitable[str]:
    event = {"type": event_type, "data": {}, "tags": []}
    return refused_http(http.post(path + "/append", json={"events": [event]}))


def attach(user: tuple[str, str], address: str, group_name: str | None = None) -> Refusal:
    link = group(group_name) if group_name is not None else {}
    return lambda d: asyncio.to_thread(amqp_refused, d, user, address, **link)


#: (the door and the call, how it is refused, the call)
CASES: list[tuple[str, str, Refusal]] = [
    # FTN18 over FTN3
    ("ftn3 addEvent, a type in lower case", "InvalidRequest",
     lambda d: refused_ftn3(d.alice.add_event("order_placed", {}))),
    ("ftn3 addEvent, a key with a space", "InvalidRequest",
     lambda d: refused_ftn3(d.alice.add_event("ORDER_PLACED", {}, "bad key!"))),
    ("ftn3 pollEvents of a new consumer, a type in lower case", "InvalidRequest",
     lambda d: refused_ftn3(d.alice.poll_events("C2", None, ["order_placed"]))),
    ("ftn3 pollEvents of a registered consumer, a type in lower case", "InvalidRequest",
     lambda d: refused_ftn3(d.alice.poll_events("KEPT", 1, ["order_placed"]))),
    ("ftn3 registerConsumer without the read right", "SecurityError",
     lambda d: refused_ftn3(d.nobody.register_consumer("C3"))),
    ("ftn3 registerConsumer, a component with a dash", "InvalidRequest",
     lambda d: refused_ftn3(d.alice.register_consumer("C-4"))),
    ("ftn3 addEvent without the write right", "SecurityError",
     lambda d: refused_ftn3(d.nobody.add_event("ORDER_PLACED", {}))),
    # the ops iface
    ("ops addStream, a name in upper case", "InvalidRequest",
     lambda d: add_stream(d.alice, "Orders2")),
    ("ops addStream without the manage right", "SecurityError",
     lambda d: add_stream(d.alice, "orders2")),
    # notification
    ("notify subscribe, an unquoted event type", "InvalidSelector",
     lambda d: subscribe(d.alice, "eventType = ORDER_PLACED")),
    ("notify subscribe to a stream that does not exist", "UnknownStream",
     lambda d: subscribe(d.alice, "id > 0", stream="nowhere")),
    # the HTTP feed
    ("feed of a stream that does not exist", "404",
     lambda d: refused_http(d.http.get("/feeds/nowhere"))),
    ("feed of a stream with a bad name", "404",
     lambda d: refused_http(d.http.get("/feeds/Bad!"))),
    ("feed without the read right", "403",
     lambda d: refused_http(d.http_nobody.get("/feed"))),
    ("feed events, an unquoted event type in the selector", "400",
     lambda d: refused_http(d.http.get("/feed", params={
         "n": "1", "cursor0": "_first", "selector": "eventType = X"}))),
    # DCB
    ("dcb append to a stream that does not exist", "404",
     lambda d: dcb_append(d.http, "/dcb/v1/streams/nowhere")),
    ("dcb append to a stream with a bad name", "400",
     lambda d: dcb_append(d.http, "/dcb/v1/streams/Bad!")),
    ("dcb append, an event with a bad type", "400",
     lambda d: dcb_append(d.http, "/dcb/v1", "a b")),
    ("dcb append without the write right", "403",
     lambda d: dcb_append(d.http_nobody, "/dcb/v1")),
    # AMQP
    ("amqp attach in a consumer group without the read right", "LinkDetached",
     attach(NOBODY, "events", "ftn18:billing")),
    ("amqp attach to a stream that does not exist", "LinkDetached",
     attach(ALICE, "nowhere/ConsumerGroups/$Default/Partitions/0")),
    ("amqp attach in a consumer group, a bad group name", "LinkDetached",
     attach(ALICE, "events", "ftn18:bad-group!")),
]  # fmt: skip


@pytest.mark.parametrize(("door", "refusal", "call"), CASES, ids=[case[0] for case in CASES])
async def test_a_refused_call_changes_nothing(
    doors: Doors, db_path: Path, door: str, refusal: str, call: Refusal
) -> None:
    before = snapshot(db_path)
    consumers = await positions(doors.server)
    streams = [info.name for info in doors.server.streams]
    assert await call(doors) == refusal
    # the refusal is answered; anything it had queued would be committed by the next call
    assert await doors.alice.ping(1) == 1
    await doors.alice.add_event("AFTER", {})
    after = snapshot(db_path)
    assert after[0] == before[0], door
    added = {t: [r for r in rows if r not in before[1][t]] for t, rows in after[1].items()}
    gone = {t: [r for r in rows if r not in after[1][t]] for t, rows in before[1].items()}
    # the one event added after the refusal, in the events of ``events``/0, and nothing else
    changed = {t: rows for t, rows in added.items() if rows}
    assert [len(rows) for rows in changed.values()] == [1], changed
    assert "AFTER" in next(iter(changed.values()))[0]
    assert not any(gone.values()), gone
    assert await positions(doors.server) == consumers
    assert [info.name for info in doors.server.streams] == streams


CLI = [sys.executable, "-m", "futoin_evt"]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


@pytest.mark.parametrize(
    "args",
    [
        ["poll", "C2", "--want", "order_placed"],
        ["poll", "C2", "--want", "ORDER_PLACED,order-shipped"],
        ["tail", "C2", "--want", "order_placed"],
        ["poll", "C-2"],
    ],
)
def test_a_refused_poll_or_tail_registers_no_consumer(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "cli.sqlite"
    subprocess.run(
        [*CLI, "user", "add", "carol", "--password-stdin", "--db", str(db)],
        input="c-pw\n", text=True, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert cli("grant", "carol", "read,write", "*", "--db", str(db), env={}).returncode == 0
    server = ServerProcess(db)
    try:
        env = {"FUTOIN_EVT_URL": server.url, "FUTOIN_EVT_USER": "carol",
               "FUTOIN_EVT_PASSWORD": "c-pw"}  # fmt: skip
        assert cli("add", "ORDER_PLACED", "{}", env=env).returncode == 0
        result = cli(*args, env=env)
        assert result.returncode != 0
        listed = cli("consumer", "list", env=env)
        assert listed.returncode == 0, listed.stderr
        assert "C2" not in listed.stdout
        assert "C-2" not in listed.stdout
    finally:
        server.stop()
