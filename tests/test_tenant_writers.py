"""What users with some rights must not learn: a writer without read through DCB appends, a
revoked reader through a waiting feed response or AMQP ``$events``.

Against ``futoin-evt serve`` as its own process, on SQLite and on PostgreSQL. alice reads and
writes ``orders-eu``; wonly only writes there; bob reads ``orders`` and ``audit``; root is an
admin, who changes grants through the ops iface (so they take effect at once).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection

from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.domain.management import CONSUMER_DROPPED

from .support.cli import run
from .support.servers import ServerProcess

pytestmark = pytest.mark.functional

DCB_IFACE = "futoin.evt.dcb:1.0"
ROOT_PW = "root-pw"
PASSWORDS = {"alice": "alice-pw", "wonly": "wonly-pw", "bob": "bob-pw"}
GRANTS = [
    ("alice", "read,write", "orders-eu"),
    ("wonly", "write", "orders-eu"),
    ("bob", "read", "orders"),
    ("bob", "read", "audit"),
]
SELECTOR = ulong(0x0000_468C_0000_0004)


@dataclass
class Served:
    process: ServerProcess

    @property
    def http(self) -> str:
        return self.process.url.replace("ws://", "http://", 1).rstrip("/")

    @property
    def amqp(self) -> str:
        assert self.process.amqp_url is not None
        return self.process.amqp_url

    def admin(self, *args: str) -> None:
        """A command of root's through the running server."""
        env = {"FUTOIN_EVT_USER": "root", "FUTOIN_EVT_PASSWORD": ROOT_PW}
        result = run(*args, "--url", self.process.url, env=env)
        assert result.returncode == 0, (args, result.stderr)

    def ftn3(self, user: str, path: str) -> Any:
        url = f"{self.process.url.rstrip('/')}/{path}"
        password = ROOT_PW if user == "root" else PASSWORDS[user]
        return EventStreamClient.connect(url, credentials=f"{user}:{password}")


@pytest.fixture
def served(store_db: str) -> Iterator[Served]:
    users = [("root", ["--admin"], ROOT_PW), *((u, [], p) for u, p in PASSWORDS.items())]
    for name, flags, password in users:
        added = run("user", "add", name, *flags, "--password-stdin", "--db", store_db,
                    stdin=password + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
    for stream in ("orders-eu", "orders", "audit"):
        assert run("stream", "add", stream, "--partitions", "1", "--db", store_db).returncode == 0
    for user, rights, pattern in GRANTS:
        assert run("grant", user, rights, pattern, "--db", store_db).returncode == 0
    process = ServerProcess(store_db, 0, "--amqp", "127.0.0.1:0", workers=1)
    try:
        yield Served(process)
    finally:
        process.stop()


def basic(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def append(
    served: Served, user: str, events: list[dict[str, Any]], condition: Any = None
) -> httpx.Response:
    body: dict[str, Any] = {"events": events}
    if condition is not None:
        body["condition"] = condition
    async with httpx.AsyncClient(headers=basic(user), timeout=30) as http:
        url = f"{served.http}/dcb/v1/streams/orders-eu/append"
        return await http.post(url, content=json.dumps(body))


def refund(amount: int, event_id: str = "refund-cust42") -> dict[str, Any]:
    return {"type": "Refunded", "data": {"amount": amount}, "tags": ["customer:42"], "id": event_id}


async def test_an_event_id_conflict_tells_a_writer_without_read_nothing(served: Served) -> None:
    first = await append(served, "alice", [refund(10)])
    assert first.status_code == 200, first.text
    taken = {"error": "EventIdConflict", "message": "event id refund-cust42 is taken."}
    other_amount = await append(served, "wonly", [refund(99)])
    same_amount = await append(served, "wonly", [refund(10)])
    assert (other_amount.status_code, other_amount.json()) == (409, taken)
    assert (same_amount.status_code, same_amount.json()) == (409, taken)
    # a batch whose first id is new: the answer names the id that is taken, whatever its content
    for amount in (10, 99):
        batch = await append(served, "wonly", [refund(1, "fresh"), refund(amount)])
        assert (batch.status_code, batch.json()) == (409, taken)
    # the writer's own new event: its position is its to know; its retry is answered as any
    own = await append(served, "wonly", [refund(5, "wonly-1")])
    assert own.json() == {"position": 2}
    retry = await append(served, "wonly", [refund(5, "wonly-1")])
    assert (retry.status_code, retry.json()["message"]) == (409, "event id wonly-1 is taken.")
    # over FTN3, the same rule
    async with await served.ftn3("wonly", "orders-eu") as client:
        for amount in (10, 99):
            with pytest.raises(RemoteError) as refused:
                await client.ftn3.call(DCB_IFACE, "append", {"events": [refund(amount)]})
            assert (refused.value.name, refused.value.desc) == (
                "EventIdConflict",
                "event id refund-cust42 is taken",
            )
    # a writer who reads keeps idempotent retries and the conflict's own sentence
    again = await append(served, "alice", [refund(10)])
    assert again.json() == {"position": 1}
    conflict = await append(served, "alice", [refund(99)])
    assert conflict.status_code == 409
    assert conflict.json()["message"] == (
        "event id refund-cust42 is stored already with other content."
    )
    nothing_new = await append(served, "alice", [refund(1, "after")])
    assert nothing_new.json() == {"position": 3}, "a refused append stored something"


async def test_an_append_condition_needs_read(served: Served) -> None:
    assert (await append(served, "alice", [refund(10)])).status_code == 200
    needed = "The read right on stream orders-eu is needed for an append condition."
    for tag in ("customer:42", "customer:999"):  # one matches a stored event, one does not
        for condition in (
            {"failIfEventsMatch": {"items": [{"tags": [tag]}]}},
            {"failIfEventsMatch": {"items": [{"tags": [tag]}]}, "after": 0},
            {"query": {"criteria": [{"type": "Tags", "properties": {"tags": [tag]}}]},
             "expectedHighestSequenceNumber": "NONE"},
        ):  # fmt: skip
            response = await append(served, "wonly", [refund(1, "w-2")], condition)
            assert response.status_code == 403, response.text
            assert response.json() == {"error": "AccessDenied", "message": needed}
    async with await served.ftn3("wonly", "orders-eu") as client:
        condition = {"failIfEventsMatch": {"items": [{"tags": ["customer:42"]}]}}
        params = {"events": [refund(1, "w-2")], "condition": condition}
        with pytest.raises(RemoteError) as refused:
            await client.ftn3.call(DCB_IFACE, "append", params)
        assert refused.value.name == "SecurityError"
        assert refused.value.desc == needed[:1].lower() + needed[1:-1]
    # nothing was stored; a condition of a writer who reads is judged as before
    matched = await append(
        served,
        "alice",
        [refund(2, "a-2")],
        {"failIfEventsMatch": {"items": [{"tags": ["customer:42"]}]}},
    )
    assert matched.status_code == 409
    assert matched.json()["message"] == "an event at position 1 matches the append condition."
    assert (await append(served, "alice", [refund(2, "a-3")])).json() == {"position": 2}


async def test_a_waiting_feed_response_ends_at_the_revoke(served: Served) -> None:
    async with httpx.AsyncClient(headers=basic("bob"), timeout=90) as http:
        feed = f"{served.http}/feeds/orders"
        token = (await http.get(feed)).json()["token"]
        params = {"token": token, "partition": "0", "cursor": "_last", "wait": "60"}
        lines: list[str] = []
        async with http.stream("GET", feed + "/events", params=params) as response:
            assert response.status_code == 200  # a long poll has its 200 before it waits
            served.admin("revoke", "bob", "read", "orders")
            async with asyncio.timeout(30):  # far less than the wait asked for
                try:
                    async for line in response.aiter_lines():
                        lines.append(line)
                except httpx.RemoteProtocolError:  # cut short: the answer was under way
                    pass
        assert not any('"data"' in line for line in lines), lines
        refused = await http.get(feed)
        assert refused.status_code == 403


async def test_a_feed_token_does_not_show_the_partition_key(served: Served) -> None:
    """The key counts every stream's partitions (``orders`` has the second one made)."""
    async with httpx.AsyncClient(headers=basic("bob"), timeout=30) as http:
        before = (await http.get(f"{served.http}/feeds/orders")).json()["token"]
        served.admin("stream", "grow", "orders", "--partitions", "2")
        grown = (await http.get(f"{served.http}/feeds/orders")).json()["token"]
    database, _, digest = before.partition("-")
    assert re.fullmatch(r"[0-9a-f]{16}", digest), before  # no "2-1": a digest
    assert grown.startswith(database + "-"), grown
    assert grown != before  # it changes as it did


def _dropped_about(message: Message) -> str:
    assert message.properties is not None
    return str(message.properties["stream"])


async def test_amqp_events_hide_management_events_of_a_stream_no_longer_read(
    served: Served,
) -> None:
    async with await served.ftn3("bob", "audit") as client:
        await client.register_consumer("BOBPAY")
    async with await served.ftn3("bob", "orders") as client:
        await client.register_consumer("BOBORD")
    loop = asyncio.get_running_loop()
    attached = asyncio.Event()

    def receive() -> list[Message]:
        conn = BlockingConnection(
            served.amqp, user="bob", password=PASSWORDS["bob"], allowed_mechs="PLAIN", timeout=30
        )
        try:
            selector = Described(SELECTOR, f"eventType = '{CONSUMER_DROPPED}'")
            options = Filter({symbol("selector"): selector})
            receiver = conn.create_receiver("$events/orders", credit=10, options=options)
            loop.call_soon_threadsafe(attached.set)
            first = receiver.receive(timeout=60)
            receiver.accept()
            return [first]
        finally:
            conn.close()

    receiving = asyncio.ensure_future(asyncio.to_thread(receive))
    await asyncio.wait(
        {receiving, asyncio.ensure_future(attached.wait())}, return_when="FIRST_COMPLETED"
    )
    served.admin("revoke", "bob", "read", "audit")
    for stream, component in (("audit", "BOBPAY"), ("orders", "BOBORD")):
        async with await served.ftn3("root", stream) as root:
            try:
                await root.ftn3.call(OPS, "dropConsumer", {"user": "bob", "component": component})
            except RemoteError as exc:  # a consumer may go with its owner's read right
                if (exc.name, stream) != ("UnknownConsumer", "audit"):
                    raise
    messages = await receiving
    assert [_dropped_about(m) for m in messages] == ["orders"]
