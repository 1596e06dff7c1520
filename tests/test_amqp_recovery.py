"""Link recovery (AMQP 1.0 2.6.13, 3.5.5): a durable consumer link that ends without being
closed leaves its terminus, and a link of the same name resumes it by the unsettled maps,
after a restart of the server, on another worker, on another server on the same PostgreSQL
database. Raw frames on real sockets (the peer's unsettled map is what python-qpid-proton
does not send) and python-qpid-proton, to servers on a real SQLite file or PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from proton import Described, Terminus, symbol, uint, ulong
from proton.reactor import Container, LinkOption
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.amqp.resume import KeptTerminus, Termini, TerminusKey
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.stream import UserId
from futoin_evt.log.termini import LinkTermini
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store
from futoin_evt.storage.base import Store

from .support.amqp_wire import (
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    OPEN,
    SASL_OUTCOME,
    SOURCE,
    TARGET,
    TRANSFER,
    Frame,
    Peer,
    begin,
    flow,
    frame,
    logged_in,
    login,
)
from .support.servers import USERS, ServerFactory, ServerProcess
from .support.sql import execute_sql
from .support.waiting import until
from .support.workers import amqp_port, on_worker, prepare

pytestmark = pytest.mark.functional

ACCEPTED = Described(ulong(0x24), [])
REJECTED = Described(ulong(0x25), [None])
RELEASED = Described(ulong(0x26), [])
GROUP = symbol("event-streams-consumer-group")
ALICE = f"alice:{USERS['alice']}"


@pytest.fixture
async def server(start_server: ServerFactory) -> EventServer:
    return await start_server(amqp=AmqpConfig(port=0))


@pytest.fixture(autouse=True)
async def _peers_closed(start_server: ServerFactory) -> Any:
    """Closes the raw peers before the servers (set up after their factory, so torn down
    before it): a server closing under a connected peer waits out its linger time."""
    yield
    await Peer.close_all()


def termini(server: EventServer) -> Termini:
    assert server.amqp is not None
    return server.amqp.node.termini


async def kept(server: EventServer) -> int:
    """The termini kept and not expired, once the server's writes of them are done."""
    return await termini(server).count()


async def kept_is(server: EventServer, count: int) -> bool:
    return await kept(server) == count


def kept_names(server: EventServer) -> set[str]:
    """The link names of the termini in the database."""
    return {
        str(row[0]) for row in execute_sql(str(server.db), "SELECT link_name FROM amqp_termini")
    }


async def connect(server: EventServer, container: str = "recovering", user: str = "alice") -> Peer:
    assert server.amqp is not None
    return await connect_port(server.amqp.port, container, user)


async def connect_port(port: int, container: str = "recovering", user: str = "alice") -> Peer:
    """A peer logged in as ``user``, with the connection open as ``container``."""
    peer = await Peer.connect(port)
    plain = b"\0" + user.encode() + b"\0" + USERS[user].encode()
    await peer.send(login(plain) + frame(OPEN, [container]) + begin())
    outcome = await peer.until(SASL_OUTCOME)
    assert outcome.fields[0] == 0, outcome
    await peer.until(BEGIN)
    return peer


def attach(
    name: str,
    handle: int = 0,
    *,
    durable: int = 2,
    expiry: str | None = "connection-close",
    timeout: int = 60,
    unsettled: Any = None,
    group: str | None = None,
    address: str = "events",
) -> bytes:
    """A receiving link (the server sends) from a source asking for that durability."""
    policy = symbol(expiry) if expiry is not None else None
    source = Described(ulong(SOURCE), [address, uint(durable), policy, uint(timeout)])
    target = Described(ulong(TARGET), [])
    properties = {GROUP: group} if group is not None else None
    return frame(ATTACH, [name, uint(handle), True, None, None, source, target, unsettled,
                          False, None, None, None, None, properties])  # fmt: skip


def accept(first: int, last: int, state: Any = ACCEPTED) -> bytes:
    return frame(DISPOSITION, [True, uint(first), uint(last), True, state])


async def answer(peer: Peer, name: str) -> Frame:
    """The server's attach of link ``name``."""
    while True:
        received = await peer.until(ATTACH)
        if received.fields[0] == name:
            return received


async def transfers(peer: Peer, count: int) -> list[Frame]:
    return [await peer.until(TRANSFER) for _ in range(count)]


def tags(frames: list[Frame]) -> list[int]:
    return [int(f.fields[2]) for f in frames]


def state_of(transfer: Frame) -> int | None:
    state = transfer.fields[7] if len(transfer.fields) > 7 else None
    return int(state.descriptor) if state is not None else None


def resumed(transfer: Frame) -> bool:
    return len(transfer.fields) > 8 and bool(transfer.fields[8])


def granted(attach_frame: Frame) -> tuple[int, str, int]:
    fields: Any = attach_frame.fields[5].value
    return int(fields[1]), str(fields[2]), int(fields[3])


def their_unsettled(attach_frame: Frame) -> dict[bytes, Any] | None:
    value = attach_frame.fields[7] if len(attach_frame.fields) > 7 else None
    return dict(value) if value is not None else None


async def add(client: EventStreamClient, *values: int) -> list[int]:
    return [await client.add_event("T", value) for value in values]


async def dropped(server: EventServer, peer: Peer) -> None:
    """Cut the TCP connection (no detach, no close) and wait until the server has seen it."""
    peer.writer.transport.abort()
    await peer.close()
    assert server.amqp is not None
    listener = server.amqp
    await until(lambda: len(listener.slots) == 0, "the server saw the connection go")


async def test_a_dropped_link_resumes_by_the_peer_map_and_moves_the_group_position(
    server: EventServer, alice: EventStreamClient
) -> None:
    ids = await add(alice, 1, 2, 3, 4, 5, 6)
    peer = await connect(server)
    await peer.send(attach("orders", group="ftn18:billing") + flow(0, 6))
    assert granted(await answer(peer, "orders")) == (2, "connection-close", 60)
    sent = await transfers(peer, 6)
    assert tags(sent) == ids
    # the first is accepted before the drop: the group's position moves over it
    await peer.send(accept(int(sent[0].fields[1]), int(sent[0].fields[1])))
    user = await server.store.get_user("alice")
    assert user is not None

    def stored(up_to: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await server.store.position(user.id, "billing") == up_to

        return check

    await until(stored(ids[0]), "the position after the first")
    await dropped(server, peer)
    assert await kept(server) == 1

    # the peer got 2..6; it accepted 2 and 3 (not yet told), holds 4 with no state, released
    # 6, never got 5; and it still remembers a tag the server settled long ago
    tag = [b"%d" % i for i in ids]
    peer_map = {tag[1]: ACCEPTED, tag[2]: REJECTED, tag[3]: None, tag[5]: RELEASED}
    peer_map[b"999999"] = ACCEPTED
    again = await connect(server)
    await again.send(attach("orders", group="ftn18:billing", unsettled=peer_map) + flow(0, 20))
    ours = their_unsettled(await answer(again, "orders"))
    assert ours == dict.fromkeys(tag[1:], None)
    assert await kept(server) == 0
    first = await transfers(again, 6)
    assert [(int(t.fields[2]), resumed(t), state_of(t), bool(t.fields[4])) for t in first] == [
        (ids[1], True, 0x24, True),  # accepted: settled, no payload
        (ids[2], True, 0x25, True),  # rejected: the same
        (ids[3], True, None, False),  # no state: resumed whole
        (ids[4], False, None, False),  # unknown to the peer: a new delivery
        (ids[5], True, 0x26, True),  # released: settled, and ...
        (ids[5], False, None, False),  # ... sent again
    ]
    assert [t.payload == b"" for t in first] == [True, True, False, False, True, False]
    # then the events after the newest sent before: none twice, none skipped
    more = await add(alice, 7, 8)
    after = await transfers(again, 2)
    assert tags(after) == more
    # the position stands after the accepted prefix (1, 2, 3) until the rest is accepted
    await until(stored(ids[2]), "the position after the accepted prefix")
    ids_settled = [int(t.fields[1]) for t in [first[2], first[3], first[5], *after]]
    for delivery_id in ids_settled:
        await again.send(accept(delivery_id, delivery_id))
    await until(stored(more[-1]), "the position after the last")


async def test_a_closing_detach_or_no_durability_forgets_the_terminus(
    server: EventServer, alice: EventStreamClient
) -> None:
    peer = await connect(server)
    await peer.send(attach("closed", 0, expiry="session-end") + flow(0, 5))
    await answer(peer, "closed")
    ids = await add(alice, 1, 2)
    await transfers(peer, 2)
    await peer.send(frame(DETACH, [uint(0), True]))
    await peer.until(DETACH)
    assert await kept(server) == 0
    # suspended (closed=false) in a live session: kept until the session ends
    await peer.send(attach("suspended", 1, expiry="session-end") + flow(1, 5))
    await answer(peer, "suspended")
    more = await add(alice, 3)
    await transfers(peer, 1)
    await peer.send(frame(DETACH, [uint(1), False]))
    await peer.until(DETACH)
    assert await kept(server) == 1
    await peer.send(attach("suspended", 1, expiry="session-end") + flow(1, 5))
    assert their_unsettled(await answer(peer, "suspended")) == {b"%d" % more[0]: None}
    assert tags(await transfers(peer, 1)) == more  # no map from the peer: sent again
    # re-attached as the first one after its closing detach: it starts afresh
    await peer.send(attach("closed", 0, expiry="session-end") + flow(0, 5))
    assert their_unsettled(await answer(peer, "closed")) is None
    # not durable: nothing is kept, and the attach says so
    await peer.send(attach("plain", 2, durable=0) + flow(2, 5))
    assert granted(await answer(peer, "plain"))[0] == 0
    newest = await add(alice, 4)
    for _ in range(3):  # on every link still attached
        assert tags(await transfers(peer, 1)) == newest
    await dropped(server, peer)
    assert await kept(server) == 2
    assert kept_names(server) == {"suspended", "closed"}
    assert len(ids) == 2


async def test_a_detach_sent_with_the_end_is_answered_before_it_once_the_position_is_stored(
    server: EventServer, alice: EventStreamClient
) -> None:
    """A client closing a link and its session at once (rhea does) waits for both answers."""
    ids = await add(alice, 1, 2)
    peer = await connect(server)
    await peer.send(attach("closing", group="ftn18:billing") + flow(0, 5))
    handle = int((await answer(peer, "closing")).fields[1])
    sent = await transfers(peer, 2)
    first, last = int(sent[0].fields[1]), int(sent[1].fields[1])
    await peer.send(accept(first, last) + frame(DETACH, [uint(0), True]) + frame(END, []))
    await peer.until(END)
    answers = [f for f in peer.frames if f.descriptor in (DETACH, END)]
    assert [f.descriptor for f in answers] == [DETACH, END]
    assert answers[0].fields[:2] == [handle, True]
    assert answers[1].condition() is None
    user = await server.store.get_user("alice")
    assert user is not None
    # the detach is answered once the accepted events are stored as the position
    assert await server.store.position(user.id, "billing") == ids[-1]
    await peer.send(frame(CLOSE, []))
    await peer.until(CLOSE)
    await peer.close()


async def test_another_user_or_container_starts_afresh(
    server: EventServer, alice: EventStreamClient
) -> None:
    peer = await connect(server, container="mine")
    await peer.send(attach("link") + flow(0, 5))
    await answer(peer, "link")
    ids = await add(alice, 1)
    await transfers(peer, 1)
    await dropped(server, peer)
    taken = {b"%d" % ids[0]: None}
    bob = await connect(server, container="mine", user="bob")
    await bob.send(attach("link", unsettled=taken) + flow(0, 5))
    assert their_unsettled(await answer(bob, "link")) is None
    other = await connect(server, container="theirs")
    await other.send(attach("link", unsettled=taken) + flow(0, 5))
    assert their_unsettled(await answer(other, "link")) is None
    # another address under the same name: the kept terminus is dropped
    mine = await connect(server, container="mine")
    await mine.send(attach("link", address="events/ConsumerGroups/g") + flow(0, 5))
    assert their_unsettled(await answer(mine, "link")) is None
    assert await kept(server) == 0


async def test_a_terminus_expires_after_its_timeout(
    server: EventServer, alice: EventStreamClient
) -> None:
    peer = await connect(server)
    await peer.send(attach("brief", timeout=0) + attach("capped", 1, timeout=86400))
    await peer.send(flow(0, 5) + flow(1, 5))
    assert granted(await answer(peer, "brief")) == (2, "connection-close", 0)
    assert granted(await answer(peer, "capped")) == (2, "connection-close", 300)
    await add(alice, 1)
    await transfers(peer, 2)
    await dropped(server, peer)
    assert await kept(server) == 1  # the one granted 0 s expired
    again = await connect(server)
    await again.send(attach("brief") + flow(0, 5))
    assert their_unsettled(await answer(again, "brief")) is None


async def test_malformed_peer_maps_get_an_error_and_the_server_stays_up(
    server: EventServer, alice: EventStreamClient
) -> None:
    peer = await connect(server)
    await peer.send(attach("keys", 0, unsettled={"1": None}))
    refused = await peer.until(DETACH)
    assert refused.condition() == "amqp:invalid-field"
    await peer.send(attach("states", 1, unsettled={b"1": "accepted"}))
    assert (await peer.until(DETACH)).condition() == "amqp:invalid-field"
    huge = {i.to_bytes(2, "big"): None for i in range(12_000)}
    await peer.send(attach("huge", 2, unsettled=huge))
    assert (await peer.until(DETACH)).condition() == "amqp:invalid-field"
    await peer.send(attach("list", 3, unsettled=[b"1"]))
    closed = await peer.until(CLOSE)
    assert closed.condition() == "amqp:invalid-field"
    # the server serves the next peer
    fine = await connect(server)
    await fine.send(attach("fine") + flow(0, 1))
    await answer(fine, "fine")
    ids = await add(alice, 1)
    assert tags(await transfers(fine, 1)) == ids


class DurableSource(LinkOption):
    """python-qpid-proton's terminus settings: durable deliveries, kept past the connection."""

    def apply(self, link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_WITH_CONNECTION
        link.source.timeout = 60


def proton_connection(url: str) -> BlockingConnection:
    container = Container()
    container.container_id = "proton-peer"
    return BlockingConnection(
        url,
        container=container,
        user="alice",
        password=USERS["alice"],
        allowed_mechs="PLAIN",
        timeout=30,
    )


def proton_first(url: str, add_three: Callable[[], object]) -> tuple[list[Any], tuple[Any, ...]]:
    """A durable link named ``durable`` with credit 3: ``add_three`` adds three events (a
    link with no filter reads those added from its attach on); the first is accepted, the
    others are not, and the connection closes with no detach (the link is suspended with
    it). The bodies received, and the terminus granted."""
    conn = proton_connection(url)
    receiver = conn.create_receiver("events", name="durable", credit=3, options=DurableSource())
    add_three()
    source = receiver.link.remote_source
    terms = (source.durability, source.expiry_policy, source.timeout)
    bodies = [receiver.receive().body]
    receiver.accept()
    bodies += [receiver.receive().body for _ in range(2)]
    conn.close()
    return bodies, terms


def proton_again(url: str, count: int) -> list[Any]:
    """The link ``durable`` attached again: the first ``count`` bodies it receives."""
    conn = proton_connection(url)
    receiver = conn.create_receiver("events", name="durable", credit=5, options=DurableSource())
    again = [receiver.receive().body for _ in range(count)]
    conn.close()
    return again


async def test_a_proton_client_gets_its_unsettled_events_again_by_the_link_name(
    server: EventServer, alice: EventStreamClient
) -> None:
    """proton sets the terminus durability and expiry and re-attaches by name, but sends no
    unsettled map: what it had not settled comes again as new deliveries, then what follows."""
    url = server.amqp_url or ""
    loop = asyncio.get_running_loop()

    def add_three() -> object:
        return asyncio.run_coroutine_threadsafe(add(alice, 1, 2, 3), loop).result()

    bodies, terms = await asyncio.to_thread(proton_first, url, add_three)
    assert bodies == [1, 2, 3]
    assert terms == (Terminus.DELIVERIES, Terminus.EXPIRE_WITH_CONNECTION, 60)
    await until(lambda: kept_is(server, 1), "the terminus is kept")
    await add(alice, 4)
    assert await asyncio.to_thread(proton_again, url, 3) == [2, 3, 4]


async def test_durable_configuration_keeps_the_position_alone(
    server: EventServer, alice: EventStreamClient
) -> None:
    """Durable 1: no unsettled maps; the link goes on from the oldest delivery not settled,
    and the group's position follows what is accepted of them."""
    ids = await add(alice, 1, 2, 3)
    peer = await connect(server)
    await peer.send(attach("config", durable=1, group="ftn18:config") + flow(0, 3))
    assert granted(await answer(peer, "config"))[0] == 1
    sent = await transfers(peer, 3)
    await peer.send(accept(int(sent[0].fields[1]), int(sent[0].fields[1])))
    user = await server.store.get_user("alice")
    assert user is not None

    def stored(up_to: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await server.store.position(user.id, "config") == up_to

        return check

    await until(stored(ids[0]), "the position after the first")
    await dropped(server, peer)
    again = await connect(server)
    unsettled = {b"%d" % ids[1]: ACCEPTED}  # ignored: no unsettled state is kept
    await again.send(attach("config", durable=1, group="ftn18:config", unsettled=unsettled))
    await again.send(flow(0, 10))
    assert their_unsettled(await answer(again, "config")) is None
    resent = await transfers(again, 2)
    assert tags(resent) == ids[1:]
    assert not any(resumed(t) for t in resent)
    more = await add(alice, 4)
    newest = await transfers(again, 1)
    assert tags(newest) == more
    for transfer in [*resent, *newest]:
        delivery_id = int(transfer.fields[1])
        await again.send(accept(delivery_id, delivery_id))
    await until(stored(more[0]), "the position after everything accepted")


async def test_beyond_the_bound_the_oldest_ids_are_kept_and_the_rest_sent_again(
    server: EventServer, alice: EventStreamClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("futoin_evt.amqp.streams.consumer.MAX_UNSETTLED", 3)
    peer = await connect(server)
    await peer.send(attach("many") + flow(0, 10))
    await answer(peer, "many")
    ids = await add(alice, 1, 2, 3, 4, 5)
    await transfers(peer, 5)
    await dropped(server, peer)
    again = await connect(server)
    await again.send(attach("many") + flow(0, 10))
    resumed_attach = await answer(again, "many")
    assert their_unsettled(resumed_attach) == {b"%d" % i: None for i in ids[:3]}
    assert resumed_attach.fields[8] is True  # incomplete-unsettled
    # nothing skipped: the three kept come again, then what followed the newest of them
    assert tags(await transfers(again, 5)) == ids


# -- across restarts, workers and processes -----------------------------------------------------


async def test_a_proton_client_resumes_its_link_after_a_server_restart(
    start_server: ServerFactory,
) -> None:
    """The link is suspended with its connection; the server restarts on the same SQLite
    file within the timeout; the link of the same container id and name gets what it had
    not settled again, then what follows."""
    server = await start_server(amqp=AmqpConfig(port=0))
    loop = asyncio.get_running_loop()
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:

        def add_three() -> object:
            return asyncio.run_coroutine_threadsafe(add(client, 1, 2, 3), loop).result()

        bodies, _terms = await asyncio.to_thread(proton_first, server.amqp_url or "", add_three)
    assert bodies == [1, 2, 3]
    await until(lambda: kept_is(server, 1), "the terminus is kept")
    await server.close()
    server = await start_server(amqp=AmqpConfig(port=0))
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        await add(client, 4)
    assert await asyncio.to_thread(proton_again, server.amqp_url or "", 3) == [2, 3, 4]


async def test_a_link_detached_in_a_live_session_resumes_after_a_restart(
    start_server: ServerFactory,
) -> None:
    """Suspended by a detach (closed=false) while its session lives, then the server shuts
    down under it: the terminus is kept its timeout from then, and the next server resumes
    it by the peer's map, the group's position moving over what the peer accepted."""
    server = await start_server(amqp=AmqpConfig(port=0))
    async with await EventStreamClient.connect(server.url, credentials=ALICE) as client:
        ids = await add(client, 1, 2, 3)
    peer = await connect(server)
    await peer.send(attach("orders", group="ftn18:billing", expiry="session-end") + flow(0, 3))
    await answer(peer, "orders")
    sent = await transfers(peer, 3)
    await peer.send(accept(int(sent[0].fields[1]), int(sent[0].fields[1])))
    await peer.send(frame(DETACH, [uint(0), False]))
    await peer.until(DETACH)  # answered once the terminus is stored
    closing = asyncio.ensure_future(server.close())
    await peer.until(CLOSE)  # the server closes the connection: the session ends with it
    await peer.close()
    await closing
    server = await start_server(amqp=AmqpConfig(port=0))
    again = await connect(server)
    peer_map = {b"%d" % ids[1]: ACCEPTED}
    await again.send(
        attach("orders", group="ftn18:billing", expiry="session-end", unsettled=peer_map)
        + flow(0, 10)
    )
    assert their_unsettled(await answer(again, "orders")) == {b"%d" % i: None for i in ids[1:]}
    resent = await transfers(again, 2)
    assert [(int(t.fields[2]), resumed(t), state_of(t)) for t in resent] == [
        (ids[1], True, 0x24),  # accepted by the peer: settled
        (ids[2], False, None),  # unknown to the peer: sent again
    ]
    await again.send(accept(int(resent[1].fields[1]), int(resent[1].fields[1])))
    user = await server.store.get_user("alice")
    assert user is not None

    async def all_accepted() -> bool:
        return await server.store.position(user.id, "billing") == ids[2]

    await until(all_accepted, "the position after everything accepted")
    assert await kept(server) == 0


async def test_a_link_suspended_in_a_live_session_resumes_after_a_crash(
    db_path: Path, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> None:
    """The server is killed while the session of a suspended link lives: its row was
    written with a lease (not only when the session ends), so the next server resumes it."""
    await prepare(db_path, password_hashes)
    process = ServerProcess(db_path, 0, "--amqp", "127.0.0.1:0")
    processes.append(process)
    peer = await connect_port(amqp_port(process))
    await peer.send(attach("orders", group="ftn18:billing", expiry="session-end") + flow(0, 3))
    await answer(peer, "orders")
    ids = tags(await transfers(peer, 3))
    await peer.send(frame(DETACH, [uint(0), False]))
    await peer.until(DETACH)
    process.kill()
    restarted = ServerProcess(db_path, 0, "--amqp", "127.0.0.1:0")
    processes.append(restarted)
    again = await connect_port(amqp_port(restarted))
    await again.send(attach("orders", group="ftn18:billing", expiry="session-end") + flow(0, 10))
    assert their_unsettled(await answer(again, "orders")) == {b"%d" % i: None for i in ids}
    assert tags(await transfers(again, 3)) == ids


async def test_an_expired_terminus_is_not_resumed_and_its_row_goes(
    server: EventServer, alice: EventStreamClient
) -> None:
    peer = await connect(server)
    await peer.send(attach("looked", timeout=1) + attach("purged", 1, timeout=1))
    await peer.send(flow(0, 5) + flow(1, 5))
    await answer(peer, "looked")
    await answer(peer, "purged")
    await add(alice, 1)
    await transfers(peer, 2)
    await dropped(server, peer)
    assert await kept(server) == 2
    await until(lambda: kept_is(server, 0), "both expired, a second after the drop")
    assert kept_names(server) == {"looked", "purged"}  # expired, not deleted yet
    again = await connect(server)
    await again.send(attach("looked") + flow(0, 5))
    assert their_unsettled(await answer(again, "looked")) is None  # not resumed
    assert kept_names(server) == {"purged"}  # the one looked at is deleted
    # the discarder's turns purge the rest
    server.discarder.config = replace(server.discarder.config, termini_purge_seconds=0)
    await server.discarder.turn()
    assert kept_names(server) == set()


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """One database and two ways to connect that land on two processes."""

    db: str
    first: Callable[[], Awaitable[Peer]]
    second: Callable[[], Awaitable[Peer]]


@pytest.fixture(params=["workers", "postgres"])
async def elsewhere(
    request: pytest.FixtureRequest,
    db_path: Path,
    password_hashes: dict[str, str],
    processes: list[ServerProcess],
) -> Elsewhere:
    """Two workers of one server on a SQLite file, or two servers on one PostgreSQL
    database; the first connection lands on one, the second on the other."""
    if request.param == "workers":
        await prepare(db_path, password_hashes)
        process = ServerProcess(db_path, 0, "--amqp", "127.0.0.1:0", log_level="debug", workers=2)
        processes.append(process)
        return Elsewhere(str(db_path), lambda: on_worker(process, 0), lambda: on_worker(process, 1))
    url = str(request.getfixturevalue("pg_url"))
    await prepare(url, password_hashes)
    for _ in range(2):
        processes.append(ServerProcess(url, 0, "--amqp", "127.0.0.1:0", workers=1))
    one, other = (amqp_port(process) for process in processes)
    return Elsewhere(url, lambda: logged_in(one), lambda: logged_in(other))


async def test_a_link_suspended_on_one_process_resumes_on_another(elsewhere: Elsewhere) -> None:
    """Suspended by a detach while its session lives on the first process; the link of the
    same container id and name resumes it on the second, by the peer's map."""
    first = await elsewhere.first()
    await first.send(attach("orders", group="ftn18:billing", expiry="session-end") + flow(0, 3))
    await answer(first, "orders")
    sent = await transfers(first, 3)  # the three events added before the servers started
    ids = tags(sent)
    await first.send(accept(int(sent[0].fields[1]), int(sent[0].fields[1])))
    await first.send(frame(DETACH, [uint(0), False]))
    await first.until(DETACH)  # answered once the terminus (and the position) is stored
    second = await elsewhere.second()
    peer_map = {b"%d" % ids[1]: ACCEPTED}
    await second.send(
        attach("orders", group="ftn18:billing", expiry="session-end", unsettled=peer_map)
        + flow(0, 10)
    )
    assert their_unsettled(await answer(second, "orders")) == {b"%d" % i: None for i in ids[1:]}
    resent = await transfers(second, 2)
    assert [(int(t.fields[2]), resumed(t), state_of(t)) for t in resent] == [
        (ids[1], True, 0x24),
        (ids[2], False, None),
    ]
    await second.send(accept(int(resent[1].fields[1]), int(resent[1].fields[1])))
    async with await open_store(elsewhere.db) as store:
        user = await store.get_user("alice")
        assert user is not None

        async def all_accepted() -> bool:
            return await store.position(user.id, "billing") == ids[2]

        await until(all_accepted, "the position after everything accepted")
        assert await store.count_termini() == 0  # taken: nothing is left to resume


async def test_the_bound_per_user_holds_across_processes(elsewhere: Elsewhere) -> None:
    """64 termini per user in all: the oldest goes, whichever process kept it."""

    async def suspend(peer: Peer, name: str) -> None:
        await peer.send(attach(name, durable=1, expiry="session-end"))
        await answer(peer, name)
        await peer.send(frame(DETACH, [uint(0), False]))
        await peer.until(DETACH)

    first, second = await elsewhere.first(), await elsewhere.second()
    for n in range(40):
        await suspend(first, f"first {n}")
    for n in range(25):
        await suspend(second, f"second {n}")
    names = {str(row[0]) for row in execute_sql(elsewhere.db, "SELECT link_name FROM amqp_termini")}
    assert names == {f"first {n}" for n in range(1, 40)} | {f"second {n}" for n in range(25)}


# -- the termini's writes, on a real store -------------------------------------------------------


@pytest.fixture
async def alice_store(db_path: Path) -> AsyncIterator[tuple[Store, UserId]]:
    async with await open_store(db_path) as store:
        yield store, await store.add_user("alice", "hash")


def kept_terminus(user: UserId, name: str, timeout: float = 0.0) -> KeptTerminus:
    return KeptTerminus(TerminusKey(user, "c", name), 0, None, 2, (1, 2), False, 2, timeout=timeout)


async def test_what_is_kept_on_one_turn_is_written_in_order_and_taken_after_it(
    alice_store: tuple[Store, UserId],
) -> None:
    store, alice = alice_store
    termini = Termini(LinkTermini(store))
    ended, forgotten, taken = (kept_terminus(alice, name, 60) for name in "eft")
    handle, _written = termini.keep(ended)
    termini.expire_later(handle)  # its connection ended on the same turn: one write
    termini.keep(forgotten)
    termini.discard(forgotten.key)  # a link of that name that is not durable came next
    termini.keep(taken)
    assert await termini.take(taken.key, 0, None) == taken  # waits for the write
    assert await termini.take(ended.key, 0, "group") is None  # another address: dropped
    assert await termini.count() == 0
    await termini.close()


async def test_a_terminus_of_a_live_session_is_kept_by_its_lease_then_expires(
    alice_store: tuple[Store, UserId], db_path: Path
) -> None:
    """Kept with a lease its process renews (a timeout of 0 would end it with its session);
    once its session ends, it expires."""
    store, alice = alice_store
    termini = Termini(LinkTermini(store), lease=0.3)
    handle, written = termini.keep(kept_terminus(alice, "live"))
    await written

    def expiry() -> float:
        return float(execute_sql(str(db_path), "SELECT expires_at FROM amqp_termini")[0][0])

    first = expiry()
    await until(lambda: expiry() > first, "the lease renewed")
    assert await termini.count(alice) == 1
    termini.expire_later(handle)
    await until(lambda: kept_is_in(termini, 0), "expired with its session (timeout 0)")
    await termini.close()


async def kept_is_in(termini: Termini, count: int) -> bool:
    return await termini.count() == count
