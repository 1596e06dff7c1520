"""Rights per stream at the FTN3 doors (FTN18 gen/poll/push, the ops iface, notification, DCB
over FTN3), as two tenants meet them: alice and bob, no admin, on the streams ``orders`` (2
partitions), ``payroll`` and ``orders-ledger`` (1 each). Every call, for each way bob may
hold its right (by name, by the prefix ``orders*``, by ``*``) or not (no grant, a grant on
another stream), on SQLite and PostgreSQL; names that do not exist; a revoke ending push
streams and subscriptions; and grants made on one worker of ``serve --workers 2`` in use on
the other before the grant's answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.domain.partition import Partition
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.rights import Right, rights_text
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store
from futoin_evt.storage.base import Store

from .support.ftn3 import WITHIN, closed_with
from .support.servers import USERS, ServerFactory, add_user
from .support.workers import Group

pytestmark = pytest.mark.functional

READ, WRITE, MANAGE = Right.READ, Right.WRITE, Right.MANAGE
GEN: Final = "futoin.evt.gen:1.1"
POLL: Final = "futoin.evt.poll:1.1"
PUSH: Final = "futoin.evt.push:1.1"
OPS: Final = "futoinevt.ops:1.0"
DCB: Final = "futoin.evt.dcb:1.0"
RECEIVER: Final = "futoin.evt.receiver"
ROOT: Final = ("root", "root-pw")
BOB: Final = f"bob:{USERS['bob']}"
#: What alice adds to each stream before a test, and a DCB event for ``orders-ledger``.
SECRET: Final = "SALARY"
LEDGER_EVENT: Final = {"type": "Booked", "data": {"amount": 1}, "tags": ["account:a"]}


def refused(right: Right, stream: str) -> tuple[str, str]:
    return "SecurityError", f"the {rights_text(right)} right on stream {stream} is needed"


async def set_rights(server: EventServer, user: str, rights: Right, pattern: str | None) -> None:
    """``user``'s grants become ``rights`` on ``pattern`` (None: no grant at all), in use on
    return."""
    store = server.store
    found = await store.get_user(user)
    assert found is not None
    # granted first, then what goes is revoked: a running server takes in each change at once,
    # and must never see the user with none of the rights kept (that would end what they do)
    if pattern is not None:
        await store.grant(found.id, pattern, int(rights))
    for row in await store.list_grants():
        if row.user_id == found.id:
            going = row.rights if row.pattern != pattern else row.rights & ~int(rights)
            if going:
                await store.revoke(found.id, row.pattern, going)
    await server.access.changed_here()


async def add_streams(store: Store) -> None:
    await store.add_stream("orders", 2)
    await store.add_stream("payroll", 1)
    await store.add_stream("orders-ledger", 1)


@dataclass
class Tenants:
    """A server with the tenants' streams; alice may read and write everything, bob nothing."""

    server: EventServer
    clients: list[EventStreamClient]

    async def connect(self, path: str, credentials: str = BOB) -> EventStreamClient:
        client = await EventStreamClient.connect(self.server.url + path, credentials=credentials)
        self.clients.append(client)
        return client

    async def alice(self, path: str) -> EventStreamClient:
        return await self.connect(path, f"alice:{USERS['alice']}")

    async def root(self) -> EventStreamClient:
        return await self.connect("", ":".join(ROOT))

    def partition(self, stream: str, number: int) -> Partition:
        found = self.server.streams.partition(stream, number)
        assert found is not None
        return found

    async def user_id(self, name: str) -> Any:
        user = await self.server.store.get_user(name)
        assert user is not None
        return user.id


@pytest.fixture
async def tenants(start_server: ServerFactory, store_db: str) -> AsyncIterator[Tenants]:
    server = await start_server(db=store_db)
    await server.store.add_user(ROOT[0], hash_password(ROOT[1]), is_admin=True)
    await add_streams(server.store)
    await server.streams.refresh()
    await set_rights(server, "bob", Right.NONE, None)
    made = Tenants(server, [])
    for path in ("orders/0", "orders/1", "payroll"):
        await (await made.alice(path)).add_event(SECRET, {"owner": "alice", "path": path})
    ledger = await made.alice("orders-ledger")
    await ledger.ftn3.call(DCB, "append", {"events": [LEDGER_EVENT]})
    yield made
    for client in made.clients:
        await client.close()


# -- the matrix -------------------------------------------------------------------------------


Call = Callable[[Tenants, EventStreamClient], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    """One call by bob on ``stream`` from the path ``path``: ``call`` makes it and checks
    what it answers when allowed; ``grant`` is what bob is given for it, ``needs`` the right
    a refusal names."""

    name: str
    stream: str
    path: str
    grant: Right
    needs: Right
    call: Call


async def add_event(t: Tenants, bob: EventStreamClient) -> None:
    assert await bob.add_event("MINE", {"n": 1}) > 0


async def poll_live(t: Tenants, bob: EventStreamClient) -> None:
    assert SECRET in [e.type for e in await bob.poll_events("LIVE")]


async def poll_registered(t: Tenants, bob: EventStreamClient) -> None:
    log = t.server.store.partition_log(t.partition("orders", 1))
    await log.register_consumer(await t.user_id("bob"), "BOB")
    assert SECRET in [e.type for e in await bob.poll_events("BOB")]


async def ready_to_receive(t: Tenants, bob: EventStreamClient) -> None:
    received: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()

    async def on_events(params: dict[str, Any]) -> bool:
        received.put_nowait(params["events"])
        return True

    bob.ftn3.on_request(RECEIVER, "onEvents", on_events)
    assert await bob.ftn3.call(PUSH, "readyToReceive", {"component": "LIVE"}) is True
    added = await (await t.alice("orders/1")).add_event("NEW", {})
    async with asyncio.timeout(WITHIN):
        while str(added) not in [e["id"] for e in await received.get()]:
            pass


async def register_consumer(t: Tenants, bob: EventStreamClient) -> None:
    assert await bob.register_consumer("B") is True


async def others_consumers(t: Tenants, bob: EventStreamClient) -> None:
    alice = await t.alice("orders/1")
    await alice.register_consumer("ALICE")
    await alice.poll_events("ALICE", last_id=1)  # her position: 1
    consumers = await bob.ftn3.call(OPS, "listConsumers", {})
    assert [(c["user"], c["component"], c["position"]) for c in consumers] == [
        ("alice", "ALICE", "1")
    ]
    info = await bob.ftn3.call(OPS, "streamInfo", {})
    assert info["held_back_by"] == {"user": "alice", "component": "ALICE"}
    assert info["discard_up_to"] == "1"


async def subscribe(t: Tenants, bob: EventStreamClient) -> None:
    subscribed = await Notifications(bob.ftn3).subscribe(stream="orders", after=[0, 0])
    async with asyncio.timeout(WITHIN):
        message = await subscribed.get()
    assert message["properties"]["eventType"] == SECRET


async def get_events(t: Tenants, bob: EventStreamClient) -> None:
    assert SECRET in await Notifications(bob.ftn3).event_types(stream="orders")


async def dcb_read(t: Tenants, bob: EventStreamClient) -> None:
    read = await bob.ftn3.call(DCB, "read", {"query": {"items": [{"types": ["Booked"]}]}})
    assert [e["type"] for e in read["events"]] == ["Booked"]


async def dcb_append(t: Tenants, bob: EventStreamClient) -> None:
    assert await bob.ftn3.call(DCB, "append", {"events": [LEDGER_EVENT]}) > 1


async def add_stream(t: Tenants, bob: EventStreamClient) -> None:
    added = await bob.ftn3.call(OPS, "addStream", {"name": "orders-new", "partitions": 1})
    assert added["name"] == "orders-new"
    assert await t.server.store.drop_stream("orders-new")  # for the next mode
    await t.server.streams.refresh()


async def grow_stream(t: Tenants, bob: EventStreamClient) -> None:
    info = t.server.streams.get("orders")
    assert info is not None
    count = len(info.partitions) + 1
    grown = await bob.ftn3.call(OPS, "growStream", {"name": "orders", "partitions": count})
    assert grown["partitions"] == count


async def drop_stream(t: Tenants, bob: EventStreamClient) -> None:
    assert await bob.ftn3.call(OPS, "dropStream", {"name": "orders-ledger"}) is True
    await t.server.store.add_stream("orders-ledger", 1)
    await t.server.streams.refresh()


CASES: Final = [
    Case("addEvent", "orders", "orders/1", WRITE, WRITE, add_event),
    Case("pollEvents LIVE", "orders", "orders/1", READ, READ, poll_live),
    Case("pollEvents registered", "orders", "orders/1", READ, READ, poll_registered),
    Case("readyToReceive", "orders", "orders/1", READ, READ, ready_to_receive),
    Case("registerConsumer", "orders", "orders/1", READ, READ, register_consumer),
    Case("others' consumers", "orders", "orders/1", READ | MANAGE, READ, others_consumers),
    Case("subscribe", "orders", "", READ, READ, subscribe),
    Case("getEvents", "orders", "", READ, READ, get_events),
    Case("DCB read", "orders-ledger", "orders-ledger", READ, READ, dcb_read),
    Case("DCB append", "orders-ledger", "orders-ledger", WRITE, WRITE, dcb_append),
    Case("addStream", "orders-new", "", MANAGE, MANAGE, add_stream),
    Case("growStream", "orders", "", MANAGE, MANAGE, grow_stream),
    Case("dropStream", "orders-ledger", "", MANAGE, MANAGE, drop_stream),
]
#: How bob may hold the right: (mode, the pattern for the case's stream, allowed).
MODES: Final[list[tuple[str, Callable[[str], str | None], bool]]] = [
    ("by name", lambda stream: stream, True),
    ("by prefix", lambda _stream: "orders*", True),
    ("by *", lambda _stream: "*", True),
    ("not granted", lambda _stream: None, False),
    ("another stream", lambda _stream: "payroll", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_each_call_needs_its_right_on_its_stream(tenants: Tenants, case: Case) -> None:
    for mode, pattern, allowed in MODES:
        await set_rights(tenants.server, "bob", case.grant, pattern(case.stream))
        bob = await tenants.connect(case.path)
        if allowed:
            await case.call(tenants, bob)
        else:
            with pytest.raises(RemoteError) as refusal:
                await case.call(tenants, bob)
            answer = (refusal.value.name, refusal.value.desc)
            assert answer == refused(case.needs, case.stream), mode
        await bob.close()
    # what bob was refused left nothing behind: payroll has only alice's event
    payroll = tenants.server.store.partition_log(tenants.partition("payroll", 0))
    assert [row[1] for row in await payroll.read_rows(0, limit=10)] == [SECRET]


async def test_names_without_a_right_are_refused_alike_whether_they_exist_or_not(
    tenants: Tenants,
) -> None:
    """No probing: on ``payroll`` (it exists) and ``nowhere`` (it does not), at any partition,
    each call is refused with the same sentence; given a right on ``nowhere``, bob learns
    that there is no such stream, and on ``payroll`` that it has no partition 3."""
    calls: list[tuple[str, str, dict[str, Any], Right]] = [
        (GEN, "addEvent", {"type": "E", "data": 1}, WRITE),
        (POLL, "pollEvents", {"component": "LIVE"}, READ),
        (POLL, "registerConsumer", {"component": "B"}, READ),
        (PUSH, "readyToReceive", {"component": "LIVE"}, READ),
        (OPS, "streamInfo", {}, READ),
        (OPS, "listConsumers", {}, READ),
        (OPS, "dropConsumer", {"user": "alice", "component": "A"}, READ),
        (OPS, "seekConsumer", {"component": "B", "ts": "2000-01-01T00:00:00Z"}, READ),
        (DCB, "read", {"query": {"items": [{"types": ["Booked"]}]}}, READ),
        (DCB, "append", {"events": [LEDGER_EVENT]}, WRITE),
    ]

    async def answers(path: str) -> list[tuple[str, str]]:
        client = await tenants.connect(path)
        found = []
        for iface, func, params, _right in calls:
            with pytest.raises(RemoteError) as refusal:
                await client.ftn3.call(iface, func, params)
            found.append((refusal.value.name, refusal.value.desc))
        return found

    for name in ("payroll", "nowhere"):
        expected = [refused(right, name) for *_call, right in calls]
        for path in (name, f"{name}/0", f"{name}/3"):
            assert await answers(path) == expected, path
    await set_rights(tenants.server, "bob", READ, "nowhere")
    assert await answers("nowhere/0") == [("InvalidRequest", "There is no stream nowhere.")] * 10
    await set_rights(tenants.server, "bob", WRITE, "payroll")
    told = ("InvalidRequest", "The stream payroll has partitions 0 to 0, not 3.")
    assert await answers("payroll/3") == [told] * 10
    for path in ("nowhere", "payroll"):
        client = await tenants.connect(path)
        notifications = Notifications(client.ftn3)
        for call in (notifications.subscribe(stream=path), notifications.event_types(stream=path)):
            with pytest.raises(RemoteError) as refusal:
                await call
            assert (refusal.value.name, refusal.value.desc) == refused(READ, path)


async def test_reading_shows_only_the_readers_own_consumers_and_manage_everyones(
    tenants: Tenants,
) -> None:
    """With read, bob sees and acts on his consumers only: alice's, her position (also as
    ``discard_up_to``) and her holding back discarding stay hidden; with manage as well, he
    sees them and may drop hers."""
    alice = await tenants.alice("orders/1")
    for n in range(2):  # ids 2 and 3: positions move only over what was given
        await alice.add_event("ENTRY", {"n": n})
    await alice.register_consumer("ALICE")
    await alice.poll_events("ALICE", last_id=1)
    await set_rights(tenants.server, "bob", READ, "orders*")
    bob = await tenants.connect("orders/1")
    assert await bob.register_consumer("BOB")
    await bob.poll_events("BOB", last_id=2)
    info = await bob.ftn3.call(OPS, "streamInfo", {})
    assert "held_back_by" not in info
    assert "discard_up_to" not in info
    assert [c["user"] for c in await bob.ftn3.call(OPS, "listConsumers", {})] == ["bob"]
    described = await bob.ftn3.call(OPS, "describeStream", {"name": "orders"})
    assert [c["user"] for p in described["partitions"] for c in p["consumers"]] == ["bob"]
    with pytest.raises(RemoteError, match="No such consumer"):
        await bob.ftn3.call(OPS, "dropConsumer", {"user": "alice", "component": "ALICE"})
    # alice catches up: the lowest consumer is bob's own, which he may be told of
    await alice.poll_events("ALICE", last_id=3)
    info = await bob.ftn3.call(OPS, "streamInfo", {})
    assert (info["held_back_by"], info["discard_up_to"]) == (
        {"user": "bob", "component": "BOB"}, "2"
    )  # fmt: skip
    await set_rights(tenants.server, "bob", READ | MANAGE, "orders")
    users = [c["user"] for c in await bob.ftn3.call(OPS, "listConsumers", {})]
    assert sorted(users) == ["alice", "bob"]
    drop = {"user": "alice", "component": "ALICE"}
    assert await bob.ftn3.call(OPS, "dropConsumer", drop) is True


async def test_streams_are_listed_to_those_with_a_right_on_them(tenants: Tenants) -> None:
    bob = await tenants.connect("")

    async def listed() -> list[str]:
        return [s["name"] for s in await bob.ftn3.call(OPS, "listStreams", {})]

    assert await listed() == []
    await set_rights(tenants.server, "bob", WRITE, "orders*")
    assert await listed() == ["orders", "orders-ledger"]
    with pytest.raises(RemoteError) as refusal:
        await bob.ftn3.call(OPS, "describeStream", {"name": "orders"})
    assert (refusal.value.name, refusal.value.desc) == refused(READ, "orders")
    await set_rights(tenants.server, "bob", READ, "*")
    assert await listed() == ["events", "orders", "orders-ledger", "payroll"]
    with pytest.raises(RemoteError, match="no stream nowhere"):
        await bob.ftn3.call(OPS, "describeStream", {"name": "nowhere"})


# -- a revoke ends what depended on the right ----------------------------------------------------


async def test_a_revoke_ends_push_streams_and_subscriptions_with_the_refusal(
    tenants: Tenants,
) -> None:
    await set_rights(tenants.server, "bob", READ, "orders*")
    pushed = await tenants.connect("orders/1")
    await pushed.register_consumer("BOB", iface=PUSH)
    received: list[str] = []

    async def on_events(params: dict[str, Any]) -> bool:
        received.extend(e["type"] for e in params["events"])
        return True

    pushed.ftn3.on_request(RECEIVER, "onEvents", on_events)
    assert await pushed.ftn3.call(PUSH, "readyToReceive", {"component": "BOB"}) is True
    listening = await tenants.connect("")
    subscribed = await Notifications(listening.ftn3).subscribe(stream="orders", after=[0, 0])
    async with asyncio.timeout(WITHIN):
        assert (await subscribed.get())["properties"]["eventType"] == SECRET
    elsewhere = await tenants.connect("payroll")  # no right there is lost: stays open
    root = await tenants.root()
    revoke = {"user": "bob", "rights": "read", "pattern": "orders*"}
    assert await root.ftn3.call(OPS, "revokeRights", revoke) is True
    sentence = refused(READ, "orders")[1]
    assert await closed_with(pushed.ftn3) == (1008, sentence)
    assert await closed_with(listening.ftn3) == (1008, sentence)
    assert tenants.server.push.all_streams == []
    assert tenants.server.notify.connections == 0
    assert await elsewhere.ping(4) == 4
    assert SECRET in received
    again = await tenants.connect("orders/1")
    with pytest.raises(RemoteError) as refusal:
        await again.ftn3.call(PUSH, "readyToReceive", {"component": "BOB"})
    assert (refusal.value.name, refusal.value.desc) == refused(READ, "orders")


async def test_a_grant_that_stays_ends_nothing(tenants: Tenants) -> None:
    """Changing other grants (a right on another stream, another user's) leaves a stream
    that still has its right running."""
    await set_rights(tenants.server, "bob", READ, "orders")
    listening = await tenants.connect("")
    subscribed = await Notifications(listening.ftn3).subscribe(stream="orders")
    root = await tenants.root()
    grant = {"user": "bob", "rights": "write", "pattern": "payroll"}
    assert await root.ftn3.call(OPS, "grantRights", grant) is True
    take = {"user": "alice", "rights": "read", "pattern": "*"}
    assert await root.ftn3.call(OPS, "revokeRights", take) is True
    added = await (await tenants.alice("orders/0")).add_event("LATER", {})
    async with asyncio.timeout(WITHIN):
        message = await subscribed.get()
    assert (message["properties"]["eventType"], message["properties"]["id"]) == ("LATER", added)


# -- notification --------------------------------------------------------------------------------


async def test_management_events_only_about_streams_the_subscriber_may_read(
    tenants: Tenants,
) -> None:
    """bob, reading ``orders``, hears of his own consumers there; not of his consumer on
    ``payroll`` once he may not read it, nor of alice's; with manage on ``orders``, of
    alice's there too."""
    server = tenants.server
    bob_id = await tenants.user_id("bob")
    payroll = server.logs.partition(tenants.partition("payroll", 0))
    orders = server.logs.partition(tenants.partition("orders", 0))
    root = await server.store.get_user(ROOT[0])
    assert root is not None
    who = Principal(root.id, root.name, is_admin=True)
    await server.store.partition_log(payroll.partition).register_consumer(bob_id, "OLD")
    await set_rights(server, "bob", READ, "orders")
    listening = await tenants.connect("")
    selector = "eventType LIKE 'org.futoin.evt.consumer%'"
    subscribed = await Notifications(listening.ftn3).subscribe(selector, stream="orders")
    await payroll.consumers.drop(who, "bob", "OLD", reason="payroll is alice's")
    alice = await tenants.alice("orders/0")
    await alice.register_consumer("ALICE")  # about alice, on orders
    bob = await tenants.connect("orders/0")
    await bob.register_consumer("MINE")  # about bob, on orders: the first he hears of
    async with asyncio.timeout(WITHIN):
        first = await subscribed.get()
    assert (first["properties"]["user"], first["properties"]["component"]) == ("bob", "MINE")
    await set_rights(server, "bob", READ | MANAGE, "orders")
    await orders.consumers.drop(who, "alice", "ALICE", reason="by root")
    async with asyncio.timeout(WITHIN):
        second = await subscribed.get()
    assert (second["subject"], second["properties"]["user"]) == (
        "org.futoin.evt.consumerDropped", "alice"
    )  # fmt: skip
    assert subscribed.empty()


async def test_a_selector_matches_only_in_the_stream_subscribed_to(tenants: Tenants) -> None:
    """The same selector, subscribed to on ``orders`` by bob and on ``payroll`` by alice at
    once, gives each the matches of their own stream, from every partition; bob may not
    subscribe to it on ``payroll``."""
    await set_rights(tenants.server, "bob", READ, "orders")
    selector = "owner = 'alice'"
    bob = await tenants.connect("")
    mine = await Notifications(bob.ftn3).subscribe(selector, stream="orders", after=[0, 0])
    alice = await tenants.alice("")
    hers = await Notifications(alice.ftn3).subscribe(selector, stream="payroll", after=[0])
    for path in ("payroll", "orders/1", "orders/0"):
        await (await tenants.alice(path)).add_event("LATER", {"owner": "alice", "path": path})
    paths: dict[str, list[str]] = {"bob": [], "alice": []}
    async with asyncio.timeout(WITHIN):
        while len(paths["bob"]) < 4:
            paths["bob"].append((await mine.get())["properties"]["path"])
        while len(paths["alice"]) < 2:
            paths["alice"].append((await hers.get())["properties"]["path"])
    assert sorted(paths["bob"]) == ["orders/0", "orders/0", "orders/1", "orders/1"]
    assert paths["alice"] == ["payroll", "payroll"]
    assert mine.empty()
    with pytest.raises(RemoteError) as refusal:
        await Notifications(bob.ftn3).subscribe(selector, stream="payroll", after=[0])
    assert (refusal.value.name, refusal.value.desc) == refused(READ, "payroll")


# -- two workers ---------------------------------------------------------------------------------


@pytest.fixture
async def group_db(tmp_path: Path, password_hashes: dict[str, str]) -> str:
    db = str(tmp_path / "events.sqlite")
    async with await open_store(db) as store:
        await store.add_user(ROOT[0], hash_password(ROOT[1]), is_admin=True)
        await store.add_user("bob", password_hashes["bob"])
        await add_user(store, "alice", password_hashes["alice"])
        await add_streams(store)
    return db


async def connect_to(group: Group, slot: int, credentials: str, path: str = "") -> FTN3Client:
    """A connection the kernel gave worker ``slot`` (others are closed until one is)."""
    for _ in range(200):
        client = await FTN3Client.connect(group.url + path, credentials=credentials)
        if await group.worker_of(client) == slot:
            return client
        await client.close()
    raise AssertionError(f"no connection reached worker {slot}")


async def test_grants_are_in_use_on_every_worker_when_the_answer_comes(group_db: str) -> None:
    """``serve --workers 2``: a grant made through worker 0 is in use on worker 1 as soon as
    it is answered, and a revoke too (which ends bob's push stream on worker 1)."""
    group = Group(group_db, workers=2)
    try:
        root = await connect_to(group, 0, ":".join(ROOT))
        bob = await connect_to(group, 1, BOB, "orders/1")
        add = {"type": "E", "data": {}}
        with pytest.raises(RemoteError) as refusal:
            await bob.call(GEN, "addEvent", add)
        assert (refusal.value.name, refusal.value.desc) == refused(WRITE, "orders")
        grant = {"user": "bob", "rights": "read,write", "pattern": "orders*"}
        assert await root.call(OPS, "grantRights", grant) is True
        assert int(await bob.call(GEN, "addEvent", add)) == 1
        assert await bob.call(PUSH, "readyToReceive", {"component": "LIVE"}) is True
        watching = await connect_to(group, 1, BOB, "orders/0")
        revoke = {"user": "bob", "rights": "write", "pattern": "orders*"}
        assert await root.call(OPS, "revokeRights", revoke) is True
        with pytest.raises(RemoteError) as refusal:
            await watching.call(GEN, "addEvent", add)
        assert (refusal.value.name, refusal.value.desc) == refused(WRITE, "orders")
        assert await root.call(OPS, "revokeRights", {**revoke, "rights": "read"}) is True
        assert await closed_with(bob) == (1008, refused(READ, "orders")[1])
        for client in (root, watching):
            await client.close()
    finally:
        assert group.stop() == 0
