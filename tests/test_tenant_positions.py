"""A reader moves positions only over what was given, and loses its hold with its right.

Against ``futoin-evt serve`` as its own process, on SQLite and on PostgreSQL: root writes to
stream ``audit``; bob has ``read`` on it and nothing else. An acknowledgement or a seek past
the partition's head (the newest id ever given there) is refused naming the head, at the
FTN3 calls and in the console, and root's events stay; a consumer of a user who lost read
no longer holds back discarding (it is dropped, and said so).

An AMQP receiver's settlements cannot be put past the head: the position moves over the ids
of deliveries the server sent (see ``amqp/streams/consumer.py``), so there is no client's
number to try; nor can ``seekConsumer``'s, which takes a time and finds an id given before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from futoin_evt.client.aio import OPS, EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.log.archive import ArchiveFile

from .support.cli import run
from .support.console import console_login, csrf_in
from .support.servers import ServerProcess
from .support.waiting import DEADLINE, until

pytestmark = pytest.mark.functional

STREAM = "audit"
PASSWORDS = {"root": "root-pw", "bob": "bob-pw", "carol": "carol-pw"}
#: Past any head these tests reach.
FAR = 999999999999


@dataclass
class Server:
    process: ServerProcess

    @property
    def url(self) -> str:
        return f"{self.process.url.rstrip('/')}/{STREAM}"

    @property
    def console(self) -> str:
        return self.process.url.replace("ws://", "http://", 1).rstrip("/") + "/console/"


def _add_users(db: str) -> None:
    for name, password in PASSWORDS.items():
        flags = ["--admin"] if name == "root" else []
        added = run("user", "add", name, *flags, "--password-stdin", "--db", db,
                    stdin=password + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
    assert run("stream", "add", STREAM, "--partitions", "1", "--db", db).returncode == 0
    for reader in ("bob", "carol"):
        granted = run("grant", reader, "read", STREAM, "--db", db)
        assert granted.returncode == 0, granted.stderr


@pytest.fixture
def served(store_db: str) -> Iterator[Server]:
    _add_users(store_db)
    process = ServerProcess(store_db, 0, "--discard-interval", "0.1", "--console")
    try:
        yield Server(process)
    finally:
        process.stop()


async def connect(server: Server, user: str) -> EventStreamClient:
    return await EventStreamClient.connect(server.url, credentials=f"{user}:{PASSWORDS[user]}")


async def root_adds(server: Server, count: int) -> None:
    async with await connect(server, "root") as root:
        for n in range(count):
            await root.add_event("ENTRY", {"n": n})


async def stream_info(server: Server) -> dict[str, Any]:
    async with await connect(server, "root") as root:
        info: dict[str, Any] = await root.ftn3.call(OPS, "streamInfo", {})
        return info


async def _discarded(server: Server, count: int) -> bool:
    return int((await stream_info(server)).get("discarded_total", 0)) >= count


async def position_of(client: EventStreamClient, component: str) -> int:
    state = await client.ftn3.call(OPS, "consumerState", {"component": component})
    return int(state["position"])


def admin(server: Server, *args: str) -> None:
    env = {"FUTOIN_EVT_USER": "root", "FUTOIN_EVT_PASSWORD": PASSWORDS["root"]}
    result = run(*args, "--url", server.process.url, env=env)
    assert result.returncode == 0, (args, result.stderr)


async def test_an_acknowledgement_past_the_head_is_refused_and_nothing_goes(
    served: Server,
) -> None:
    await root_adds(served, 3)
    async with await connect(served, "bob") as bob:
        await bob.register_consumer("AUD")
        head = f"is past the head of partition {STREAM}/0 (3)"
        with pytest.raises(RemoteError) as refused:
            await bob.ftn3.call(OPS, "acknowledge", {"component": "AUD", "last_id": str(FAR)})
        assert refused.value.name == "InvalidRequest"
        assert refused.value.desc == f"last_id {FAR} {head}"
        # pollEvents acknowledges its last_id: the same rule
        with pytest.raises(RemoteError) as polled:
            await bob.poll_events("AUD", FAR)
        assert (polled.value.name, polled.value.desc) == ("InvalidRequest", f"last_id {FAR} {head}")
        assert await position_of(bob, "AUD") == 0
        # an id given may be acknowledged, read or not
        await bob.ftn3.call(OPS, "acknowledge", {"component": "AUD", "last_id": "1"})
    # a discard turn has run since (it discarded event 1): root's other events are there
    await until(lambda: _discarded(served, 1), "event 1 discarded")
    info = await stream_info(served)
    assert (info["events"], info["last_id"]) == (2, "3")
    async with await connect(served, "root") as root:
        assert [e.id for e in await root.poll_events("LIVE", 0)] == [2, 3]
    # bob's own consumer may move to the head, and events added later stay for him
    await root_adds(served, 1)
    async with await connect(served, "bob") as bob:
        acked = await bob.ftn3.call(OPS, "acknowledge", {"component": "AUD", "last_id": "4"})
        assert acked == "4"
        with pytest.raises(RemoteError, match=r"last_id 5 is past the head .* \(4\)"):
            await bob.ftn3.call(OPS, "acknowledge", {"component": "AUD", "last_id": "5"})
        await root_adds(served, 1)
        assert [e.id for e in await bob.poll_events("AUD", 4)] == [5]


async def test_a_seek_past_the_head_is_refused_in_the_console(served: Server) -> None:
    await root_adds(served, 2)
    async with await connect(served, "bob") as bob:
        await bob.register_consumer("AUD")
    async with httpx.AsyncClient(base_url=served.console, timeout=30) as http:
        assert (await console_login(http, "bob", PASSWORDS["bob"])).status_code == 303
        csrf = csrf_in((await http.get("consumers")).text)
        form = {"csrf": csrf, "stream": STREAM, "partition": "0", "user": "bob",
                "component": "AUD"}  # fmt: skip
        far = "999999999999999999"
        reply = await http.post("consumers/seek", data={**form, "position": far})
        assert reply.status_code == 400
        assert f"Position {far} is past the head of partition {STREAM}/0 (2)." in reply.text
        async with await connect(served, "bob") as bob:
            assert await position_of(bob, "AUD") == 0
        assert (await stream_info(served))["events"] == 2
        # within the head, the seek is made
        moved = await http.post("consumers/seek", data={**form, "position": "2"})
        assert moved.status_code == 303
    async with await connect(served, "bob") as bob:
        assert await position_of(bob, "AUD") == 2


async def test_a_revoked_users_consumer_no_longer_holds_back_discarding(
    served: Server,
) -> None:
    """Bob's consumer, at 0, holds back everything; once bob loses read it is dropped (said
    as ``consumerDropped``), and root's (an admin, with no grant) holds back from 1."""
    await root_adds(served, 3)
    async with await connect(served, "bob") as bob:
        await bob.register_consumer("BOBPAY")
    async with await connect(served, "carol") as carol:
        await carol.register_consumer("CAROLPAY")
        await carol.poll_events("CAROLPAY", 3)  # carol read them all
    async with await connect(served, "root") as root:
        await root.register_consumer("ROOTC")
        await root.poll_events("ROOTC", 1)
        info = await root.ftn3.call(OPS, "streamInfo", {})
        assert info["held_back_by"] == {"user": "bob", "component": "BOBPAY"}
        assert info["events"] == 3
        watched = await Notifications(root.ftn3).subscribe(
            "eventType = 'org.futoin.evt.consumerDropped'",
            ["stream", "user", "component", "reason"],
            compact=True,
        )
        admin(served, "revoke", "bob", "read", STREAM)
        dropped = await asyncio.wait_for(watched.get(), DEADLINE)
        assert dropped["body"] == [
            STREAM,
            "bob",
            "BOBPAY",
            "its user may no longer read the stream",
        ]

        async def held_back_by_root() -> bool:
            info = await root.ftn3.call(OPS, "streamInfo", {})
            return bool(info["events"] == 2 and info.get("held_back_by", {}).get("user") == "root")

        await until(held_back_by_root, "event 1 discarded, root's consumer holding back")
        info = await root.ftn3.call(OPS, "streamInfo", {})
        assert {"user": "bob", "component": "BOBPAY"} in info["expired_consumers"]
        listed = await root.ftn3.call(OPS, "listConsumers", {})
        assert sorted(c["component"] for c in listed) == ["CAROLPAY", "ROOTC"]
    # given read again, bob registers anew: from the oldest event retained
    admin(served, "grant", "bob", "read", STREAM)
    async with await connect(served, "bob") as bob:
        await bob.register_consumer("BOBPAY")
        assert [e.id for e in await bob.poll_events("BOBPAY")] == [2, 3]


async def test_an_archive_ahead_of_the_database_stops_and_skips_nothing(
    store_db: str, tmp_path: Path
) -> None:
    """An archive file whose last id is past the database's head holds another database's
    events: the archiver stops (and says why) rather than take the new events for archived,
    and its consumer keeps them."""
    _add_users(store_db)
    archive = tmp_path / "archive.sqlite"
    earlier = ArchiveFile(archive)
    earlier.append([(n, "OLD", "{}", "2026-01-01T00:00:00Z") for n in range(1, 6)])
    earlier.close()
    process = ServerProcess(store_db, 0, "--discard-interval", "0.1", "--archive", str(archive))
    try:
        events = f"{process.url.rstrip('/')}/events"
        credentials = f"root:{PASSWORDS['root']}"
        async with await EventStreamClient.connect(events, credentials=credentials) as root:
            for n in range(3):
                await root.add_event("NEW", {"n": n})
            await until(lambda: "archiving to" in process.logged(), "the archiver says it stopped")
            assert (
                "the archive's last id 5 is past the head of partition events/0 ("
                in process.logged()
            )
            await root.register_consumer("ROOTC")
            await root.poll_events("ROOTC", 3)
            listed = await root.ftn3.call(OPS, "listConsumers", {})
            assert {(c["user"], c["component"], c.get("position")) for c in listed} == {
                ("_archive", "ARCHIVE", None),
                ("root", "ROOTC", "3"),
            }
            info = await root.ftn3.call(OPS, "streamInfo", {})
            assert (info["events"], info["held_back_by"]["user"]) == (3, "_archive")
    finally:
        process.stop()
