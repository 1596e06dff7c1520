"""The producer's side of exactly-once: ``add_event(key=...)`` on both clients, ``futoin-evt
add --key``, and the :class:`ReliableProducer` through a proxy that cuts its connections."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.client.producer import ReliableProducer
from futoin_evt.client.sync import BlockingClient
from futoin_evt.server.app import EventServer
from futoin_evt.storage import open_store

from .support.servers import USERS, ServerFactory, ServerProcess, add_user
from .support.sql import execute_sql

pytestmark = pytest.mark.functional

SEC = f"alice:{USERS['alice']}"


def stored(db: str) -> list[tuple[int, str, object]]:
    """(id, type, data) of every stored event, by id."""
    rows = execute_sql(db, "SELECT id, type, data FROM events ORDER BY id")
    return [(int(event_id), str(kind), json.loads(data)) for event_id, kind, data in rows]


async def test_both_clients_add_an_event_once_per_key(server: EventServer, db_path: Path) -> None:
    async with await EventStreamClient.connect(server.url, credentials=SEC) as client:
        first = await client.add_event("ORDER", {"n": 1}, key="order-1")
        assert await client.add_event("ORDER", {"n": 1}, key="order-1") == first
        plain = await client.add_event("ORDER", {"n": 2})
        with pytest.raises(RemoteError, match="InvalidRequest"):
            await client.add_event("ORDER", {"n": 3}, key="no spaces")

    def blocking() -> list[int]:
        with BlockingClient(server.url, credentials=SEC) as sync:
            return [sync.add_event("ORDER", {"n": 1}, key="order-1"), sync.add_event("X", 4)]

    again, other = await asyncio.to_thread(blocking)
    assert again == first
    assert [row[0] for row in stored(str(db_path))] == [first, plain, other]


async def with_users(db: str | Path) -> None:
    from futoin_evt.auth.users import hash_password

    async with await open_store(db) as store:
        for name, password in USERS.items():
            await add_user(store, name, hash_password(password))


# -- the reliable producer through a proxy that cuts connections ---------------------------


class CuttingProxy:
    """Forwards connections on 127.0.0.1 to a port, and cuts each one (a TCP reset both
    ways) after a random number of bytes in either direction: requests cut short or lost,
    replies lost, handshakes broken."""

    def __init__(self, port: int, seed: int) -> None:
        self._port = port
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.cuts = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}/"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        except OSError:
            writer.transport.abort()
            return
        budgets = (self._random.randint(300, 12_000), self._random.randint(150, 3_000))
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer, budgets[0])),
            asyncio.create_task(self._pipe(up_reader, writer, budgets[1])),
        ]
        try:
            done, _pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            if any(task.result() for task in done):
                self.cuts += 1
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            writer.transport.abort()
            up_writer.transport.abort()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, budget: int) -> bool:
        """Copy until the end (False) or until ``budget`` bytes went through (True)."""
        while data := await source.read(65536):
            if len(data) >= budget:
                sink.write(data[:budget])
                return True
            budget -= len(data)
            sink.write(data)
            await sink.drain()
        return False


@pytest.fixture
async def cutting_proxy() -> AsyncIterator[list[CuttingProxy]]:
    proxies: list[CuttingProxy] = []
    yield proxies
    for proxy in proxies:
        await proxy.close()


EVENTS = 1000


async def produce_through_cuts(port: int, proxies: list[CuttingProxy], db: str) -> None:
    """1,000 events through a proxy that cuts connections: each is stored once, in the
    order added, and each future has its stored id."""
    proxy = CuttingProxy(port, seed=port)
    proxies.append(proxy)
    url = await proxy.start()
    async with ReliableProducer(url, credentials=SEC, reconnect_max=0.2) as producer:
        futures = [producer.submit("ORDER", n) for n in range(EVENTS)]
        async with asyncio.timeout(300):
            await producer.flush()
    ids = [future.result() for future in futures]
    assert stored(db) == [(event_id, "ORDER", n) for n, event_id in enumerate(ids)]
    assert ids == sorted(ids)
    assert proxy.cuts >= 5
    assert producer.sent > EVENTS  # some were sent again, and stored once
    assert producer.sessions > 5


async def test_the_reliable_producer_stores_each_event_once_in_order_through_cuts(
    start_server: ServerFactory, store_db: str, cutting_proxy: list[CuttingProxy]
) -> None:
    server = await start_server(db=store_db)
    await produce_through_cuts(server.port, cutting_proxy, store_db)


async def test_the_reliable_producer_through_cuts_to_two_workers(
    db_path: Path, cutting_proxy: list[CuttingProxy], processes: list[ServerProcess]
) -> None:
    """Connections land on either worker: an event sent again may reach the other worker
    while the first copy is still being committed by the first."""
    await with_users(db_path)
    process = ServerProcess(db_path, 0, workers=2)
    processes.append(process)
    await produce_through_cuts(process.port, cutting_proxy, str(db_path))


async def test_an_event_the_server_refuses_fails_alone(server: EventServer, db_path: Path) -> None:
    async with ReliableProducer(server.url, credentials=SEC, max_in_flight=1) as producer:
        before = producer.submit("ORDER", 1)
        refused = producer.submit("not a type", 2)
        after = producer.submit("ORDER", 3)
        await producer.flush()
    assert [before.result(), after.result()] == [1, 2]
    with pytest.raises(RemoteError, match="InvalidRequest"):
        refused.result()
    assert stored(str(db_path)) == [(1, "ORDER", 1), (2, "ORDER", 3)]


def test_a_producer_id_makes_a_valid_key() -> None:
    with pytest.raises(ValueError, match="producer id"):
        ReliableProducer("ws://127.0.0.1:1/", credentials=SEC, producer_id="no spaces")
    with pytest.raises(ValueError, match="producer id"):
        ReliableProducer("ws://127.0.0.1:1/", credentials=SEC, producer_id="x" * 44)
