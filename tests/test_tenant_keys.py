"""A producer's key belongs to its writer: the same key from two users names two events.

Against ``futoin-evt serve`` as its own process, on SQLite and on PostgreSQL: a user with
only ``write`` on ``orders`` (``wonly``) stores an event under a key first; the genuine
writer's event with that key (through FTN18 ``addEvent`` and through the AMQP door) is
stored and answered with its own id, and the write-only user learns nothing of the keys
others used. Then the schema step that gives each stored key its writer, on both backends.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Delivery, Message

from futoin_evt.amqp.codec import KEY_PROPERTY
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.stream import UserId
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION
from futoin_evt.storage.dedup import WRITER_KEYS_VERSION, WriterKey
from futoin_evt.storage.sqlite.schema import MIGRATIONS

from .support.amqp import connected, send_outcome
from .support.cli import run
from .support.servers import ServerProcess
from .support.sql import execute_sql, pg_schema_at

pytestmark = pytest.mark.functional

STREAM = "orders"
#: name: (password, rights on ``orders``).
USERS: dict[str, tuple[str, str]] = {
    "alice": ("alice-pw", "read,write"),
    "wonly": ("wonly-pw", "write"),
}
KEY = "order-18-paid"
FORGED = {"refund_to": "mallory-iban"}
GENUINE = {"refund_to": "alice-iban"}


@pytest.fixture
def served(store_db: str) -> Iterator[ServerProcess]:
    """A server with AMQP on, the stream ``orders`` and the users of :data:`USERS`."""
    assert run("stream", "add", STREAM, "--partitions", "1", "--db", store_db).returncode == 0
    for name, (password, rights) in USERS.items():
        added = run("user", "add", name, "--password-stdin", "--db", store_db,
                    stdin=password + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
        granted = run("grant", name, rights, STREAM, "--db", store_db)
        assert granted.returncode == 0, granted.stderr
    process = ServerProcess(store_db, 0, "--amqp", "127.0.0.1:0")
    try:
        yield process
    finally:
        process.stop()


async def add(server: ServerProcess, user: str, data: Any, key: str) -> int:
    """addEvent on ``orders`` as ``user`` with ``key``: the id answered."""
    url = f"{server.url.rstrip('/')}/{STREAM}"
    credentials = f"{user}:{USERS[user][0]}"
    async with await EventStreamClient.connect(url, credentials=credentials) as client:
        return await client.add_event("REFUND", data, key)


async def stored(server: ServerProcess) -> list[tuple[int, Any]]:
    """(id, data) of every event of ``orders``, as alice reads them."""
    url = f"{server.url.rstrip('/')}/{STREAM}"
    credentials = f"alice:{USERS['alice'][0]}"
    async with await EventStreamClient.connect(url, credentials=credentials) as client:
        await client.register_consumer("BOOKS")
        return [(event.id, event.data) for event in await client.poll_events("BOOKS")]


def send_keyed(server: ServerProcess, user: str, data: Any, key: str) -> tuple[int, str | None]:
    """One message to ``orders`` over AMQP as ``user``, with ``key``: its outcome."""
    assert server.amqp_url is not None
    message = Message(subject="REFUND", body=data, properties={KEY_PROPERTY: key})
    with connected(server.amqp_url, user, USERS[user][0]) as conn:
        return send_outcome(conn.create_sender(STREAM), message)


async def test_a_key_taken_first_by_another_writer_does_not_answer_for_mine(
    served: ServerProcess,
) -> None:
    """wonly stores its event under alice's key first: alice's genuine event with that key
    is stored and answered with its own id; each writer's retry gets its own event."""
    forged = await add(served, "wonly", FORGED, KEY)
    genuine = await add(served, "alice", GENUINE, KEY)
    assert genuine != forged
    assert await stored(served) == [(forged, FORGED), (genuine, GENUINE)]
    assert await add(served, "alice", {"retry": True}, KEY) == genuine
    assert await add(served, "wonly", {"retry": True}, KEY) == forged
    assert await stored(served) == [(forged, FORGED), (genuine, GENUINE)]


async def test_at_the_amqp_door_too(served: ServerProcess) -> None:
    """The same over AMQP (``futoin-evt-key``), after a key taken over FTN18 and over AMQP:
    alice's messages are accepted and stored; her own retry is stored once."""
    forged = await add(served, "wonly", FORGED, KEY)
    taken = await asyncio.to_thread(send_keyed, served, "wonly", FORGED, "order-19-paid")
    assert taken == (Delivery.ACCEPTED, None)
    for key in (KEY, "order-19-paid", "order-19-paid"):
        outcome = await asyncio.to_thread(send_keyed, served, "alice", GENUINE, key)
        assert outcome == (Delivery.ACCEPTED, None)
    assert [data for _id, data in await stored(served)] == [FORGED, FORGED, GENUINE, GENUINE]
    assert await add(served, "alice", {"retry": True}, KEY) == forged + 2


async def test_a_write_only_user_cannot_learn_which_keys_others_used(
    served: ServerProcess,
) -> None:
    """wonly's key that alice used answers as one nobody used: a new event, stored."""
    used = await add(served, "alice", GENUINE, KEY)
    unused = await add(served, "wonly", FORGED, "never-used")
    probed = await add(served, "wonly", FORGED, KEY)
    assert (unused, probed) == (used + 1, used + 2)
    assert [event_id for event_id, _data in await stored(served)] == [used, unused, probed]


# -- the schema step ----------------------------------------------------------------------------


def sqlite_schema_at(path: str, version: int) -> None:
    """Make the SQLite file ``path`` as a release at schema ``version`` left it."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for step in range(1, version + 1):
            for statement in MIGRATIONS[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
    conn.close()


async def test_keys_stored_before_writers_are_dropped(store_db: str) -> None:
    """A database whose keys have no writer (events do not say who wrote them): the step
    drops them, and a key is its writer's from then on (an event with an old key is
    stored anew)."""
    before = WRITER_KEYS_VERSION - 1
    if store_db.startswith("postgresql://"):
        pg_schema_at(store_db, before)
    else:
        sqlite_schema_at(store_db, before)
    execute_sql(store_db, "INSERT INTO events (type, data, ts) VALUES ('T', '1', 'x')")
    execute_sql(store_db, "INSERT INTO dedup_keys VALUES (0, 'old', 1, 9000000000000)")
    async with await open_store(store_db, dedup_window=60) as store:
        assert execute_sql(store_db, "SELECT count(*) FROM events WHERE key IS NOT NULL") == [(0,)]
        alice, bob = WriterKey(UserId(1), "old"), WriterKey(UserId(2), "old")
        assert [await store.submit_append("T", "2", None, k) for k in (alice, bob, alice)] == [
            2,
            3,
            2,
        ]
    assert execute_sql(store_db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    rows = execute_sql(
        store_db, "SELECT key_user_id, key, id FROM events WHERE key IS NOT NULL ORDER BY 3"
    )
    assert [tuple(row) for row in rows] == [(1, "old", 2), (2, "old", 3)]
