"""Rights per stream at the AMQP door, for two tenants (alice and bob, no admin) and the streams
``orders`` (2 partitions) and ``payroll``: each attach and ``$management`` request against the
grants (by name, by prefix, for every stream, none, another stream's, a missing name), over SASL
PLAIN on SQLite and PostgreSQL; SAS tokens valid only under their ``sr``; links detached when
their right is revoked; the Python and JavaScript Event Hubs SDKs with a shared access policy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError
from proton import Delivery, Endpoint, Message
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached, SendException

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.sas import sign
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.stream import EventDraft
from futoin_evt.log.access import grant, revoke
from futoin_evt.log.eventlog import EventLog
from futoin_evt.server.app import EventServer

from .support.amqp import ReplyTarget, connected
from .support.eventhubs import SECRET, anonymous, key_of, put_token, receive_from
from .support.js import run_js
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

ORDERS, PAYROLL = "orders", "payroll"
UNAUTHORIZED, NOT_FOUND = "amqp:unauthorized-access", "amqp:not-found"
READ_NEEDED = "the read right on stream {} is needed"
WRITE_NEEDED = "the write right on stream {} is needed"
#: Every pattern a test grants bob something on (so each case starts from none).
PATTERNS = ("*", "orders", "orders*", "orders-*", "payroll")

# -- what a connection may do on a stream ----------------------------------------------------------

Outcome = tuple[str, str]  # ("ok", "") or (a link's condition or a request's status, why)


def send(conn: BlockingConnection, stream: str, _group: str) -> None:
    sender = conn.create_sender(stream)
    sender.send(Message(subject="T", body=1))  # waits for it to be accepted
    sender.close()  # type: ignore[no-untyped-call]


def send_to_partition(conn: BlockingConnection, stream: str, group: str) -> None:
    send(conn, f"{stream}/Partitions/0", group)


def opened(receiver: BlockingReceiver) -> None:
    receiver.close()  # type: ignore[no-untyped-call]


def receive(conn: BlockingConnection, stream: str, _group: str) -> None:
    opened(conn.create_receiver(stream, credit=10))


def receive_in_group(conn: BlockingConnection, stream: str, group: str) -> None:
    opened(conn.create_receiver(f"{stream}/ConsumerGroups/{group}/Partitions/0", credit=10))


def info(conn: BlockingConnection, stream: str, _group: str) -> None:
    receiver = conn.create_receiver(f"{stream}/$info", credit=1)
    receiver.receive(timeout=30)
    opened(receiver)


def notifications(conn: BlockingConnection, stream: str, _group: str) -> None:
    opened(conn.create_receiver(f"$events/{stream}", credit=10))


class Refused(Exception):
    """A ``$management`` request answered with an error status."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status


def management_reply(conn: BlockingConnection, properties: dict[str, Any]) -> tuple[int, str]:
    """(status code, description) of one request to ``$management``."""
    sender = conn.create_sender("$management")
    receiver = conn.create_receiver("$management", credit=1, options=ReplyTarget("me"))
    sender.send(Message(id="req", reply_to="me", properties=properties, body={}))
    reply = receiver.receive(timeout=30)
    sender.close()  # type: ignore[no-untyped-call]
    receiver.close()  # type: ignore[no-untyped-call]
    answer: dict[str, Any] = dict(reply.properties or {})
    return int(answer["status-code"]), str(answer["status-description"])


def management(conn: BlockingConnection, stream: str, _group: str) -> None:
    status, description = management_reply(
        conn, {"operation": "READ", "name": stream, "type": "com.microsoft:eventhub"}
    )
    if status != 200:
        raise Refused(status, description)


#: Each operation, and the right it needs.
WRITES: dict[str, Callable[[BlockingConnection, str, str], None]] = {
    "send": send,
    "send to a partition": send_to_partition,
}
READS: dict[str, Callable[[BlockingConnection, str, str], None]] = {
    "receive": receive,
    "receive a group's partition": receive_in_group,
    "$info": info,
    "$management READ": management,
    "$events": notifications,
}
OPERATIONS = {**WRITES, **READS}


def outcomes(conn: BlockingConnection, stream: str, group: str) -> dict[str, Outcome]:
    """What each operation gets on ``stream`` (on the one connection)."""
    found: dict[str, Outcome] = {}
    for name, operation in OPERATIONS.items():
        try:
            operation(conn, stream, group)
        except LinkDetached as exc:
            found[name] = condition_of(exc.link)
        except Refused as exc:
            found[name] = (str(exc.status), str(exc))
        else:
            found[name] = ("ok", "")
    return found


def condition_of(link: Any) -> Outcome:
    """The error a link was detached with."""
    condition = link.remote_condition
    assert condition is not None
    return str(condition.name), str(condition.description)


def plain_outcomes(url: str, user: str, stream: str, group: str) -> dict[str, Outcome]:
    with connected(url, user) as conn:
        return outcomes(conn, stream, group)


ALLOWED: dict[str, Outcome] = dict.fromkeys(OPERATIONS, ("ok", ""))


def refused(stream: str, names: Any = OPERATIONS) -> dict[str, Outcome]:
    """The refusals of the operations ``names`` on ``stream`` without their right."""
    found: dict[str, Outcome] = {}
    for name in names:
        why = (WRITE_NEEDED if name in WRITES else READ_NEEDED).format(stream)
        found[name] = ("401", why) if name.startswith("$management") else (UNAUTHORIZED, why)
    return found


def kinds(found: dict[str, Outcome]) -> dict[str, str]:
    """Outcomes without their descriptions."""
    return {name: outcome[0] for name, outcome in found.items()}


MISSING: dict[str, str] = {
    name: "404" if name.startswith("$management") else NOT_FOUND for name in OPERATIONS
}


@pytest.fixture
async def tenants(start_server: ServerFactory, store_db: str) -> EventServer:
    """A server with ``orders`` (2 partitions) and ``payroll``; alice may read and write
    every stream, bob nothing until a test grants it."""
    server = await start_server(db=store_db, amqp=AmqpConfig(port=0, sas_secret=SECRET))
    await server.store.add_stream(ORDERS, 2)
    await server.store.add_stream(PAYROLL, 1)
    await server.streams.refresh()
    await revoke(server.store, "bob", "read,write", "*")
    await server.access.changed_here()
    return server


async def set_grants(server: EventServer, user: str, *grants: tuple[str, str]) -> None:
    """``user`` holds exactly these (rights, pattern) grants."""
    for pattern in PATTERNS:
        await revoke(server.store, user, "read,write,manage", pattern)
    for rights, pattern in grants:
        await grant(server.store, user, rights, pattern)
    await server.access.changed_here()


CASES: list[tuple[str, tuple[tuple[str, str], ...], str, dict[str, str]]] = [
    ("granted by name", (("read,write", "orders"),), ORDERS, kinds(ALLOWED)),
    ("granted by prefix", (("read,write", "orders*"),), ORDERS, kinds(ALLOWED)),
    ("granted on every stream", (("read,write", "*"),), ORDERS, kinds(ALLOWED)),
    ("not granted", (), ORDERS, kinds(refused(ORDERS))),
    ("granted on another stream", (("read,write", "payroll"),), ORDERS, kinds(refused(ORDERS))),
    ("a prefix the name is shorter than", (("read,write", "orders-*"),), ORDERS,
     kinds(refused(ORDERS))),
    ("read only", (("read", "orders*"),), ORDERS,
     {**kinds(ALLOWED), **kinds(refused(ORDERS, WRITES))}),
    ("write only", (("write", "orders"),), ORDERS,
     {**kinds(ALLOWED), **kinds(refused(ORDERS, READS))}),
    ("a missing name, not granted", (("read,write", "orders*"),), "nosuch",
     kinds(refused("nosuch"))),
    ("a missing name, granted", (("read,write", "*"),), "nosuch", MISSING),
]  # fmt: skip


async def test_every_attach_and_request_needs_its_right(tenants: EventServer) -> None:
    """Each case's grants for bob, then every operation on its stream over SASL PLAIN: the
    right it needs, and a name nobody may probe."""
    url = tenants.amqp_url or ""
    found = {}
    for number, (case, grants, stream, _expected) in enumerate(CASES):
        await set_grants(tenants, "bob", *grants)
        found[case] = kinds(
            await asyncio.to_thread(plain_outcomes, url, "bob", stream, f"g{number}")
        )
    assert found == {case: expected for case, _grants, _stream, expected in CASES}


async def test_a_refusal_says_which_right_on_which_stream(tenants: EventServer) -> None:
    """One sentence: the AccessDenied text (the same for a name that does not exist)."""
    url = tenants.amqp_url or ""
    await set_grants(tenants, "bob", ("read,write", "orders"))
    assert await asyncio.to_thread(plain_outcomes, url, "bob", PAYROLL, "g") == refused(PAYROLL)
    assert await asyncio.to_thread(plain_outcomes, url, "bob", "nosuch", "g") == refused("nosuch")
    # alice's rights are her own: bob's grants change nothing of hers, and hers none of his
    assert await asyncio.to_thread(plain_outcomes, url, "alice", PAYROLL, "g") == ALLOWED


async def test_get_events_needs_read_on_its_stream(tenants: EventServer) -> None:
    url = tenants.amqp_url or ""
    await set_grants(tenants, "bob", ("read", "orders*"))

    def replies() -> list[tuple[int, str]]:
        with connected(url, "bob") as conn:
            return [
                management_reply(conn, {"operation": "GET-EVENTS", "stream": stream})[:2]
                for stream in (ORDERS, PAYROLL, "nosuch", None)
            ]

    orders, payroll, missing, events = await asyncio.to_thread(replies)
    assert orders[0] == 200
    assert payroll == (401, READ_NEEDED.format(PAYROLL))
    assert missing == (401, READ_NEEDED.format("nosuch"))
    assert events == (401, READ_NEEDED.format("events"))


# -- SAS tokens: valid under their sr only -------------------------------------------------------


def token_outcomes(
    url_server: EventServer, key: str, resources: list[str], streams: list[str]
) -> tuple[list[tuple[int, str]], dict[str, dict[str, Outcome]]]:
    """Put a token (signed with bob's ``key``) for each resource on one connection, then
    every operation on each stream: (the put-token answers, outcomes by stream)."""
    expiry = int(time.time()) + 600
    with anonymous(url_server) as conn:
        answers = [put_token(conn, sign(sr, "bob", key, expiry), sr) for sr in resources]
        return answers, {stream: outcomes(conn, stream, "g") for stream in streams}


async def test_a_root_token_covers_what_its_signer_may_use(tenants: EventServer) -> None:
    await set_grants(tenants, "bob", ("read,write", "orders*"))
    key = await key_of(tenants, "bob")
    answers, found = await asyncio.to_thread(
        token_outcomes, tenants, key, ["sb://127.0.0.1/"], [ORDERS, PAYROLL, "nosuch"]
    )
    assert answers == [(200, "OK")]
    assert found == {ORDERS: ALLOWED, PAYROLL: refused(PAYROLL), "nosuch": refused("nosuch")}


async def test_a_stream_token_covers_that_stream_only(tenants: EventServer) -> None:
    """With every right, a token for ``orders`` opens nothing of payroll, nor of a name that
    only begins with ``orders``."""
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    answers, found = await asyncio.to_thread(
        token_outcomes, tenants, key, ["sb://127.0.0.1/orders"], [ORDERS, PAYROLL, "orders-eu"]
    )
    assert answers == [(200, "OK")]
    assert found[ORDERS] == ALLOWED
    for stream in (PAYROLL, "orders-eu"):
        assert kinds(found[stream]) == kinds(refused(stream))
        assert (
            found[stream]["send"][1] == f"no token put to $cbs on this connection covers '{stream}'"
        )
        assert found[stream]["$management READ"][1] == (
            f"no token put to $cbs on this connection covers '{stream}/$management'"
        )


async def test_a_token_for_a_partition_covers_that_partition_only(tenants: EventServer) -> None:
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    sr = "sb://127.0.0.1/orders/Partitions/1"

    def scenario() -> list[str]:
        with anonymous(tenants) as conn:
            assert put_token(conn, sign(sr, "bob", key, int(time.time()) + 600), sr)[0] == 200
            found = []
            for address in ("orders/Partitions/1", "orders/Partitions/0", "orders"):
                try:
                    send(conn, address, "")
                except LinkDetached as exc:
                    found.append(condition_of(exc.link)[0])
                else:
                    found.append("ok")
            return found

    assert await asyncio.to_thread(scenario) == ["ok", UNAUTHORIZED, UNAUTHORIZED]


@pytest.mark.parametrize("sr", ["sb://totally.elsewhere/x", "sb://totally.elsewhere/"])
async def test_a_token_for_another_host_is_refused(tenants: EventServer, sr: str) -> None:
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    answers, found = await asyncio.to_thread(token_outcomes, tenants, key, [sr], [ORDERS, "x"])
    assert answers == [
        (401, "the token's resource (sr) names host 'totally.elsewhere', not '127.0.0.1' that"
         " this connection reached")
    ]  # fmt: skip
    # the connection acts as nobody: even $management takes no link
    assert kinds(found[ORDERS]) == kinds(found["x"]) == dict.fromkeys(OPERATIONS, UNAUTHORIZED)


async def test_each_token_adds_its_scope(tenants: EventServer) -> None:
    """The SDKs put one token per audience on a connection: each adds what it covers."""
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    resources = ["sb://127.0.0.1/orders", "sb://127.0.0.1/payroll"]
    answers, found = await asyncio.to_thread(
        token_outcomes, tenants, key, resources, [ORDERS, PAYROLL, "nosuch"]
    )
    assert answers == [(200, "OK"), (200, "OK")]
    assert found[ORDERS] == found[PAYROLL] == ALLOWED
    assert kinds(found["nosuch"]) == kinds(refused("nosuch"))


async def test_an_expired_token_takes_its_scope_and_links_with_it(tenants: EventServer) -> None:
    """A link on orders, covered by a token that expires, is detached; the connection stays
    for payroll's token, which has not expired."""
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    orders, payroll = "sb://127.0.0.1/orders", "sb://127.0.0.1/payroll"

    def scenario() -> tuple[Outcome, list[str]]:
        with anonymous(tenants) as conn:
            now = int(time.time())
            assert put_token(conn, sign(orders, "bob", key, now + 3), orders)[0] == 200
            assert put_token(conn, sign(payroll, "bob", key, now + 600), payroll)[0] == 200
            receiver = conn.create_receiver(ORDERS, credit=10)
            with pytest.raises(LinkDetached) as detached:
                receiver.receive(timeout=60)  # nothing comes: the token expires meanwhile
            after = []
            for stream in (PAYROLL, ORDERS):
                try:
                    send(conn, stream, "")
                except LinkDetached as exc:
                    after.append(condition_of(exc.link)[0])
                else:
                    after.append("ok")
            return condition_of(detached.value.link), after

    detached, after = await asyncio.to_thread(scenario)
    assert detached == (
        UNAUTHORIZED,
        "the token put to $cbs for this link has expired and was not renewed",
    )
    assert after == ["ok", UNAUTHORIZED]


async def test_a_plain_login_is_not_scoped_by_a_token(tenants: EventServer) -> None:
    await set_grants(tenants, "bob", ("read,write", "*"))
    key = await key_of(tenants, "bob")
    url, sr = tenants.amqp_url or "", "sb://127.0.0.1/orders"

    def scenario() -> tuple[tuple[int, str], dict[str, Outcome]]:
        with connected(url, "bob") as conn:
            answer = put_token(conn, sign(sr, "bob", key, int(time.time()) + 600), sr)
            return answer, outcomes(conn, PAYROLL, "g")

    assert await asyncio.to_thread(scenario) == ((200, "OK"), ALLOWED)


# -- revocation ----------------------------------------------------------------------------------


def plain(url: str, user: str) -> BlockingConnection:
    """A connection of ``user`` logged in with SASL PLAIN (the caller closes it)."""
    return BlockingConnection(
        url, user=user, password=USERS[user], allowed_mechs="PLAIN", timeout=30
    )


def remote_condition(conn: BlockingConnection, link: Any) -> Outcome:
    """Once the server detached ``link``: its error."""
    while not link.state & Endpoint.REMOTE_CLOSED:
        with contextlib.suppress(LinkDetached):  # proton raises it for each link detached
            conn.wait(lambda: bool(link.state & Endpoint.REMOTE_CLOSED), timeout=30)
    link.close()  # so that proton does not raise it again
    return condition_of(link)


async def test_a_revoked_right_detaches_the_links_that_needed_it(tenants: EventServer) -> None:
    """Receivers (a stream, a group's partition, ``$events``) go with read, a sender with
    write; the sender stays while write stays."""
    url = tenants.amqp_url or ""
    await set_grants(tenants, "bob", ("read,write", "orders*"))
    conn = await asyncio.to_thread(plain, url, "bob")
    try:

        def open_links() -> list[Any]:
            receivers = [
                conn.create_receiver(address, credit=10)
                for address in (ORDERS, f"{ORDERS}/ConsumerGroups/g/Partitions/0", "$events/orders")
            ]
            sender = conn.create_sender(ORDERS)
            sender.send(Message(subject="BEFORE", body=1))
            assert receivers[0].receive(timeout=30).subject == "BEFORE"
            return [*receivers, sender]

        *receivers, sender = await asyncio.to_thread(open_links)
        await revoke(tenants.store, "bob", "read", "orders*")
        await tenants.access.changed_here()

        def after_read() -> list[tuple[str, str]]:
            detached = [remote_condition(conn, r.link) for r in receivers]
            sender.send(Message(subject="AFTER", body=2))  # write stays
            return detached

        detached = await asyncio.to_thread(after_read)
        assert detached == [(UNAUTHORIZED, READ_NEEDED.format(ORDERS))] * 3
        await revoke(tenants.store, "bob", "write", "orders*")
        await tenants.access.changed_here()
        assert await asyncio.to_thread(remote_condition, conn, sender.link) == (
            UNAUTHORIZED,
            WRITE_NEEDED.format(ORDERS),
        )
    finally:
        await asyncio.to_thread(conn.close)
    alice = await principal(tenants, "alice")
    stored = [
        e.type
        for events in partitions(tenants, ORDERS)
        for e in await events.read_after(alice, 0, 10)
    ]
    assert sorted(stored) == ["AFTER", "BEFORE"]


async def principal(server: EventServer, name: str) -> Principal:
    """The user ``name`` as the calls into log/ take it."""
    user = await server.store.get_user(name)
    assert user is not None
    return Principal(user.id, user.name, user.is_admin)


def partitions(server: EventServer, stream: str) -> list[EventLog]:
    logs = server.logs.partitions(stream)
    assert logs is not None
    return logs


async def test_a_right_lost_before_its_link_is_detached_is_refused_not_failed(
    tenants: EventServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What log/ refuses maps to ``amqp:unauthorized-access`` (a message rejected, a
    receiver detached), never to an internal error: here the links are not watched, as if
    the revoke came between the attach and its watch."""
    url = tenants.amqp_url or ""
    await set_grants(tenants, "bob", ("read,write", "orders"))
    monkeypatch.setattr(tenants.access, "watch", lambda *_args: lambda: None)
    conn = await asyncio.to_thread(plain, url, "bob")
    try:

        def open_links() -> tuple[Any, Any]:
            return conn.create_receiver(f"{ORDERS}/Partitions/0", credit=10), conn.create_sender(
                f"{ORDERS}/Partitions/0"
            )

        receiver, sender = await asyncio.to_thread(open_links)
        await set_grants(tenants, "bob")
        # alice appends: bob's receiver reads it, and log/ refuses it
        await partitions(tenants, ORDERS)[0].append(
            await principal(tenants, "alice"), [EventDraft("NEW", 1)]
        )

        def outcome() -> tuple[Outcome, Any]:
            detached = remote_condition(conn, receiver.link)
            with pytest.raises(SendException) as rejected:
                sender.send(Message(subject="T", body=1))
            return detached, rejected.value.state

        detached, state = await asyncio.to_thread(outcome)
        assert detached == (UNAUTHORIZED, READ_NEEDED.format(ORDERS))
        assert state == Delivery.REJECTED
    finally:
        await asyncio.to_thread(conn.close)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# -- the Event Hubs SDKs with a shared access policy ---------------------------------------------


async def add_policy(server: EventServer, db: Path, tmp_path: Path) -> str:
    """``futoin-evt sas policy add shop --stream 'orders*' --claims Send,Listen``: its key."""
    secret = tmp_path / "sas-secret"
    secret.write_bytes(SECRET + b"\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "futoin_evt", "sas", "policy", "add", "shop",
        "--stream", "orders*", "--claims", "Send,Listen", "--db", str(db),
        "--sas-secret", str(secret),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _err = await proc.communicate()
    assert proc.returncode == 0
    await server.access.reload()  # what another process granted
    return out.decode().strip()


def policy_string(server: EventServer, key: str, hub: str) -> str:
    assert server.amqp is not None
    return (
        f"Endpoint=sb://127.0.0.1:{server.amqp.port}/;SharedAccessKeyName=shop;"
        f"SharedAccessKey={key};EntityPath={hub};UseDevelopmentEmulator=true"
    )


@pytest.fixture
async def shop(
    start_server: ServerFactory, db_path: Path, tmp_path: Path
) -> tuple[EventServer, str]:
    """The server (SQLite), and the key of the policy ``shop`` (Send, Listen on orders*)."""
    server = await start_server(amqp=AmqpConfig(port=0, sas_secret=SECRET))
    await server.store.add_stream(ORDERS, 2)
    await server.store.add_stream(PAYROLL, 1)
    await server.streams.refresh()
    return server, await add_policy(server, db_path, tmp_path)


def sdk_produce(conn_str: str) -> dict[str, Any]:
    """Send 3 events with EventHubProducerClient; the hub's properties."""
    with EventHubProducerClient.from_connection_string(conn_str, retry_total=0) as producer:
        batch = producer.create_batch()
        for n in range(3):
            batch.add(EventData(f'{{"n": {n}}}'))
        producer.send_batch(batch)
        return producer.get_eventhub_properties()


def sdk_consume_error(conn_str: str) -> Exception:
    """The error EventHubConsumerClient.receive reports first."""
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$Default", retry_total=0
    )
    errors: list[Exception] = []

    def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)
        threading.Thread(target=client.close).start()

    with client:
        client.receive(on_event=lambda _context, _event: None, on_error=on_error)
    return errors[0]


async def test_the_python_sdk_with_a_policy(shop: tuple[EventServer, str]) -> None:
    """azure-eventhub with the policy's connection string: producer and consumer on orders;
    on payroll each gets the SDK's authorization error, and nothing is stored there."""
    server, key = shop
    properties = await asyncio.to_thread(sdk_produce, policy_string(server, key, ORDERS))
    assert properties["partition_ids"] == ["0", "1"]
    received = await asyncio.to_thread(
        receive_from, policy_string(server, key, ORDERS), 3, starting_position="-1"
    )
    assert sorted(event.body_as_json()["n"] for _partition, event in received) == [0, 1, 2]
    payroll = policy_string(server, key, PAYROLL)
    with pytest.raises(AuthenticationError, match="shop holds no right on stream payroll"):
        await asyncio.to_thread(sdk_produce, payroll)
    error = await asyncio.to_thread(sdk_consume_error, payroll)
    assert isinstance(error, AuthenticationError)
    assert "shop holds no right on stream payroll" in str(error)
    assert await partitions(server, PAYROLL)[0].newest_id() == 0


async def test_the_js_sdk_with_a_policy(shop: tuple[EventServer, str], js_peer: Path) -> None:
    """@azure/event-hubs with the policy's connection string: sends and receives on orders;
    on payroll it reports its authorization error, and nothing is stored there."""
    server, key = shop
    scenario = {"connectionString": policy_string(server, key, ORDERS), "count": 4}
    ids, received = await run_js(js_peer, "eventhubs_rights.js", scenario)
    assert ids == {"ids": ["0", "1"]}
    assert sorted(body["n"] for body in received["received"]) == [0, 1, 2, 3]
    scenario = {"connectionString": policy_string(server, key, PAYROLL), "count": 1}
    assert await run_js(js_peer, "eventhubs_rights.js", scenario) == [
        {
            "error": "MessagingError",
            "code": "UnauthorizedError",
            "message": "the token's user shop holds no right on stream payroll",
        }
    ]
    assert await partitions(server, PAYROLL)[0].newest_id() == 0
