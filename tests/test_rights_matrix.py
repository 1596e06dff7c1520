"""Rights per stream at every door, as one table: each door's calls that need read, write or
manage on the stream ``ledger``, tried by a user (``tenant``) whose only grant is by the
stream's name, by a prefix, by ``*``, on another stream, or none. A call is allowed exactly
when the grant covers ``ledger`` with the right the call needs.

Against ``futoin-evt serve`` as its own process, on SQLite and on PostgreSQL, with one worker
and with two (grants changed through the ops iface reach both workers); each door's own
refusal is checked (FTN3 SecurityError, HTTP 403, AMQP unauthorized-access), and so is the
rule that a caller without rights is refused the same way for a stream that does not exist.
Each door's own test file has the rest (partition paths, revocation, the console, SAS).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications

from .support.cli import run
from .support.servers import ServerProcess

pytestmark = pytest.mark.functional

TARGET = "ledger"
OTHER = "payroll"
TENANT = "tenant"
TENANT_PW = "tenant-pw"
ROOT_PW = "root-pw"
#: The tenant's only grant, by kind: (pattern or None for no grant).
GRANTS: dict[str, str | None] = {
    "name": TARGET,
    "prefix": "led*",
    "everything": "*",
    "another stream": OTHER,
    "none": None,
}


class Refused(Exception):
    """The door refused for want of a right (its own error, checked by the call)."""


@dataclass
class Server:
    process: ServerProcess
    http: str

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def amqp(self) -> str:
        assert self.process.amqp_url is not None
        return self.process.amqp_url


def expect_security_error(exc: RemoteError, stream: str) -> Refused:
    assert exc.name == "SecurityError", exc
    assert exc.desc.endswith(f"right on stream {stream} is needed"), exc.desc
    return Refused(exc.desc)


async def ftn3(
    server: Server,
    stream: str,
    call: Callable[[EventStreamClient], Awaitable[Any]],
    path: str | None = None,
) -> None:
    """``call`` on a connection to the stream's path (or ``path``); its SecurityError about
    ``stream`` as :class:`Refused`."""
    path = stream if path is None else path
    credentials = f"{TENANT}:{TENANT_PW}"
    url = f"{server.url.rstrip('/')}/{path}"
    async with await EventStreamClient.connect(url, credentials=credentials) as client:
        try:
            await call(client)
        except RemoteError as exc:
            raise expect_security_error(exc, stream) from None


async def add_event(server: Server, stream: str) -> None:
    await ftn3(server, stream, lambda c: c.add_event("ENTRY", {"n": 1}))


async def poll_live(server: Server, stream: str) -> None:
    await ftn3(server, stream, lambda c: c.poll_events("LIVE"))


async def register_consumer(server: Server, stream: str) -> None:
    await ftn3(server, stream, lambda c: c.register_consumer("BOOKS"))


async def grow_stream(server: Server, stream: str) -> None:
    async def grow(client: EventStreamClient) -> None:
        try:
            await client.ftn3.call(OPS, "growStream", {"name": stream, "partitions": 1})
        except RemoteError as exc:
            if exc.name != "InvalidStream":  # one partition already: allowed, nothing grown
                raise

    await ftn3(server, stream, grow, path="")


async def subscribe(server: Server, stream: str) -> None:
    async def call(client: EventStreamClient) -> None:
        await Notifications(client.ftn3).subscribe(stream=stream)

    await ftn3(server, stream, call, path="")


def _basic() -> dict[str, str]:
    token = base64.b64encode(f"{TENANT}:{TENANT_PW}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _http_result(response: httpx.Response, stream: str) -> None:
    if response.status_code == 403:
        assert f"right on stream {stream} is needed" in response.text, response.text
        raise Refused(response.text)
    assert response.status_code < 400, (response.status_code, response.text)


async def feed_read(server: Server, stream: str) -> None:
    async with httpx.AsyncClient(headers=_basic()) as http:
        _http_result(await http.get(f"{server.http}/feeds/{stream}"), stream)


async def dcb_read(server: Server, stream: str) -> None:
    body = {"query": {"items": [{"tags": ["account:1"]}]}}
    async with httpx.AsyncClient(headers=_basic()) as http:
        url = f"{server.http}/dcb/v1/streams/{stream}/read"
        _http_result(await http.post(url, content=json.dumps(body)), stream)


async def dcb_append(server: Server, stream: str) -> None:
    body = {"events": [{"type": "Opened", "data": {"n": 1}, "tags": ["account:1"]}]}
    async with httpx.AsyncClient(headers=_basic()) as http:
        url = f"{server.http}/dcb/v1/streams/{stream}/append"
        _http_result(await http.post(url, content=json.dumps(body)), stream)


def _amqp(server: Server, stream: str, act: Callable[[BlockingConnection], object]) -> None:
    connection = BlockingConnection(
        server.amqp, user=TENANT, password=TENANT_PW, allowed_mechs="PLAIN", timeout=30
    )
    try:
        act(connection)
    except LinkDetached as exc:
        if "amqp:unauthorized-access" not in str(exc):
            raise
        raise Refused(str(exc)) from None
    finally:
        connection.close()


async def amqp_send(server: Server, stream: str) -> None:
    def send(connection: BlockingConnection) -> None:
        connection.create_sender(stream).send(Message(body={"n": 1}))

    await asyncio.to_thread(_amqp, server, stream, send)


async def amqp_receive(server: Server, stream: str) -> None:
    await asyncio.to_thread(_amqp, server, stream, lambda c: c.create_receiver(stream))


#: (door and call, the right it needs, how to make it).
CALLS: list[tuple[str, str, Callable[[Server, str], Awaitable[None]]]] = [
    ("FTN18 addEvent", "write", add_event),
    ("FTN18 pollEvents LIVE", "read", poll_live),
    ("FTN18 registerConsumer", "read", register_consumer),
    ("ops growStream", "manage", grow_stream),
    ("notification subscribe", "read", subscribe),
    ("feed GET", "read", feed_read),
    ("DCB read over HTTP", "read", dcb_read),
    ("DCB append over HTTP", "write", dcb_append),
    ("AMQP sender", "write", amqp_send),
    ("AMQP receiver", "read", amqp_receive),
]


def admin(server: Server, *args: str) -> None:
    env = {"FUTOIN_EVT_USER": "root", "FUTOIN_EVT_PASSWORD": ROOT_PW}
    result = run(*args, "--url", server.url, env=env)
    assert result.returncode == 0, (args, result.stderr)


@pytest.fixture
def served(store_db: str, serve_workers: int) -> Iterator[Server]:
    for name, flags, password in (("root", ["--admin"], ROOT_PW), (TENANT, [], TENANT_PW)):
        added = run("user", "add", name, *flags, "--password-stdin", "--db", store_db,
                    stdin=password + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
    for stream in (TARGET, OTHER):
        assert run("stream", "add", stream, "--partitions", "1", "--db", store_db).returncode == 0
    process = ServerProcess(store_db, 0, "--amqp", "127.0.0.1:0", workers=serve_workers)
    try:
        yield Server(process, process.url.replace("ws://", "http://", 1).rstrip("/"))
    finally:
        process.stop()


async def test_every_door_allows_exactly_what_the_grant_covers(served: Server) -> None:
    rights = ("read", "write", "manage")
    outcomes: dict[tuple[str, str], str] = {}
    for kind, pattern in GRANTS.items():
        if pattern is not None:
            admin(served, "grant", TENANT, ",".join(rights), pattern)
        covered = pattern is not None and (pattern == "*" or TARGET.startswith(pattern.rstrip("*")))
        for call_name, _right, call in CALLS:
            try:
                await call(served, TARGET)
            except Refused:
                outcomes[(kind, call_name)] = "refused"
            else:
                outcomes[(kind, call_name)] = "allowed"
            assert outcomes[(kind, call_name)] == ("allowed" if covered else "refused"), (
                kind,
                call_name,
            )
        if pattern is not None:
            admin(served, "revoke", TENANT, ",".join(rights), pattern)
    # one right at a time, by name: each call needs exactly its own
    for granted in rights:
        admin(served, "grant", TENANT, granted, TARGET)
        for call_name, needed, call in CALLS:
            try:
                await call(served, TARGET)
                allowed = True
            except Refused:
                allowed = False
            assert allowed == (needed == granted), (granted, call_name)
        admin(served, "revoke", TENANT, granted, TARGET)


async def test_a_missing_stream_is_refused_as_one_without_rights(served: Server) -> None:
    """No right on the name: the same refusal whether or not the stream exists."""
    for call_name, _right, call in CALLS:
        for stream in (OTHER, "no-such-stream"):
            with pytest.raises(Refused):  # noqa: PT012 - the message names the call
                await call(served, stream)
                pytest.fail(f"{call_name} on {stream} was allowed")
