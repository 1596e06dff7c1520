"""Aggregated streams carry their source's rights, at every door that reads: FTN18 polls, the
HTTP feed, DCB reads, AMQP receivers, the console's events page.

Against ``futoin-evt serve`` as its own process, on SQLite and on PostgreSQL. carol (read and
manage on ``carol*``, read on ``orders``) adds ``carol-agg``, an aggregate of ``orders``; once
her read on ``orders`` is revoked she reads ``carol-agg`` no more (her AMQP receiver, push
stream and subscription on it end), while the copying goes on for those who may read it.
root's ``orders-hr``, an aggregate of ``payroll``, is not readable by alice through her grant
on ``orders*``, nor is an aggregate of ``orders-hr`` by carol until she may read ``payroll``
too. No refusal, and no listing, names the source to a caller without rights on it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from proton import Endpoint, Timeout
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.notify import Notifications

from .support import waiting
from .support.cli import run
from .support.console import console_login
from .support.servers import ServerProcess

pytestmark = pytest.mark.functional

PASSWORDS = {"root": "root-pw", "carol": "carol-pw", "alice": "alice-pw"}
UNAUTHORIZED = "amqp:unauthorized-access"
PUSH = "futoin.evt.push:1.1"
RECEIVER = "futoin.evt.receiver"

until = functools.partial(waiting.until, seconds=60.0)


@dataclass
class Server:
    process: ServerProcess

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://", 1).rstrip("/")

    @property
    def amqp(self) -> str:
        assert self.process.amqp_url is not None
        return self.process.amqp_url


def cli(server: Server, user: str, *args: str) -> str:
    """A command over ``--url`` as ``user``; its output (it must succeed)."""
    env = {"FUTOIN_EVT_USER": user, "FUTOIN_EVT_PASSWORD": PASSWORDS[user]}
    result = run(*args, "--url", server.url, env=env)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


@pytest.fixture
def served(store_db: str) -> Iterator[Server]:
    for name, password in PASSWORDS.items():
        flags = ["--admin"] if name == "root" else []
        added = run("user", "add", name, *flags, "--password-stdin", "--db", store_db,
                    stdin=password + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
    for stream in ("orders", "payroll"):
        assert run("stream", "add", stream, "--partitions", "1", "--db", store_db).returncode == 0
    for user, rights, pattern in (
        ("carol", "read,manage", "carol*"),
        ("carol", "read", "orders"),
        ("alice", "read,write", "orders*"),
    ):
        assert run("grant", user, rights, pattern, "--db", store_db).returncode == 0
    process = ServerProcess(store_db, 0, "--amqp", "127.0.0.1:0", "--console")
    try:
        yield Server(process)
    finally:
        process.stop()


# -- the doors, each as the user ``who``: what they read, or the refusal's sentence --------


class Refused(Exception):
    """A door refused for want of a right; the sentence it said."""


async def add(server: Server, who: str, stream: str, n: int) -> None:
    credentials = f"{who}:{PASSWORDS[who]}"
    async with await EventStreamClient.connect(
        f"{server.url}{stream}", credentials=credentials
    ) as c:
        await c.add_event("ORDER", {"n": n})


async def ftn18_poll(server: Server, who: str, stream: str) -> list[Any]:
    """The data of the events a new consumer of ``who`` polls from the stream."""
    credentials = f"{who}:{PASSWORDS[who]}"
    async with await EventStreamClient.connect(
        f"{server.url}{stream}", credentials=credentials
    ) as c:
        try:
            await c.register_consumer("READER")
            return [e.data for e in await c.poll_events("READER")]
        except RemoteError as exc:
            if exc.name != "SecurityError":
                raise
            raise Refused(exc.desc) from None


def _basic(who: str) -> dict[str, str]:
    token = base64.b64encode(f"{who}:{PASSWORDS[who]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _http(response: httpx.Response) -> Any:
    if response.status_code == 403:
        raise Refused(response.text)
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()


async def feed_read(server: Server, who: str, stream: str) -> list[Any]:
    """Discovery, then the events of partition 0 from the first (FeedAPI v2)."""
    async with httpx.AsyncClient(headers=_basic(who)) as http:
        url = f"{server.http}/feeds/{stream}"
        token = _http(await http.get(url))["token"]
        params = {"token": token, "partition": "0", "cursor": "_first"}
        response = await http.get(url + "/events", params=params)
    if response.status_code == 403:
        raise Refused(response.text)
    assert response.status_code == 200, (response.status_code, response.text)
    lines = [json.loads(line) for line in response.text.splitlines()]
    return [line["data"]["data"] for line in lines if "data" in line]


async def dcb_read(server: Server, who: str, stream: str) -> list[Any]:
    body = {"query": {"items": [{"types": ["ORDER"]}]}}
    async with httpx.AsyncClient(headers=_basic(who)) as http:
        url = f"{server.http}/dcb/v1/streams/{stream}/read"
        return list(_http(await http.post(url, content=json.dumps(body)))["events"])


async def console_events(server: Server, who: str, stream: str) -> str:
    """The console's events page of the stream's partition 0 (its HTML)."""
    async with httpx.AsyncClient(base_url=f"{server.http}/console/") as browser:
        logged_in = await console_login(browser, who, PASSWORDS[who])
        assert logged_in.status_code == 303, logged_in.text
        page = await browser.get("events", params={"stream": stream, "partition": "0"})
    if page.status_code == 403:
        raise Refused(page.text)
    assert page.status_code == 200, (page.status_code, page.text)
    return page.text


def _amqp(server: Server, who: str) -> BlockingConnection:
    return BlockingConnection(
        server.amqp, user=who, password=PASSWORDS[who], allowed_mechs="PLAIN", timeout=30
    )


def amqp_attach(server: Server, who: str, stream: str) -> None:
    """A receiver of ``who`` on the stream, attached (blocking), then closed."""
    connection = _amqp(server, who)
    try:
        connection.create_receiver(stream, credit=10)
    except LinkDetached as exc:
        if UNAUTHORIZED not in str(exc):
            raise
        raise Refused(str(exc)) from None
    finally:
        connection.close()


async def refused(read: Any, *args: Any) -> str:
    """The sentence a door refuses ``read(*args)`` with (it must refuse)."""
    try:
        got = await read(*args)
    except Refused as exc:
        return str(exc)
    raise AssertionError(f"{read.__name__}{args[1:]} was allowed: {got!r}")


async def refused_amqp(server: Server, who: str, stream: str) -> str:
    try:
        await asyncio.to_thread(amqp_attach, server, who, stream)
    except Refused as exc:
        return str(exc)
    raise AssertionError(f"an AMQP receiver of {who} on {stream} was attached")


async def push_and_subscribe(
    server: Server, who: str, stream: str
) -> tuple[FTN3Client, FTN3Client]:
    """Connections of ``who`` running a push stream (``readyToReceive``) and a notification
    subscription on the stream."""
    credentials = f"{who}:{PASSWORDS[who]}"
    pushed = await EventStreamClient.connect(f"{server.url}{stream}", credentials=credentials)
    await pushed.register_consumer("PUSHED", iface=PUSH)

    async def on_events(params: dict[str, Any]) -> bool:
        return True

    pushed.ftn3.on_request(RECEIVER, "onEvents", on_events)
    assert await pushed.ftn3.call(PUSH, "readyToReceive", {"component": "PUSHED"}) is True
    listening = await EventStreamClient.connect(server.url, credentials=credentials)
    await Notifications(listening.ftn3).subscribe(stream=stream)
    return pushed.ftn3, listening.ftn3


async def closed_with(client: FTN3Client) -> tuple[int, str]:
    """The code and reason of the server's close of ``client``'s connection."""
    try:
        async with asyncio.timeout(30):  # (shielded: the wait must not cancel the close)
            await asyncio.shield(client.wait_closed())
    except TimeoutError:
        raise AssertionError("the connection stays open at the revoke") from None
    close = client._io.ws.close_rcvd
    assert close is not None
    return int(close.code), close.reason


# -- the findings -------------------------------------------------------------------------


async def test_a_revoke_on_the_source_ends_the_readers_view_of_the_aggregate(
    served: Server,
) -> None:
    cli(served, "carol", "stream", "add", "carol-agg", "--aggregate", "orders")
    await add(served, "alice", "orders", 1)

    async def copied() -> bool:
        return await ftn18_poll(served, "carol", "carol-agg") == [{"n": 1}]

    await until(copied, "carol reads the copy of alice's event in carol-agg")
    assert await feed_read(served, "carol", "carol-agg") == [{"n": 1}]
    assert "ORDER" in await console_events(served, "carol", "carol-agg")
    # an AMQP receiver carol holds when the right goes is detached, as for a direct revoke
    connection = await asyncio.to_thread(_amqp, served, "carol")
    try:
        receiver = await asyncio.to_thread(connection.create_receiver, "carol-agg", 10)
        await add(served, "alice", "orders", 2)  # a receiver starts at the end
        copy = await asyncio.to_thread(receiver.receive, 30)
        assert copy.body == {"n": 2}

        pushed, subscribed = await push_and_subscribe(served, "carol", "carol-agg")

        cli(served, "root", "revoke", "carol", "read", "orders")  # in use when it returns

        try:
            for client in (pushed, subscribed):  # closed with the refusal, as at a direct revoke
                code, reason = await closed_with(client)
                assert code == 1008, (code, reason)
                assert "read right on stream carol-agg" in reason, reason
                assert "orders" not in reason, reason
        finally:
            for client in (pushed, subscribed):
                await client.close()

        def detached() -> Any:
            try:
                while not receiver.link.state & Endpoint.REMOTE_CLOSED:
                    with contextlib.suppress(LinkDetached):  # proton raises it for the detach
                        connection.wait(
                            lambda: bool(receiver.link.state & Endpoint.REMOTE_CLOSED), timeout=30
                        )
            except Timeout:
                raise AssertionError("carol's receiver on carol-agg stays at the revoke") from None
            return receiver.link.remote_condition

        condition = await asyncio.to_thread(detached)
        assert condition.name == UNAUTHORIZED, condition
        assert "orders" not in (condition.description or ""), condition.description
    finally:
        await asyncio.to_thread(connection.close)

    await add(served, "alice", "orders", 3)
    # the copying goes on: root reads alice's new event in carol-agg
    await until(
        lambda: _polled(served, "root", "carol-agg", [{"n": 1}, {"n": 2}, {"n": 3}]),
        "the copying into carol-agg goes on after the revoke",
    )
    # every door refuses carol, without naming the source she may no longer read
    direct = await refused(ftn18_poll, served, "carol", "orders")
    assert direct.endswith("the read right on stream orders is needed"), direct
    sentences = [
        await refused(ftn18_poll, served, "carol", "carol-agg"),
        await refused(feed_read, served, "carol", "carol-agg"),
        await refused(dcb_read, served, "carol", "carol-agg"),
        await refused(console_events, served, "carol", "carol-agg"),
        await refused_amqp(served, "carol", "carol-agg"),
    ]
    for sentence in sentences[:-1]:
        assert "carol-agg and on the stream it aggregates is needed" in sentence, sentence
    for sentence in sentences:  # AMQP says it its own way
        assert "read right on stream carol-agg" in sentence, sentence
        assert "orders" not in sentence, sentence
    # carol still manages her stream; her listing no longer names its source
    listed = json.loads(cli(served, "carol", "stream", "list", "--json"))
    assert [(s["name"], s.get("aggregate_of")) for s in listed] == [("carol-agg", None)]
    cli(served, "carol", "stream", "drop", "carol-agg", "--yes")


async def _polled(server: Server, who: str, stream: str, wanted: list[Any]) -> bool:
    return await ftn18_poll(server, who, stream) == wanted


async def test_a_grant_on_the_aggregates_name_alone_does_not_read_it(served: Server) -> None:
    cli(served, "root", "stream", "add", "orders-hr", "--aggregate", "payroll")
    await add(served, "root", "payroll", 1)
    await until(
        lambda: _polled(served, "root", "orders-hr", [{"n": 1}]),
        "root reads the copy of the payroll event in orders-hr",
    )
    await add(served, "alice", "orders", 7)
    assert await ftn18_poll(served, "alice", "orders") == [{"n": 7}]  # her grant works
    sentences = [
        await refused(ftn18_poll, served, "alice", "orders-hr"),
        await refused(feed_read, served, "alice", "orders-hr"),
        await refused(dcb_read, served, "alice", "orders-hr"),
        await refused(console_events, served, "alice", "orders-hr"),
        await refused_amqp(served, "alice", "orders-hr"),
    ]
    for sentence in sentences[:-1]:
        assert "orders-hr and on the stream it aggregates is needed" in sentence, sentence
    for sentence in sentences:  # AMQP says it its own way
        assert "read right on stream orders-hr" in sentence, sentence
        assert "payroll" not in sentence, sentence
    # her listing shows orders-hr (she may write there) without naming its source
    listed = json.loads(cli(served, "alice", "stream", "list", "--json"))
    assert [(s["name"], s.get("aggregate_of")) for s in listed] == [
        ("orders", None), ("orders-hr", None),
    ]  # fmt: skip


async def test_an_aggregate_of_an_aggregate_needs_read_on_every_stream_it_copies(
    served: Server,
) -> None:
    cli(served, "root", "stream", "add", "orders-hr", "--aggregate", "payroll")
    cli(served, "root", "stream", "add", "carol-hr", "--aggregate", "orders-hr")
    await add(served, "root", "payroll", 1)
    await until(
        lambda: _polled(served, "root", "carol-hr", [{"n": 1}]),
        "root reads the copy of a copy of the payroll event in carol-hr",
    )
    cli(served, "root", "grant", "carol", "read", "orders-hr")
    sentence = await refused(ftn18_poll, served, "carol", "carol-hr")
    assert sentence.endswith("carol-hr and on the stream it aggregates is needed"), sentence
    cli(served, "root", "grant", "carol", "read", "payroll")
    assert await ftn18_poll(served, "carol", "carol-hr") == [{"n": 1}]
