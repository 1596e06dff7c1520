"""AMQP consumer groups held across processes: one active link per user, group and partition
whichever process or worker a link comes to. Raw frames on real sockets to real server
processes: two on one PostgreSQL database, and one with two workers on one SQLite file, the
two links made to land on different workers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Described, symbol, uint, ulong

from futoin_evt.amqp import AmqpConfig
from futoin_evt.storage import open_store

from .support.amqp_wire import (
    ATTACH,
    DETACH,
    DISPOSITION,
    SOURCE,
    TARGET,
    TRANSFER,
    Frame,
    Peer,
    flow,
    logged_in,
)
from .support.amqp_wire import detach as detach_frame
from .support.amqp_wire import frame as amqp_frame
from .support.servers import ServerFactory, ServerProcess
from .support.workers import amqp_port, on_worker, prepare

pytestmark = pytest.mark.functional

GROUP = "ftn18:billing"
ACCEPTED = Described(ulong(0x24), [])
#: Bound of every wait for something the processes do not signal to the test.
WITHIN_SECONDS = 60.0


@pytest.fixture(autouse=True)
async def _peers_closed() -> AsyncIterator[None]:
    yield
    await Peer.close_all()


def attach(name: str, handle: int, epoch: int | None, *, owner_level: bool = False) -> bytes:
    """A receiving link of the group from ``events`` with that epoch (``owner_level``: as an
    Event Hubs owner level, ``com.microsoft:epoch``)."""
    properties: dict[Any, Any] = {symbol("event-streams-consumer-group"): GROUP}
    if epoch is not None:
        name_of_epoch = "com.microsoft:epoch" if owner_level else "event-streams-epoch"
        properties[symbol(name_of_epoch)] = epoch
    source = Described(ulong(SOURCE), ["events"])
    target = Described(ulong(TARGET), [])
    return amqp_frame(ATTACH, [name, uint(handle), True, None, None, source, target, None,
                               False, None, None, None, None, properties])  # fmt: skip


def accept(first: int, last: int) -> bytes:
    return amqp_frame(DISPOSITION, [True, uint(first), uint(last), True, ACCEPTED])


async def answer(peer: Peer, name: str) -> Frame:
    """The server's attach of link ``name``."""
    while True:
        received = await peer.until(ATTACH, WITHIN_SECONDS)
        if received.fields[0] == name:
            return received


def taken(attached: Frame) -> bool:
    return attached.fields[5] is not None  # a refused link is answered with no source


async def detached(peer: Peer, handle: int) -> Frame:
    """The server's detach of its link ``handle`` (the handle of the server's attach)."""
    while True:
        received = await peer.until(DETACH, WITHIN_SECONDS)
        if int(received.fields[0]) == handle:
            return received


async def refused(peer: Peer, name: str) -> str | None:
    """The condition a link was refused with (None: it was taken)."""
    attached = await answer(peer, name)
    if taken(attached):
        return None
    return (await detached(peer, int(attached.fields[1]))).condition()


Connect = Callable[[], Awaitable[Peer]]


async def take_over(db: str, first: Connect, second: Connect) -> None:
    """A link of the group with epoch 1 on ``first``; on ``second``, the same epoch is
    refused, a higher one takes over; the first link is detached as stolen, and what it
    settles after the takeover does not move the group's position."""
    async with await open_store(db) as store:
        alice = await store.get_user("alice")
    assert alice is not None
    a = await first()
    await a.send(attach("first", 0, 1) + flow(0, 3))
    first_link = await answer(a, "first")
    assert taken(first_link)
    deliveries = [int((await a.until(TRANSFER, WITHIN_SECONDS)).fields[1]) for _ in range(3)]
    b = await second()
    await b.send(attach("same", 0, 1))
    assert await refused(b, "same") == "amqp:resource-locked"
    await b.send(attach("none", 1, None))
    assert await refused(b, "none") == "amqp:resource-locked"
    await b.send(attach("higher", 2, 2))
    higher = await answer(b, "higher")
    assert taken(higher)
    assert higher.fields[13][symbol("event-streams-epoch")] == 2
    # Settled after the takeover, before or after the first process hears of it: either way
    # the first link is detached as stolen, and its settlements move nothing.
    await a.send(accept(deliveries[0], deliveries[-1]))
    assert (await detached(a, int(first_link.fields[1]))).condition() == "amqp:link:stolen"
    async with await open_store(db) as store:
        assert await store.position(alice.id, "billing") == 0
    # the new link gets what the first did not settle, and moves the position (its detach
    # is answered once the position is stored)
    await b.send(flow(2, 3))
    again = [await b.until(TRANSFER, WITHIN_SECONDS) for _ in range(3)]
    await b.send(accept(int(again[0].fields[1]), int(again[-1].fields[1])) + detach_frame(2))
    assert (await detached(b, int(higher.fields[1]))).condition() is None
    async with await open_store(db) as store:
        assert await store.position(alice.id, "billing") == 3


@pytest.fixture
async def pg_db(pg_url: str, password_hashes: dict[str, str]) -> str:
    await prepare(pg_url, password_hashes)
    return pg_url


async def test_a_group_is_taken_over_across_processes_on_postgresql(
    pg_db: str, processes: list[ServerProcess]
) -> None:
    for _ in range(2):
        processes.append(ServerProcess(pg_db, 0, "--amqp", "127.0.0.1:0", workers=1))
    one, other = (amqp_port(process) for process in processes)
    await take_over(pg_db, lambda: logged_in(one), lambda: logged_in(other))
    # The holder's process dies: a higher epoch, or an equal owner level, takes the group
    # at once on the other.
    processes[1].kill()
    peer = await logged_in(one)
    await peer.send(attach("owner level", 0, 2, owner_level=True))
    assert await refused(peer, "owner level") is None


async def test_a_group_is_taken_over_across_workers_on_sqlite(
    db_path: Path, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> None:
    await prepare(db_path, password_hashes)
    process = ServerProcess(db_path, 0, "--amqp", "127.0.0.1:0", log_level="debug", workers=2)
    processes.append(process)
    await take_over(str(db_path), lambda: on_worker(process, 0), lambda: on_worker(process, 1))


async def test_a_takeover_not_heard_of_is_fenced(
    db_path: Path, start_server: ServerFactory
) -> None:
    """Two servers on one SQLite file that are not workers of one server hear nothing of
    each other's claims: the first link stays attached until its settlements find the group
    taken, which store nothing and detach it as stolen."""
    await prepare(db_path)
    one = await start_server(amqp=AmqpConfig(port=0))
    other = await start_server(amqp=AmqpConfig(port=0))
    assert one.amqp is not None
    assert other.amqp is not None
    ports = one.amqp.port, other.amqp.port
    await take_over(str(db_path), lambda: logged_in(ports[0]), lambda: logged_in(ports[1]))
