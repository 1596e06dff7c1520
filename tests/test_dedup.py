"""Idempotent producers: an event added with a key within the dedup window is stored once.

A real server on 127.0.0.1 over a SQLite file and over PostgreSQL (``store_db``), the
producer's calls as ``futoin.evt.gen`` 1.2 sends them; the store's part of the contract
(batches, calls in flight, expiry, restarts) against both backends.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.domain.stream import UserId
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION, Store
from futoin_evt.storage.dedup import KEYED_ROWS_VERSION, WriterKey

from .support.servers import USERS, ClientFactory, ServerFactory, ServerProcess, add_user
from .support.sql import execute_sql, pg_schema_at, stored
from .support.waiting import until

pytestmark = pytest.mark.functional

GEN_12 = "futoin.evt.gen:1.2"
SEC = f"alice:{USERS['alice']}"
BIG = 1 << 20


async def add(client: EventStreamClient, data: Any, key: str | None, **params: Any) -> int:
    """addEvent through 1.2 with ``key``."""
    params = {"type": "T", "data": data, **params}
    if key is not None:
        params["key"] = key
    return int(await client.ftn3.call(GEN_12, "addEvent", params))


def mine(key: str) -> WriterKey:
    """``key`` as one user writes it (the store's tests: a key is its writer's)."""
    return WriterKey(UserId(1), key)


def key_count(db: str) -> int:
    """The keys stored in ``events``/0 (each in its event's row)."""
    return int(execute_sql(db, "SELECT count(*) FROM events WHERE key IS NOT NULL")[0][0])


def keys_of(db: str) -> list[tuple[int, int, str]]:
    """(event id, user id, key) of each keyed event of ``events``/0."""
    rows = execute_sql(db, "SELECT id, key_user_id, key FROM events WHERE key IS NOT NULL")
    return sorted((int(event_id), int(user_id), key) for event_id, user_id, key in rows)


async def wait_past(instant: float) -> None:
    """Until the clock is past ``instant`` (the condition a window's expiry is)."""
    while time.time() <= instant:  # noqa: ASYNC110 - the clock is the condition
        await asyncio.sleep(0.01)


def request(rid: str, data: Any, key: Any, version: str = "1.2") -> str:
    params = {"type": "T", "data": data, "key": key}
    return json.dumps(
        {"rid": rid, "f": f"futoin.evt.gen:{version}:addEvent", "p": params, "sec": SEC}
    )


async def raw_call(ws: ClientConnection, frame: str) -> dict[str, Any]:
    await ws.send(frame)
    async with asyncio.timeout(10):
        reply: dict[str, Any] = json.loads(await ws.recv())
    return reply


# -- the store ----------------------------------------------------------------------------------


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    async with await open_store(store_db, dedup_window=60) as opened:
        yield opened


async def test_an_append_in_flight_answers_its_copies_and_is_stored_once(
    store: Store, store_db: str
) -> None:
    """Copies queued while the first is not committed (one batch) get its id; an event
    without a key, or with another, in the same batch is stored."""
    first = store.submit_append("T", "1", None, mine("k"))
    copy = store.submit_append("T", "2", None, mine("k"))
    other = store.submit_append("T", "3", None, mine("other"))
    plain = store.submit_append("T", "4")
    assert list(await asyncio.gather(first, copy, other, plain)) == [1, 1, 2, 3]
    assert await store.submit_append("T", "5", None, mine("k")) == 1  # committed: the database
    assert stored(store_db) == [(1, 1), (2, 3), (3, 4)]


async def test_a_batch_stores_all_but_the_known_keys(store: Store, store_db: str) -> None:
    """Events appended together: the one whose key is stored gets the first id, the others
    (a key repeated in the batch answered once) are stored together."""
    assert await store.submit_append("T", "0", None, mine("known")) == 1
    ids = await store.submit_appends(
        [("T", "1", None), ("T", "2", None), ("T", "3", None), ("T", "4", "text/plain")],
        [mine("new"), mine("known"), mine("new"), None],
    )
    assert ids == [2, 1, 2, 3]
    assert stored(store_db) == [(1, 0), (2, 1), (3, 4)]
    rows = await store.read_rows(0, limit=10)
    assert rows[-1][4] == "text/plain"  # the content types follow their events


async def test_keys_are_per_partition(store: Store) -> None:
    await store.add_stream("orders", 2)
    info = await store.stream("orders")
    assert info is not None
    logs = [store.partition_log(p) for p in info.partitions]
    assert await logs[0].submit_append("T", "1", None, mine("k")) == 1
    assert await logs[1].submit_append("T", "2", None, mine("k")) == 1
    assert await logs[1].submit_append("T", "3", None, mine("k")) == 1
    assert await store.submit_append("T", "4", None, mine("k")) == 1
    assert [await log.newest_event_id() for log in logs] == [1, 1]


async def test_keys_are_per_writer(store: Store, store_db: str) -> None:
    """The same key from two users names two events, in flight together, in one batch and
    once committed; each writer's copy gets its own event's id."""
    alice, bob = WriterKey(UserId(1), "k"), WriterKey(UserId(2), "k")
    together = [store.submit_append("T", str(n), None, key) for n, key in enumerate([alice, bob])]
    assert list(await asyncio.gather(*together)) == [1, 2]
    assert await store.submit_appends([("T", "2", None)] * 2, [bob, alice]) == [2, 1]
    carol = WriterKey(UserId(3), "k")
    assert await store.submit_appends([("T", "3", None)] * 2, [carol, alice]) == [3, 1]
    assert await store.submit_append("T", "4", None, carol) == 3
    assert stored(store_db) == [(1, 0), (2, 1), (3, 3)]


async def test_keys_survive_a_restart(store_db: str) -> None:
    async with await open_store(store_db) as store:
        assert [await store.submit_append("T", str(n), None, mine(f"k{n}")) for n in range(3)] == [
            1,
            2,
            3,
        ]
    async with await open_store(store_db) as store:
        assert await store.submit_append("T", "9", None, mine("k1")) == 2
        assert await store.newest_event_id() == 3


async def test_a_key_is_forgotten_after_the_window(store_db: str) -> None:
    """Past the window an event with the key is stored again and takes the key over (the
    old event keeps no key); there is nothing else to forget."""
    async with await open_store(store_db, dedup_window=1) as store:
        await store.submit_append("T", "1", None, mine("old"))
        await store.submit_append("T", "2", None, mine("again"))
        stored_by = time.time()
        await wait_past(stored_by + 1)
        theirs = WriterKey(UserId(2), "again")  # with another writer's, in one batch
        assert await store.submit_appends([("T", "3", None)] * 2, [mine("again"), theirs]) == [
            3,
            4,
        ]
        assert await store.submit_append("T", "4", None, mine("again")) == 3
        assert keys_of(store_db) == [(1, 1, "old"), (3, 1, "again"), (4, 2, "again")]


async def test_a_key_goes_with_its_discarded_event(store_db: str) -> None:
    """Discarding an event drops its key: the key names a new event then, though it is
    within the window; the keys of the events kept still answer."""
    async with await open_store(store_db, dedup_window=60) as store:
        keys = [mine(f"k{n}") for n in range(25)]
        assert await store.submit_appends([("T", "1", None)] * 25, keys) == list(range(1, 26))
        assert await store.delete_events(10, 100) == 10
        assert key_count(store_db) == 15
        assert await store.submit_appends([("T", "2", None)] * 2, [keys[0], keys[10]]) == [26, 11]
        assert keys_of(store_db)[-1] == (26, 1, "k0")


async def test_with_no_window_keys_are_ignored(store_db: str) -> None:
    async with await open_store(store_db, dedup_window=0) as store:
        ids = [await store.submit_append("T", "1", None, mine("k")) for _ in range(2)]
        assert ids == [1, 2]
        assert await store.submit_appends([("T", "1", None)] * 2, [mine("k"), mine("k")]) == [3, 4]
    assert key_count(store_db) == 0
    with pytest.raises(ValueError, match="0 or more seconds"):
        await open_store(store_db, dedup_window=-1)


def schema_with_a_partition_at(db: str, version: int) -> None:
    """Make the empty database ``db`` as a release at schema ``version`` (before
    :data:`KEYED_ROWS_VERSION`) left it, with a stream ``orders`` of one partition (key 1)."""
    if db.startswith("postgresql://"):
        from futoin_evt.storage.postgres.schema import partition_tables_sql

        pg_schema_at(db, version)
    else:
        from futoin_evt.storage.sqlite.schema import MIGRATIONS, partition_tables_sql

        statements = ["CREATE TABLE schema_version (version INTEGER NOT NULL)"]
        for step in range(1, version + 1):
            statements += [s for s in MIGRATIONS[step].split(";") if s.strip()]
        statements.append(f"INSERT INTO schema_version VALUES ({version})")
        for statement in statements:
            execute_sql(db, statement)
    execute_sql(db, "INSERT INTO streams (name, created_at) VALUES ('orders', 'x')")
    execute_sql(db, "INSERT INTO partitions (key, stream, number) VALUES (1, 'orders', 0)")
    for statement in partition_tables_sql(1):  # as they are now, less the keys
        execute_sql(db, statement)
    execute_sql(db, "DROP INDEX events_1_by_key")
    for column in ("key_user_id", "key", "key_at"):
        execute_sql(db, f"ALTER TABLE events_1 DROP COLUMN {column}")


async def test_the_keys_move_into_their_events_rows(store_db: str) -> None:
    """The schema step that moves the keys into their events' rows: the keys of stored
    events still answer, in every partition; a key whose event was discarded goes."""
    schema_with_a_partition_at(store_db, KEYED_ROWS_VERSION - 1)
    now_ms = int(time.time() * 1000)
    for table in ("events", "events", "events_1"):
        execute_sql(store_db, f"INSERT INTO {table} (type, data, ts) VALUES ('T', '0', 'x')")
    for partition, key, event_id in [(0, "a", 2), (0, "gone", 9), (1, "b", 1)]:
        execute_sql(
            store_db,
            "INSERT INTO dedup_keys VALUES (?, 1, ?, ?, ?)",
            (partition, key, event_id, now_ms),
        )
    async with await open_store(store_db, dedup_window=60) as store:
        assert await store.submit_append("T", "1", None, mine("a")) == 2
        assert await store.submit_append("T", "1", None, mine("gone")) == 3
        info = await store.stream("orders")
        assert info is not None
        orders = store.partition_log(info.partitions[0])
        assert await orders.submit_append("T", "1", None, mine("b")) == 1
        assert await orders.submit_append("T", "1", None, mine("a")) == 2
    assert execute_sql(store_db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert keys_of(store_db) == [(2, 1, "a"), (3, 1, "gone")]
    with pytest.raises(Exception, match="dedup_keys"):
        execute_sql(store_db, "SELECT count(*) FROM dedup_keys")


# -- the server ---------------------------------------------------------------------------------


@pytest.fixture
async def keyed_server(start_server: ServerFactory, store_db: str) -> EventServer:
    return await start_server(db=store_db)


@pytest.fixture
async def producers(keyed_server: EventServer) -> AsyncIterator[ClientFactory]:
    """Clients of ``keyed_server`` as alice (closed at the end)."""
    clients: list[EventStreamClient] = []

    async def open_client() -> EventStreamClient:
        clients.append(await EventStreamClient.connect(keyed_server.url, credentials=SEC))
        return clients[-1]

    yield open_client
    for client in clients:
        await client.close()


async def test_lost_replies_and_their_retries_store_each_event_once(
    keyed_server: EventServer, producers: ClientFactory, store_db: str
) -> None:
    """1,000 producers each send one event and lose the reply: half close the connection
    cleanly right after the request, half drop it (TCP reset). Each then retries with its
    key on a new connection: each event is stored once (whether the first try got in or
    not), and each retry answers that event's id."""
    url = keyed_server.url

    async def lose(n: int) -> None:
        ws = await connect_raw(url)
        await ws.send(request("C1", n, f"producer-{n}:1"))
        if n % 2:
            ws.transport.abort()
        await ws.close()

    for start in range(0, 1000, 50):
        await asyncio.gather(*(lose(n) for n in range(start, start + 50)))
    retry = await producers()
    answers: dict[int, int] = {}
    for start in range(0, 1000, 100):
        ids = await asyncio.gather(
            *(add(retry, n, f"producer-{n}:1") for n in range(start, start + 100))
        )
        answers.update(zip(range(start, start + 100), ids, strict=True))
    events = stored(store_db)
    assert sorted(data for _id, data in events) == list(range(1000))
    assert {data: event_id for event_id, data in events} == answers


async def connect_raw(url: str) -> ClientConnection:
    return await connect(url, open_timeout=10, close_timeout=1)


async def test_one_key_from_two_connections_at_once_is_stored_once(
    keyed_server: EventServer, producers: ClientFactory, store_db: str
) -> None:
    one, other = await producers(), await producers()
    calls = [add(client, n, f"k{n}") for n in range(300) for client in (one, other)]
    ids = await asyncio.gather(*calls)
    assert ids[0::2] == ids[1::2]
    assert len(stored(store_db)) == 300


async def test_a_restart_inside_the_window_keeps_the_keys(
    start_server: ServerFactory, store_db: str
) -> None:
    server = await start_server(db=store_db)
    async with await EventStreamClient.connect(server.url, credentials=SEC) as client:
        first = await add(client, 1, "order-17")
    await server.close()
    restarted = await start_server(db=store_db)
    async with await EventStreamClient.connect(restarted.url, credentials=SEC) as client:
        assert await add(client, 1, "order-17") == first
    assert stored(store_db) == [(first, 1)]


async def test_a_key_is_forgotten_after_the_window_of_the_server(
    start_server: ServerFactory, store_db: str
) -> None:
    """Past the window the key's event is stored again, and holds the key from then on;
    a discarder's turn keeps the keys of the events it keeps."""
    server = await start_server(db=store_db, dedup_window=1.0)
    async with await EventStreamClient.connect(server.url, credentials=SEC) as client:
        first = await add(client, 1, "order-17")
        await add(client, 2, "order-18")
        answered = time.time()
        assert await add(client, 1, "order-17") == first
        await wait_past(answered + 1)
        second = await add(client, 1, "order-17")
    assert second > first
    assert stored(store_db) == [(first, 1), (first + 1, 2), (second, 1)]
    await server.discarder.turn()
    keys = execute_sql(store_db, "SELECT key, id FROM events WHERE key IS NOT NULL ORDER BY 2")
    assert [tuple(row) for row in keys] == [("order-18", first + 1), ("order-17", second)]


async def test_with_no_window_the_server_accepts_keys_and_stores_each_event(
    start_server: ServerFactory, store_db: str
) -> None:
    server = await start_server(db=store_db, dedup_window=0)
    async with await EventStreamClient.connect(server.url, credentials=SEC) as client:
        ids = [await add(client, 1, "k") for _ in range(2)]
        with pytest.raises(RemoteError, match="InvalidRequest"):
            await add(client, 1, "bad key")
    assert ids[1] > ids[0]
    assert len(stored(store_db)) == 2


@pytest.mark.parametrize(
    ("key", "version"),
    [
        ("", "1.2"),
        ("x" * 65, "1.2"),
        ("a b", "1.2"),
        ("é", "1.2"),
        ("a/b", "1.2"),
        ("abc\n", "1.2"),
        (17, "1.2"),
        (["k"], "1.2"),
        ("k", "1.1"),
        ("k", "1.0"),
    ],
)
async def test_a_bad_key_is_an_invalid_request_and_stores_nothing(
    server: EventServer, db_path: Path, key: Any, version: str
) -> None:
    async with await connect_raw(server.url) as ws:
        reply = await raw_call(ws, request("C1", 1, key, version))
        assert reply["e"] == "InvalidRequest"
        assert "key" in reply["edesc"]
        ok = await raw_call(ws, request("C2", 2, "x" * 64))
        assert ok["r"] == "1"
    assert stored(str(db_path)) == [(1, 2)]


# -- several workers, several processes -------------------------------------------------------


async def with_users(db: str | Path, hashes: dict[str, str]) -> None:
    async with await open_store(db) as store:
        for name, password_hash in hashes.items():
            await add_user(store, name, password_hash)


async def on_worker(process: ServerProcess, slot: int) -> ClientConnection:
    """A connection the kernel gave worker ``slot`` of ``process`` (the worker logs each
    connection as it takes it, before it answers anything)."""
    for _ in range(200):
        ws = await connect_raw(process.url)
        ping = {"rid": "C0", "f": "futoin.evt.gen:1.1:ping", "p": {"echo": 1}, "sec": SEC}
        await raw_call(ws, json.dumps(ping))
        local = ws.local_address[1]
        found = re.search(
            rf" worker (\d+) \S+: connection from 127\.0\.0\.1:{local}\n", process.logged()
        )
        assert found is not None, f"the connection from port {local} is not logged"
        if int(found.group(1)) == slot:
            return ws
        await ws.close()
    raise AssertionError(f"no connection reached worker {slot}")


async def same_keys_on(connections: list[ClientConnection], count: int) -> list[list[str]]:
    """Each of ``count`` keys sent on every connection at once (pipelined); the answers."""

    async def send_all(ws: ClientConnection) -> list[str]:
        for n in range(count):
            await ws.send(request(f"C{n}", n, f"shared-{n}"))
        replies: dict[str, str] = {}
        async with asyncio.timeout(30):
            while len(replies) < count:
                reply = json.loads(await ws.recv())
                replies[reply["rid"]] = reply["r"]
        return [replies[f"C{n}"] for n in range(count)]

    return list(await asyncio.gather(*(send_all(ws) for ws in connections)))


async def test_keys_hold_across_two_workers(
    db_path: Path, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> None:
    await with_users(db_path, password_hashes)
    process = ServerProcess(db_path, 0, log_level="debug", workers=2)
    processes.append(process)
    connections = [await on_worker(process, 0), await on_worker(process, 1)]
    answers = await same_keys_on(connections, 300)
    for ws in connections:
        await ws.close()
    assert answers[0] == answers[1]
    assert len(stored(str(db_path))) == 300


async def test_keys_hold_across_two_processes_on_postgresql(
    pg_url: str, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> None:
    await with_users(pg_url, password_hashes)
    processes += [ServerProcess(pg_url, 0, workers=1) for _ in range(2)]
    connections = [await connect_raw(process.url) for process in processes]
    answers = await same_keys_on(connections, 300)
    for ws in connections:
        await ws.close()
    assert answers[0] == answers[1]
    assert len(stored(pg_url)) == 300


async def test_a_key_committed_while_the_batch_waited_for_the_lock_is_found(pg_url: str) -> None:
    """PostgreSQL: the statement that stores a batch reads its keys in the snapshot taken as
    it starts, before it waits for the partition's lock. A key another process commits in
    between is found all the same (the statement fails on it and is tried again): the
    batch's event is answered with that process's id, not stored again."""
    import psycopg

    from futoin_evt.storage.postgres.schema import append_lock_sql

    async with await open_store(pg_url) as store:
        other = await psycopg.AsyncConnection.connect(pg_url)
        try:
            await other.execute(append_lock_sql(0))  # its transaction holds the lock
            cursor = await other.execute(
                "INSERT INTO events (type, data, ts, key_user_id, key, key_at)"
                " VALUES ('T', '1', 'x', 1, 'raced', (extract(epoch FROM now()) * 1000)::bigint)"
                " RETURNING id"
            )
            row = await cursor.fetchone()
            assert row is not None
            appended = store.submit_append("T", "2", None, mine("raced"))
            waiting = "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            await until(
                lambda: bool(execute_sql(pg_url, waiting)),
                "the batch's statement waits for the lock",
                10,
                interval=0.01,
            )
            await other.commit()
            assert await appended == row[0]
        finally:
            await other.close()
    assert stored(pg_url) == [(row[0], 1)]
