"""The Kafka door's state shared by every ``serve`` process on one database: producer ids and
idempotent producers' last batches (across restarts and processes), the brokers with their
leases, and consumer groups whose members are connected to different processes."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any, Final

import pytest
from confluent_kafka import Consumer, Producer
from kafka.protocol import metadata, producer, sasl

from futoin_evt.kafka import wire
from futoin_evt.kafka.records import encode_batch
from futoin_evt.storage import open_store

from .support.kafka import RawKafka
from .support.servers import USERS, ServerProcess, add_user
from .support.waiting import until

pytestmark = pytest.mark.functional

TOPIC: Final = "events"


class Peer(RawKafka):
    """A raw connection to a Kafka door at ``HOST:PORT``, logged in as alice, that sends
    kafka-python's request types and decodes the answers (blocking: run it in a thread)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0
        self.call(sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN"))
        token = f"\0alice\0{USERS['alice']}".encode()
        answer = self.call(sasl.SaslAuthenticateRequest(version=1, auth_bytes=token))
        assert answer.error_code == wire.NONE, answer.error_message

    def call(self, request: Any) -> Any:
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="shared")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        frame = self.read_frame()
        assert frame, "closed by the server"
        response_type = wire.KNOWN[request.API_KEY][1]
        return response_type.decode(frame, version=request.version, header=True)

    def close(self) -> None:
        self.sock.close()


def _call(address: str, request: Any) -> Any:
    peer = Peer(address)
    try:
        return peer.call(request)
    finally:
        peer.close()


def producer_id(address: str) -> int:
    request = producer.InitProducerIdRequest(
        version=0, transactional_id=None, transaction_timeout_ms=1000
    )
    answer = _call(address, request)
    assert answer.error_code == wire.NONE
    return int(answer.producer_id)


def produced(address: str, producer_id: int, sequence: int, count: int) -> tuple[int, int]:
    """A batch of ``count`` records of the idempotent producer to partition 0: (error, base
    offset)."""
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
        (delta, None, b"record %d" % (sequence + delta), []) for delta in range(count)
    ]
    batch = encode_batch(
        0,
        records,
        timestamp_ms=1_700_000_000_000,
        log_append_time=False,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
    )
    request = producer.ProduceRequest
    topic = request.TopicProduceData
    answer = _call(
        address,
        request(
            version=3,
            transactional_id=None,
            acks=-1,
            timeout_ms=30_000,
            topic_data=[
                topic(
                    name=TOPIC, partition_data=[topic.PartitionProduceData(index=0, records=batch)]
                )
            ],
        ),
    )
    (part,) = answer.responses[0].partition_responses
    return int(part.error_code), int(part.base_offset)


def brokers(address: str) -> list[tuple[int, str]]:
    """(node id, ``HOST:PORT``) of each broker Metadata lists."""
    answer = _call(address, metadata.MetadataRequest(version=1, topics=[]))
    return sorted((b.node_id, f"{b.host}:{b.port}") for b in answer.brokers)


async def _served(db: str | Path, processes: list[ServerProcess]) -> ServerProcess:
    server = await asyncio.to_thread(ServerProcess, db, 0, "--kafka", "127.0.0.1:0")
    processes.append(server)
    assert server.kafka_address is not None
    return server


@pytest.fixture
async def users_db(store_db: str, password_hashes: dict[str, str]) -> str:
    """The database of each backend, with alice."""
    async with await open_store(store_db) as store:
        await add_user(store, "alice", password_hashes["alice"])
    return store_db


@pytest.fixture
async def pg_users(pg_url: str, password_hashes: dict[str, str]) -> str:
    """The PostgreSQL database, with alice."""
    async with await open_store(pg_url) as store:
        await add_user(store, "alice", password_hashes["alice"])
    return pg_url


# -- producers -------------------------------------------------------------------------------


async def test_a_producer_restarted_with_the_server_gets_a_new_id(
    users_db: str, processes: list[ServerProcess]
) -> None:
    server = await _served(users_db, processes)
    assert server.kafka_address is not None
    before = await asyncio.to_thread(producer_id, server.kafka_address)
    assert server.stop() == 0
    server = await _served(users_db, processes)
    assert server.kafka_address is not None
    after = await asyncio.to_thread(producer_id, server.kafka_address)
    assert after > before >= 0


async def test_a_batch_retried_after_a_restart_answers_its_first_offsets(
    users_db: str, processes: list[ServerProcess]
) -> None:
    server = await _served(users_db, processes)
    address = server.kafka_address
    assert address is not None
    pid = await asyncio.to_thread(producer_id, address)
    first = await asyncio.to_thread(produced, address, pid, 0, 3)
    second = await asyncio.to_thread(produced, address, pid, 3, 2)
    assert first[0] == second[0] == wire.NONE
    assert second[1] == first[1] + 3
    assert server.stop() == 0

    server = await _served(users_db, processes)
    address = server.kafka_address
    assert address is not None
    assert await asyncio.to_thread(produced, address, pid, 3, 2) == second  # a retry
    assert await asyncio.to_thread(produced, address, pid, 0, 3) == first
    gap = await asyncio.to_thread(produced, address, pid, 9, 1)
    assert gap[0] == wire.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await asyncio.to_thread(produced, address, pid, 5, 1) == (wire.NONE, second[1] + 2)


async def test_processes_on_one_database_give_distinct_producer_ids(
    pg_users: str, processes: list[ServerProcess]
) -> None:
    one = await _served(pg_users, processes)
    other = await _served(pg_users, processes)
    assert one.kafka_address is not None
    assert other.kafka_address is not None
    ids = [
        await asyncio.to_thread(producer_id, address)
        for _ in range(3)
        for address in (one.kafka_address, other.kafka_address)
    ]
    assert len(set(ids)) == len(ids)


async def test_a_producer_moving_to_another_process_keeps_its_numbers(
    pg_users: str, processes: list[ServerProcess]
) -> None:
    one = await _served(pg_users, processes)
    other = await _served(pg_users, processes)
    assert one.kafka_address is not None
    assert other.kafka_address is not None
    pid = await asyncio.to_thread(producer_id, one.kafka_address)
    first = await asyncio.to_thread(produced, one.kafka_address, pid, 0, 2)
    assert first[0] == wire.NONE
    assert await asyncio.to_thread(produced, other.kafka_address, pid, 0, 2) == first
    moved = await asyncio.to_thread(produced, other.kafka_address, pid, 2, 1)
    assert moved == (wire.NONE, first[1] + 2)
    back = await asyncio.to_thread(produced, one.kafka_address, pid, 3, 1)  # out of order here
    assert back == (wire.NONE, first[1] + 3)


# -- brokers ---------------------------------------------------------------------------------


async def test_processes_on_one_database_are_brokers_while_they_live(
    pg_users: str, processes: list[ServerProcess]
) -> None:
    one = await _served(pg_users, processes)
    other = await _served(pg_users, processes)
    assert one.kafka_address is not None
    assert other.kafka_address is not None
    both = {one.kafka_address, other.kafka_address}
    listed: dict[str, list[tuple[int, str]]] = {}

    async def both_listed_by_each() -> bool:
        for address in both:
            listed[address] = await asyncio.to_thread(brokers, address)
        return all({found for _, found in each} == both for each in listed.values())

    await until(both_listed_by_each, "each broker lists both", interval=0.5)
    assert listed[one.kafka_address] == listed[other.kafka_address]  # the same node ids
    assert len({node for node, _ in listed[one.kafka_address]}) == 2

    one.kill()
    left = other.kafka_address

    async def only_the_other() -> bool:
        return [address for _, address in await asyncio.to_thread(brokers, left)] == [left]

    await until(only_the_other, "the killed broker no longer listed", interval=0.5)


# -- consumer groups -------------------------------------------------------------------------


def _confluent(address: str, **more: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": USERS["alice"],
        **more,
    }


def _split_commit_resume(
    one: str, other: str
) -> tuple[list[set[int]], list[int], list[str], list[str]]:
    """Two members of a group, each bootstrapped to another process, read the 40 records
    of ``orders`` (4 partitions), commit and leave; a newcomer then reads what came after.
    The partitions each member was given, how many records each read, the records read,
    and those the newcomer read."""
    group = {
        "group.id": "billing",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        # a member whose leave went astray is gone within this (the newcomer waits 60 s);
        # shorter, a busy machine's late heartbeat would end a member and rebalance the group
        "session.timeout.ms": 20000,
        "heartbeat.interval.ms": 1000,
    }
    members = [Consumer(_confluent(address, **group)) for address in (one, other)]
    for member in members:
        member.subscribe(["orders"])
    for _ in range(600):  # until the group has settled: two partitions each
        for member in members:
            member.poll(0.05)
        if [len(member.assignment()) for member in members] == [2, 2]:
            break
    given = [{where.partition for where in member.assignment()} for member in members]
    producer = Producer(_confluent(one))
    for number in range(40):
        producer.produce("orders", value=str(number).encode(), partition=number % 4)
    assert producer.flush(30) == 0
    counts = [0, 0]
    seen: list[str] = []
    for _ in range(600):
        for at, member in enumerate(members):
            message = member.poll(0.05)
            if message is not None and message.error() is None:
                counts[at] += 1
                seen.append(bytes(message.value() or b"").decode())
        if sum(counts) == 40:
            break
    settled_as = [{where.partition for where in member.assignment()} for member in members]
    if sum(counts) < 40:  # say what the group looked like, rather than fail to commit
        for member in members:
            member.close()
        return [*given, *settled_as], counts, seen, []
    for member in members:
        member.commit(asynchronous=False)
        member.close()
    producer.produce("orders", value=b"later", partition=1)
    assert producer.flush(30) == 0
    newcomer = Consumer(_confluent(other, **group))
    newcomer.subscribe(["orders"])
    resumed: list[str] = []
    for _ in range(600):
        message = newcomer.poll(0.1)
        if message is not None and message.error() is None:
            resumed.append(bytes(message.value() or b"").decode())
            break
    newcomer.close()
    return given, counts, seen, resumed


async def test_a_group_spans_processes_and_a_new_member_resumes(
    pg_users: str, processes: list[ServerProcess]
) -> None:
    async with await open_store(pg_users) as store:
        await store.add_stream("orders", 4)
    one = await _served(pg_users, processes)
    other = await _served(pg_users, processes)
    assert one.kafka_address is not None
    assert other.kafka_address is not None
    given, counts, seen, resumed = await asyncio.to_thread(
        _split_commit_resume, one.kafka_address, other.kafka_address
    )
    # all 40 read (else: the assignments when settled and at the end, and the counts)
    assert len(given) == 2, (given, counts)
    assert given[0] | given[1] == {0, 1, 2, 3}  # one group: each partition to one member
    assert not given[0] & given[1]
    assert sorted(seen, key=int) == [str(n) for n in range(40)]
    assert all(counts), counts  # each member had partitions of its own
    assert resumed == ["later"]  # from the committed offsets, not from the start


async def test_the_workers_of_one_serve_are_one_broker(
    db_path: Path, password_hashes: dict[str, str], processes: list[ServerProcess]
) -> None:
    async with await open_store(db_path) as store:
        await add_user(store, "alice", password_hashes["alice"])
    server = await asyncio.to_thread(ServerProcess, db_path, 0, "--kafka", "127.0.0.1:0", workers=2)
    processes.append(server)
    assert server.kafka_address is not None
    for _ in range(4):  # connections land on either worker
        assert await asyncio.to_thread(brokers, server.kafka_address) == [(0, server.kafka_address)]
