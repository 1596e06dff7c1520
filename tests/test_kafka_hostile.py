# mypy: disallow-untyped-calls=False
# (kafka-python's clients and record builders are untyped)
"""Hostile peers at the Kafka door, as bytes on a socket: each attack ends in Kafka's error or a
closed connection within the door's limits (:class:`KafkaLimits`), never in a crash, a leak or
a starved neighbour. A kafka-python producer logged in before each attack is still served
after it, the server logged no error, and every connection slot is free again."""

from __future__ import annotations

import asyncio
import logging
import random
import select
import socket
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import closing, suppress
from dataclasses import replace
from functools import partial
from typing import Any, Final

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol import admin, consumer, metadata, producer, sasl
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from futoin_evt.kafka import wire
from futoin_evt.kafka.compression import GZIP, LZ4, SNAPPY, ZSTD
from futoin_evt.kafka.config import KafkaConfig, KafkaLimits
from futoin_evt.kafka.connection import MAX_BEFORE_LOGIN, KafkaConnection
from futoin_evt.kafka.records import encode_batch
from futoin_evt.server.app import EventServer
from futoin_evt.slots import Slots

from .support.kafka import RawKafka, python_conf
from .support.servers import USERS, ServerFactory
from .support.waiting import until

pytestmark = pytest.mark.functional

KIB: Final = 1024
MIB: Final = 1024 * KIB
TOPIC: Final = "events"
LIMITS: Final = KafkaLimits(
    max_handshakes=4,
    max_request_bytes=256 * KIB,
    max_in_flight=8,
    max_unread_bytes=64 * KIB,
    max_fetch_bytes=64 * KIB,
    max_batch_bytes=1 * MIB,
)


# -- the door, an honest client, and a raw peer --------------------------------------------


@pytest.fixture
async def door(start_server: ServerFactory, request: pytest.FixtureRequest) -> EventServer:
    """A server whose Kafka door has small limits (``LIMITS``, changed by an indirect
    parameter: a dict of KafkaLimits fields)."""
    changes: dict[str, Any] = getattr(request, "param", {})
    return await start_server(kafka=KafkaConfig(port=0, limits=replace(LIMITS, **changes)))


def slots(server: EventServer) -> Slots[KafkaConnection]:
    assert server.kafka is not None
    return server.kafka.slots


class Honest:
    """A kafka-python producer, logged in before an attack."""

    def __init__(self, server: EventServer) -> None:
        self.producer = KafkaProducer(**python_conf(server), acks=1)
        self.sent = 0
        self.send()

    def send(self) -> None:
        """One record, acknowledged (``get`` raises unless it is)."""
        self.sent += 1
        self.producer.send(TOPIC, value=b"honest %d" % self.sent).get(30)


@pytest.fixture
async def honest(door: EventServer, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Honest]:
    """An honest producer open across the attack: it is served after it, the server logged
    no error meanwhile, and every Kafka connection slot is free once it closes."""
    client = await asyncio.to_thread(Honest, door)
    yield client
    await asyncio.to_thread(client.send)
    await asyncio.to_thread(client.producer.close, 30)
    await until(lambda: len(slots(door)) == 0, "every Kafka connection slot free")
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == [], [record.getMessage() for record in errors]


class Peer(RawKafka):
    """A raw connection that sends kafka-python's request types and decodes the answers
    (blocking: run it in a thread)."""

    def frame(self, request: Any) -> bytes:
        """The request framed with the next correlation id."""
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="hostile")
        return bytes(request.encode(header=True, framed=True))

    def send(self, *requests: Any) -> None:
        self.sock.sendall(b"".join(self.frame(request) for request in requests))

    def answer(self, request: Any) -> Any:
        """The next answer, as the response type of ``request``."""
        frame = self.read_frame()
        assert frame, "closed by the server"
        response_type = wire.KNOWN[request.API_KEY][1]
        return response_type.decode(frame, version=request.version, header=True)

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.answer(request)

    def login(self, user: str = "alice") -> None:
        handshake = self.call(sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN"))
        assert handshake.error_code == wire.NONE
        authenticated = self.call(sasl.SaslAuthenticateRequest(version=1, auth_bytes=token(user)))
        assert authenticated.error_code == wire.NONE, authenticated.error_message

    def closed_by_server(self) -> bool:
        """Whether the server closes the connection (reading past anything it answers; False
        when it is still open after the socket's timeout)."""
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
        return True

    def send_or_closed(self, payload: bytes) -> None:
        """Send what the server may refuse before it has all of it."""
        with suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(payload)


def token(user: str) -> bytes:
    """``user``'s SASL PLAIN token."""
    return f"\0{user}\0{USERS[user]}".encode()


async def attack(server: EventServer, run: Callable[[Peer], Any], *, logged_in: bool) -> Any:
    """``run`` with a raw peer (logged in as alice, or not), in a thread; the peer is closed
    after."""

    def go() -> Any:
        with closing(Peer(server)) as peer:
            if logged_in:
                peer.login()
            return run(peer)

    return await asyncio.to_thread(go)


def metadata_request() -> Any:
    request = metadata.MetadataRequest
    return request(version=1, topics=[request.MetadataRequestTopic(name=TOPIC)])


def high_watermark(peer: Peer) -> int:
    """The partition's next offset (ListOffsets LATEST)."""
    request = consumer.ListOffsetsRequest
    topic = request.ListOffsetsTopic
    answer = peer.call(
        request(
            version=1,
            replica_id=-1,
            topics=[
                topic(
                    name=TOPIC,
                    partitions=[topic.ListOffsetsPartition(partition_index=0, timestamp=-1)],
                )
            ],
        )
    )
    (part,) = answer.topics[0].partitions
    assert part.error_code == wire.NONE
    return int(part.offset)


def produce_request(records: bytes) -> Any:
    request = producer.ProduceRequest
    topic = request.TopicProduceData
    return request(
        version=3,
        transactional_id=None,
        acks=1,
        timeout_ms=30_000,
        topic_data=[
            topic(name=TOPIC, partition_data=[topic.PartitionProduceData(index=0, records=records)])
        ],
    )


def produced(peer: Peer, records: bytes) -> tuple[int, int]:
    """Produce ``records`` to partition 0: (error, base offset)."""
    answer = peer.call(produce_request(records))
    (part,) = answer.responses[0].partition_responses
    return int(part.error_code), int(part.base_offset)


def batch(*values: bytes, compression: int = 0) -> bytes:
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
        (delta, None, value, []) for delta, value in enumerate(values)
    ]
    return encode_batch(
        0, records, timestamp_ms=1_700_000_000_000, log_append_time=False, compression=compression
    )


def join_request(protocols: Sequence[tuple[str, bytes]]) -> Any:
    request = consumer.JoinGroupRequest
    return request(
        version=1,
        group_id="crowded",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[request.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols],
    )


def fetch_request(offset: int = 0) -> Any:
    request = consumer.FetchRequest
    topic = request.FetchTopic
    return request(
        version=4,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=MIB,
        isolation_level=0,
        topics=[
            topic(
                topic=TOPIC,
                partitions=[
                    topic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=MIB)
                ],
            )
        ],
    )


def connection_of(server: EventServer, peer: Peer) -> KafkaConnection:
    """The server's side of ``peer``'s connection."""
    host, port = peer.sock.getsockname()[:2]
    (connection,) = [c for c in slots(server) if c.peer == f"{host}:{port}"]
    return connection


# -- frames that are not requests ----------------------------------------------------------

SIZES = {
    "2 GiB": 0x7FFF_FFFF,
    "max_request_bytes + 1": LIMITS.max_request_bytes + 1,
    "negative": -1,
}


@pytest.mark.parametrize("logged_in", [False, True], ids=["before login", "after login"])
@pytest.mark.parametrize("size", list(SIZES))
async def test_a_size_beyond_the_limit_closes_before_the_body_comes(
    door: EventServer, honest: Honest, size: str, logged_in: bool
) -> None:
    def run(peer: Peer) -> bool:
        peer.send_or_closed(struct.pack(">i", SIZES[size]))  # and no body: it is not awaited
        return peer.closed_by_server()

    assert await attack(door, run, logged_in=logged_in)


async def test_a_request_of_exactly_max_request_bytes_is_served(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> int:
        values = [b"v" * KIB] * (LIMITS.max_request_bytes // (KIB + 64) - 1)
        size = 0
        while True:  # the last value's length (its varints grow with it) that fills the limit
            request = produce_request(batch(*values, b"v" * size))
            framed = peer.frame(request)
            if len(framed) - 4 == LIMITS.max_request_bytes:
                break
            size += LIMITS.max_request_bytes - (len(framed) - 4)
        peer.sock.sendall(framed)
        (part,) = peer.answer(request).responses[0].partition_responses
        return int(part.error_code)

    assert await attack(door, run, logged_in=True) == wire.NONE


@pytest.mark.parametrize("door", [{"max_request_bytes": 4 * MIB}], indirect=True)
async def test_before_a_login_a_request_is_at_most_kafkas_sasl_receive_size(
    door: EventServer, honest: Honest
) -> None:
    """As Kafka's ``sasl.server.max.receive.size``: a peer without a user cannot make the
    door hold ``max_request_bytes`` for it; once logged in, it may send more."""

    def before(peer: Peer) -> bool:
        peer.send_or_closed(struct.pack(">i", MAX_BEFORE_LOGIN + 1))
        return peer.closed_by_server()

    assert await attack(door, before, logged_in=False)

    def after(peer: Peer) -> int:
        records = batch(*[bytes(KIB)] * (MAX_BEFORE_LOGIN // KIB))
        assert len(records) > MAX_BEFORE_LOGIN
        error, _ = produced(peer, records)
        return error

    assert await attack(door, after, logged_in=True) == wire.NONE


GARBAGE = {
    "an HTTP request": b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n",
    "a TLS ClientHello": bytes.fromhex("160301020001") + bytes(512),
    "an empty frame": struct.pack(">i", 0),
    "a frame shorter than a header": struct.pack(">i", 7) + bytes(7),
    "a client id longer than its frame": struct.pack(">ihhih", 12, 3, 1, 1, 500) + b"xx",
    "random bytes": random.Random(7).randbytes(4096),
    "random bytes in a frame": struct.pack(">i", 4096) + random.Random(8).randbytes(4096),
}


@pytest.mark.parametrize("logged_in", [False, True], ids=["before login", "after login"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
async def test_garbage_closes_the_connection(
    door: EventServer, honest: Honest, garbage: str, logged_in: bool
) -> None:
    def run(peer: Peer) -> bool:
        peer.send_or_closed(GARBAGE[garbage])
        return peer.closed_by_server()

    assert await attack(door, run, logged_in=logged_in)


# -- APIs and versions not served ----------------------------------------------------------


def raw_request(api_key: int, version: int, body: bytes = b"") -> bytes:
    """A framed request with a non-flexible header (correlation id 1, client id "raw")."""
    payload = struct.pack(">hhih", api_key, version, 1, 3) + b"raw" + body
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("logged_in", [False, True], ids=["before login", "after login"])
@pytest.mark.parametrize(
    ("api_key", "version"),
    [(999, 0), (-1, 0), (wire.METADATA, 999), (wire.PRODUCE, -1), (wire.SASL_HANDSHAKE, 99)],
    ids=["key 999", "key -1", "Metadata v999", "Produce v-1", "SaslHandshake v99"],
)
async def test_an_api_or_version_no_kafka_has_closes_the_connection(
    door: EventServer, honest: Honest, api_key: int, version: int, logged_in: bool
) -> None:
    def run(peer: Peer) -> bool:
        peer.send_or_closed(raw_request(api_key, version, bytes(16)))
        return peer.closed_by_server()

    assert await attack(door, run, logged_in=logged_in)


async def test_a_version_not_served_gets_unsupported_version_and_the_connection_stays(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> tuple[int, int]:
        served = wire.APIS[wire.HEARTBEAT].max_version
        refused = peer.call(
            consumer.HeartbeatRequest(
                version=served + 1, group_id="g", generation_id=1, member_id="m"
            )
        )
        return refused.error_code, len(peer.call(metadata_request()).topics)

    assert await attack(door, run, logged_in=True) == (wire.UNSUPPORTED_VERSION, 1)


@pytest.mark.parametrize("version", [-1, -32768, 4, 32767])
async def test_api_versions_in_a_version_not_served_is_answered_in_version_0(
    door: EventServer, honest: Honest, version: int
) -> None:
    def run(peer: Peer) -> tuple[int, int]:
        peer.sock.sendall(raw_request(wire.API_VERSIONS, version))
        frame = peer.read_frame()
        answer = metadata.ApiVersionsResponse.decode(frame, version=0, header=True)
        return answer.header.correlation_id, answer.error_code

    assert await attack(door, run, logged_in=False) == (1, wire.UNSUPPORTED_VERSION)


# -- bodies that end early -----------------------------------------------------------------

#: A request of each API served but ApiVersions (answered without its body) and ListGroups
#: (whose versions served have no body), with its fields filled in.
FILLED: Final[dict[int, Any]] = {
    wire.PRODUCE: produce_request(batch(b"value")),
    wire.FETCH: fetch_request(),
    wire.LIST_OFFSETS: consumer.ListOffsetsRequest(
        version=1,
        replica_id=-1,
        topics=[
            consumer.ListOffsetsRequest.ListOffsetsTopic(
                name=TOPIC,
                partitions=[
                    consumer.ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, timestamp=-1
                    )
                ],
            )
        ],
    ),
    wire.METADATA: metadata_request(),
    wire.OFFSET_COMMIT: consumer.OffsetCommitRequest(
        version=2,
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="m",
        retention_time_ms=-1,
    ),
    wire.OFFSET_FETCH: consumer.OffsetFetchRequest(version=1, group_id="g"),
    wire.FIND_COORDINATOR: metadata.FindCoordinatorRequest(version=1, key="g", key_type=0),
    wire.JOIN_GROUP: consumer.JoinGroupRequest(
        version=1,
        group_id="g",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[
            consumer.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"meta")
        ],
    ),
    wire.HEARTBEAT: consumer.HeartbeatRequest(
        version=1, group_id="g", generation_id=1, member_id="m"
    ),
    wire.LEAVE_GROUP: consumer.LeaveGroupRequest(version=1, group_id="g", member_id="m"),
    wire.SYNC_GROUP: consumer.SyncGroupRequest(
        version=1, group_id="g", generation_id=1, member_id="m", assignments=[]
    ),
    wire.DESCRIBE_GROUPS: admin.DescribeGroupsRequest(version=1, groups=["g"]),
    wire.SASL_HANDSHAKE: sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN"),
    wire.CREATE_TOPICS: admin.CreateTopicsRequest(
        version=1,
        topics=[
            admin.CreateTopicsRequest.CreatableTopic(
                name="t", num_partitions=1, replication_factor=1, assignments=[], configs=[]
            )
        ],
        timeout_ms=1000,
        validate_only=False,
    ),
    wire.DELETE_TOPICS: admin.DeleteTopicsRequest(version=1, topic_names=["t"], timeout_ms=1000),
    wire.INIT_PRODUCER_ID: producer.InitProducerIdRequest(
        version=0, transactional_id=None, transaction_timeout_ms=1000
    ),
    wire.DESCRIBE_CONFIGS: admin.DescribeConfigsRequest(
        version=1,
        resources=[
            admin.DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=2, resource_name=TOPIC, configuration_keys=None
            )
        ],
        include_synonyms=False,
    ),
    wire.SASL_AUTHENTICATE: sasl.SaslAuthenticateRequest(version=1, auth_bytes=token("alice")),
    wire.CREATE_PARTITIONS: admin.CreatePartitionsRequest(
        version=1,
        topics=[
            admin.CreatePartitionsRequest.CreatePartitionsTopic(
                name=TOPIC, count=2, assignments=None
            )
        ],
        timeout_ms=1000,
        validate_only=True,
    ),
    wire.DESCRIBE_CLUSTER: admin.DescribeClusterRequest(
        version=0, include_cluster_authorized_operations=False
    ),
}


def test_every_api_served_has_a_filled_request() -> None:
    assert set(FILLED) | {wire.API_VERSIONS, wire.LIST_GROUPS} == set(wire.APIS)


@pytest.mark.parametrize("api_key", list(FILLED), ids=[wire.APIS[key].name for key in FILLED])
async def test_a_body_that_ends_early_closes_the_connection(
    door: EventServer, honest: Honest, api_key: int
) -> None:
    """The frame ends a byte early (inside the last field, a string or bytes for most), at
    half its body, or right after its header."""
    request = FILLED[api_key]
    body = len(bytes(request.encode()))

    def run(peer: Peer, cut: Callable[[int], int]) -> bool:
        if api_key == wire.SASL_AUTHENTICATE:
            peer.call(sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN"))
        full = peer.frame(request)[4:]
        payload = full[: len(full) - body + cut(body)]
        peer.send_or_closed(struct.pack(">i", len(payload)) + payload)
        return peer.closed_by_server()

    before_login = api_key in (wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE)
    for cut in (lambda size: size - 1, lambda size: size // 2, lambda _size: 0):
        assert await attack(door, partial(run, cut=cut), logged_in=not before_login)


#: A null where the message types' stubs (and Kafka's schemas) allow none.
NULL: Final[Any] = None
NULLS: Final = {
    "a topic name": metadata.MetadataRequest(
        version=1, topics=[metadata.MetadataRequest.MetadataRequestTopic(name=NULL)]
    ),
    "a topic to delete": admin.DeleteTopicsRequest(version=1, topic_names=[NULL], timeout_ms=1000),
    "a group id": consumer.OffsetFetchRequest(version=1, group_id=NULL, topics=[]),
    "a protocol's metadata": join_request([("range", NULL)]),
}


@pytest.mark.parametrize("field", list(NULLS))
async def test_a_null_where_kafka_allows_none_closes_the_connection(
    door: EventServer, honest: Honest, field: str
) -> None:
    def run(peer: Peer) -> bool:
        peer.send_or_closed(peer.frame(NULLS[field]))
        return peer.closed_by_server()

    assert await attack(door, run, logged_in=True)


# -- Produce ---------------------------------------------------------------------------------


async def test_a_batch_failing_its_crc_is_corrupt_and_nothing_is_stored(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> tuple[int, int, int, int, int]:
        before = high_watermark(peer)
        corrupt = bytearray(batch(b"first", b"second"))
        corrupt[-3] ^= 0xFF  # a byte of the last record's value
        error, _ = produced(peer, bytes(corrupt))
        after = high_watermark(peer)
        good, base = produced(peer, batch(b"good"))
        return before, error, after, good, base

    before, error, after, good, base = await attack(door, run, logged_in=True)
    assert error == wire.CORRUPT_MESSAGE
    assert after == before  # nothing stored
    assert (good, base) == (wire.NONE, before)  # and the connection still serves


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=["gzip", "snappy", "lz4", "zstd"])
async def test_a_decompression_bomb_is_corrupt_and_nothing_is_stored(
    door: EventServer, honest: Honest, codec: int
) -> None:
    bomb = batch(bytes(2 * LIMITS.max_batch_bytes), compression=codec)
    assert len(bomb) < LIMITS.max_request_bytes // 2

    def run(peer: Peer) -> tuple[int, int, int]:
        before = high_watermark(peer)
        error, _ = produced(peer, bomb)
        return before, error, high_watermark(peer)

    before, error, after = await attack(door, run, logged_in=True)
    assert error == wire.CORRUPT_MESSAGE
    assert after == before


@pytest.mark.parametrize("magic", [0, 1])
async def test_a_message_set_of_magic_0_or_1_is_unsupported_for_its_format(
    door: EventServer, honest: Honest, magic: int
) -> None:
    builder = LegacyRecordBatchBuilder(magic, 0, MIB)
    builder.append(0, 1_700_000_000_000 if magic else None, b"key", b"old format")
    message_set = bytes(builder.build())

    def run(peer: Peer) -> tuple[int, int, int]:
        before = high_watermark(peer)
        error, _ = produced(peer, message_set)
        return before, error, high_watermark(peer)

    before, error, after = await attack(door, run, logged_in=True)
    assert error == wire.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert after == before


# -- slow peers and peers that do not read -------------------------------------------------


@pytest.mark.parametrize("door", [{"login_timeout": 1.0}], indirect=True)
@pytest.mark.parametrize("chatter", [False, True], ids=["a trickled frame", "ApiVersions"])
async def test_a_slow_sender_is_closed_by_the_login_timeout(
    door: EventServer, honest: Honest, chatter: bool
) -> None:
    """A peer that trickles a frame byte by byte (or asks ApiVersions again and again) and
    never logs in: the login timeout closes it, whatever it sends."""

    def run(peer: Peer) -> int:
        if not chatter:
            peer.sock.sendall(struct.pack(">i", 100_000))  # a frame that never ends
        sent = 0
        while True:
            try:
                peer.sock.sendall(raw_request(wire.API_VERSIONS, 0) if chatter else b"x")
            except (BrokenPipeError, ConnectionResetError):
                return sent
            sent += 1
            readable, _, _ = select.select([peer.sock], [], [], 0.05)  # the trickle's pace
            if readable:
                try:
                    if peer.sock.recv(65536) == b"":
                        return sent
                except ConnectionResetError:
                    return sent

    sent = await attack(door, run, logged_in=False)
    assert 0 < sent < 100_000


@pytest.mark.parametrize("door", [{"max_request_bytes": 4 * MIB}], indirect=True)
async def test_a_peer_that_never_reads_is_not_read_from_and_its_answers_stay_bounded(
    door: EventServer, honest: Honest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fetch after Fetch, never reading: once ``max_unread_bytes`` are unread the door stops
    reading the peer's requests; what it holds for it stays within its limits, and another
    consumer is served meanwhile."""
    assert door.kafka is not None
    handlers = door.kafka.broker.handlers
    fetch = handlers[wire.FETCH]
    fetches = 0

    async def counted(who: Any, request: Any) -> Any:
        nonlocal fetches
        fetches += 1
        return await fetch(who, request)

    monkeypatch.setitem(handlers, wire.FETCH, counted)
    value = bytes(12 * KIB)

    def fill(peer: Peer) -> int:
        error, base = produced(peer, batch(*[value] * 4))  # each Fetch answers ~48 KiB
        assert error == wire.NONE
        return base

    base = await attack(door, fill, logged_in=True)
    peer = await asyncio.to_thread(Peer, door)
    try:
        peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await asyncio.to_thread(peer.login)
        requests = 500  # ~24 MiB of answers: far beyond the socket buffers
        flood = b"".join(peer.frame(fetch_request(base)) for _ in range(requests))
        sending = asyncio.create_task(asyncio.to_thread(peer.sock.sendall, flood))
        connection = connection_of(door, peer)
        transport = connection._transport  # the server's side of the socket
        assert transport is not None
        await until(
            lambda: (
                transport.get_write_buffer_size() > LIMITS.max_unread_bytes
                and not transport.is_reading()
            ),
            "the door holds max_unread_bytes for the peer and stops reading it",
        )
        # past the mark, only the answers of the requests under way are added
        most = LIMITS.max_unread_bytes + (LIMITS.max_in_flight + 1) * (LIMITS.max_fetch_bytes + KIB)
        assert transport.get_write_buffer_size() <= most
        # another consumer is served meanwhile, and the peer is still not read
        records = await asyncio.to_thread(consume, door, base, 4)
        assert records == [value] * 4
        assert not transport.is_reading()
        assert transport.get_write_buffer_size() <= most
        assert fetches < requests
    finally:
        peer.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread still sending, if one is
        peer.close()
    with suppress(OSError):
        await sending


def consume(server: EventServer, offset: int, count: int) -> list[bytes]:
    """``count`` records of partition 0 from ``offset``, with kafka-python."""
    reader = KafkaConsumer(**python_conf(server), consumer_timeout_ms=30_000)
    try:
        where = TopicPartition(TOPIC, 0)
        reader.assign([where])
        reader.seek(where, offset)
        values: list[bytes] = []
        for record in reader:
            values.append(record.value)
            if len(values) == count:
                break
        return values
    finally:
        reader.close()


async def test_connections_that_never_log_in_only_displace_one_another(
    door: EventServer, honest: Honest
) -> None:
    """More connections than handshake slots, none logging in: the oldest is cut for each
    new one, and a new honest client still logs in and is served."""
    budget = LIMITS.max_handshakes
    assert budget is not None
    peers = [await asyncio.to_thread(Peer, door) for _ in range(budget)]
    try:
        await until(lambda: slots(door).handshakes == budget, "every handshake slot taken")
        newcomers = [await asyncio.to_thread(Peer, door) for _ in range(3 * budget)]
        peers += newcomers
        await until(lambda: slots(door).evicted == 3 * budget, "the oldest cut for each new one")
        assert slots(door).handshakes == budget
        assert all(await asyncio.to_thread(lambda: [p.closed_by_server() for p in peers[:-budget]]))
        # a new client logs in among them
        late = await asyncio.to_thread(Honest, door)
        await asyncio.to_thread(late.producer.close, 30)
    finally:
        for peer in peers:
            peer.close()


# -- pipelining ------------------------------------------------------------------------------


async def test_a_thousand_pipelined_requests_run_max_in_flight_at_once_answered_in_order(
    door: EventServer, honest: Honest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1000 ListGroups at once: at most ``max_in_flight`` of them run at a time, each group
    finished last to first, and the answers come in the order of the requests."""
    assert door.kafka is not None
    handlers = door.kafka.broker.handlers
    list_groups = handlers[wire.LIST_GROUPS]
    waiting: list[asyncio.Future[None]] = []
    running = peak = 0

    async def gated(who: Any, request: Any) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append(gate)
        try:
            await gate
        finally:
            running -= 1
        return await list_groups(who, request)

    monkeypatch.setitem(handlers, wire.LIST_GROUPS, gated)
    count = 1000
    in_flight = LIMITS.max_in_flight
    peer = await asyncio.to_thread(Peer, door)
    try:
        await asyncio.to_thread(peer.login)
        request = admin.ListGroupsRequest(version=1)
        first = peer.correlation + 1
        flood = b"".join(peer.frame(request) for _ in range(count))

        def read_all() -> list[int]:
            peer.sock.sendall(flood)
            return [peer.answer(request).header.correlation_id for _ in range(count)]

        reading = asyncio.create_task(asyncio.to_thread(read_all))
        released = 0
        while released < count:
            batch_size = min(in_flight, count - released)

            def all_running(size: int = batch_size) -> bool:
                return len(waiting) == size

            await until(all_running, f"{batch_size} requests running")
            gates = waiting[:]
            waiting.clear()
            for gate in reversed(gates):  # the last one first
                gate.set_result(None)
            released += len(gates)
        answered = await reading
    finally:
        peer.close()
    assert peak == in_flight
    assert answered == list(range(first, first + count))


# -- groups and SASL -------------------------------------------------------------------------


@pytest.mark.parametrize("door", [{"max_request_bytes": 4 * MIB}], indirect=True)
async def test_join_group_with_a_huge_number_of_protocols_and_metadata(
    door: EventServer, honest: Honest
) -> None:
    """A member with 2000 protocols and 2 MiB of metadata joins; another whose protocols
    share none of them is refused INCONSISTENT_GROUP_PROTOCOL; the door serves on."""
    many = [(f"p{number}", b"m" * KIB) for number in range(2000)]
    others = [(f"q{number}", b"") for number in range(2000)]

    def run(peer: Peer) -> tuple[int, int, int]:
        joined = peer.call(join_request(many))
        with closing(Peer(door)) as second:
            second.login()
            refused = second.call(join_request(others))
        leave = peer.call(
            consumer.LeaveGroupRequest(version=1, group_id="crowded", member_id=joined.member_id)
        )
        return joined.error_code, refused.error_code, leave.error_code

    assert await attack(door, run, logged_in=True) == (
        wire.NONE,
        23,  # INCONSISTENT_GROUP_PROTOCOL
        wire.NONE,
    )


@pytest.mark.parametrize("door", [{"max_request_bytes": 4 * MIB}], indirect=True)
async def test_join_group_with_as_many_protocols_as_a_request_holds_starves_no_one(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> tuple[int, int]:
        joined = peer.call(join_request([(f"p{number}", b"") for number in range(30_000)]))
        with closing(Peer(door)) as second:
            second.login()
            others = [(f"q{number}", b"") for number in range(30_000)]
            return joined.error_code, second.call(join_request(others)).error_code

    assert await attack(door, run, logged_in=True) == (wire.NONE, 23)


async def test_sasl_authenticate_before_the_handshake_is_refused_and_closed(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> tuple[int, bool]:
        answer = peer.call(sasl.SaslAuthenticateRequest(version=1, auth_bytes=token("alice")))
        return answer.error_code, peer.closed_by_server()

    assert await attack(door, run, logged_in=False) == (wire.SASL_AUTHENTICATION_FAILED, True)


async def test_a_second_sasl_authenticate_after_login_is_refused_and_closed(
    door: EventServer, honest: Honest
) -> None:
    def run(peer: Peer) -> tuple[int, bool]:
        answer = peer.call(sasl.SaslAuthenticateRequest(version=1, auth_bytes=token("bob")))
        return answer.error_code, peer.closed_by_server()

    assert await attack(door, run, logged_in=True) == (wire.SASL_AUTHENTICATION_FAILED, True)


async def test_two_pipelined_logins_log_in_once(door: EventServer, honest: Honest) -> None:
    """A SaslAuthenticate as bob (whose password takes a check) and one as alice (whose
    password the honest producer's login had checked) sent at once: bob logs in, alice is
    refused, and the connection is closed; it is never alice's behind bob's answer."""

    def run(peer: Peer) -> tuple[int, int, bool]:
        handshake = sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN")
        assert peer.call(handshake).error_code == wire.NONE
        bob = sasl.SaslAuthenticateRequest(version=1, auth_bytes=token("bob"))
        alice = sasl.SaslAuthenticateRequest(version=1, auth_bytes=token("alice"))
        peer.send(bob, alice)
        first, second = peer.answer(bob), peer.answer(alice)
        return first.error_code, second.error_code, peer.closed_by_server()

    assert await attack(door, run, logged_in=False) == (
        wire.NONE,
        wire.SASL_AUTHENTICATION_FAILED,
        True,
    )
