"""The Kafka door with Kafka's own clients (kafka-python, confluent-kafka, aiokafka): records
produced and consumed, one log with the other doors, groups, rights, and what no client
sends."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError as AioKafkaError
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as PyTopicPartition

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.rights import Right
from futoin_evt.kafka.config import KafkaConfig
from futoin_evt.log.schemas import OPERATOR
from futoin_evt.server.app import EventServer

from .support.kafka import RawKafka, confluent_conf, python_conf
from .support.schemas import V1
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional


@pytest.fixture
async def kafka_server(start_server: ServerFactory) -> EventServer:
    """A server with the Kafka door on a free port; alice and bob may read and write."""
    return await start_server(kafka=KafkaConfig(port=0))


async def _ftn18(server: EventServer, user: str = "alice") -> EventStreamClient:
    return await EventStreamClient.connect(server.url, credentials=f"{user}:{USERS[user]}")


async def _add_reader(server: EventServer, name: str, rights: Right) -> None:
    """A user ``name`` (password: ``USERS['bob']``) with ``rights`` on every stream."""
    user = await server.store.add_user(name, hash_password(USERS["bob"]))
    await server.store.grant(user, "*", int(rights))
    await server.access.changed_here()


def _consume_all(conf: dict[str, Any], topic: str, partition: int, count: int) -> list[Any]:
    """``count`` records of the partition from its start, with kafka-python."""
    consumer = KafkaConsumer(**conf, consumer_timeout_ms=10_000)
    try:
        where = PyTopicPartition(topic, partition)
        consumer.assign([where])
        consumer.seek_to_beginning(where)
        found = []
        for record in consumer:
            found.append(record)
            if len(found) == count:
                break
        return found
    finally:
        consumer.close()


async def test_a_record_from_kafka_python_is_one_event_at_every_door(
    kafka_server: EventServer,
) -> None:
    conf = python_conf(kafka_server)
    headers = [("h", b"v"), ("h", b"\xff\x00"), ("trace", b"t-1")]

    def produce() -> Any:
        producer = KafkaProducer(**conf)
        try:
            return producer.send("events", key=b"k1", value=b"\x00hello", headers=headers).get(10)
        finally:
            producer.close()

    sent = await asyncio.to_thread(produce)
    (record,) = await asyncio.to_thread(_consume_all, conf, "events", 0, 1)
    assert (record.offset, record.key, record.value) == (sent.offset, b"k1", b"\x00hello")
    assert record.headers == headers
    # the same event, by the same id, through FTN18: opaque bytes of type EVENT
    async with await _ftn18(kafka_server) as client:
        await client.register_consumer("C")
        (event,) = await client.poll_events("C")
    assert event.id == sent.offset
    assert event.type == "EVENT"
    assert event.data == {"$binary": "AGhlbGxv"}


async def test_an_ftn18_event_is_a_record_with_its_type_and_json(
    kafka_server: EventServer,
) -> None:
    async with await _ftn18(kafka_server) as client:
        event_id = await client.add_event("ORDER_PLACED", {"order": 7, "items": ["a"]})
    (record,) = await asyncio.to_thread(_consume_all, python_conf(kafka_server), "events", 0, 1)
    assert record.offset == event_id
    assert record.key is None
    assert json.loads(record.value) == {"order": 7, "items": ["a"]}
    assert record.headers == [("ce_type", b"ORDER_PLACED"), ("content-type", b"application/json")]


async def test_a_json_record_with_its_type_header_is_an_ftn18_event(
    kafka_server: EventServer,
) -> None:
    def produce() -> Any:
        producer = KafkaProducer(**python_conf(kafka_server))
        try:
            headers = [("ce_type", b"PAID"), ("content-type", b"application/json")]
            return producer.send("events", value=b'{"sum": 5}', headers=headers).get(10)
        finally:
            producer.close()

    sent = await asyncio.to_thread(produce)
    async with await _ftn18(kafka_server) as client:
        await client.register_consumer("C")
        (event,) = await client.poll_events("C")
    assert (event.id, event.type, event.data) == (sent.offset, "PAID", {"sum": 5})


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_confluent_kafka_produces_in_each_codec_idempotently(
    kafka_server: EventServer, codec: str
) -> None:
    conf = confluent_conf(kafka_server)

    def produce() -> list[Any]:
        producer = Producer(
            {**conf, "enable.idempotence": True, "compression.type": codec, "linger.ms": 5}
        )
        failures: list[Any] = []
        for number in range(50):
            producer.produce(
                "events",
                key=f"k{number}",
                value=f"value {number}".encode(),
                on_delivery=lambda error, _msg: failures.append(error) if error else None,
            )
        assert producer.flush(10) == 0
        return failures

    assert await asyncio.to_thread(produce) == []
    records = await asyncio.to_thread(_consume_all, python_conf(kafka_server), "events", 0, 50)
    assert [(r.key, r.value) for r in records] == [
        (f"k{n}".encode(), f"value {n}".encode()) for n in range(50)
    ]
    assert [r.offset for r in records] == list(range(records[0].offset, records[0].offset + 50))


async def _manager(server: EventServer) -> dict[str, Any]:
    """confluent-kafka settings of a user who may also manage every stream."""
    await _add_reader(server, "mona", Right.READ | Right.WRITE | Right.MANAGE)
    return confluent_conf(server, "mona", **{"sasl.password": USERS["bob"]})


async def test_a_group_of_two_splits_the_partitions_and_a_new_member_resumes(
    kafka_server: EventServer,
) -> None:
    conf = await _manager(kafka_server)

    def run() -> tuple[list[int], list[str], list[str]]:
        admin = AdminClient(conf)
        admin.create_topics([NewTopic("orders", 4)])["orders"].result(10)
        del admin
        group = {**conf, "group.id": "billing", "auto.offset.reset": "earliest"}
        members = [Consumer({**group, "enable.auto.commit": False}) for _ in range(2)]
        for member in members:
            member.subscribe(["orders"])
        for _ in range(400):  # until the group has settled: two partitions each
            for member in members:
                member.poll(0.05)
            if [len(member.assignment()) for member in members] == [2, 2]:
                break
        producer = Producer(conf)
        for number in range(40):
            producer.produce("orders", value=str(number).encode(), partition=number % 4)
        assert producer.flush(10) == 0
        counts = [0, 0]
        seen: list[str] = []
        for _ in range(400):
            for at, member in enumerate(members):
                message = member.poll(0.05)
                if message is not None and message.error() is None:
                    counts[at] += 1
                    seen.append(bytes(message.value() or b"").decode())
            if sum(counts) == 40:
                break
        for member in members:
            member.commit(asynchronous=False)
            member.close()
        producer.produce("orders", value=b"later", partition=0)
        assert producer.flush(10) == 0
        newcomer = Consumer({**group, "enable.auto.commit": False})
        newcomer.subscribe(["orders"])
        resumed: list[str] = []
        for _ in range(200):
            message = newcomer.poll(0.1)
            if message is not None and message.error() is None:
                resumed.append(bytes(message.value() or b"").decode())
                break
        newcomer.close()
        return counts, seen, resumed

    counts, seen, resumed = await asyncio.to_thread(run)
    assert sorted(seen, key=int) == [str(n) for n in range(40)]
    assert all(counts), counts  # each member had partitions of its own
    assert resumed == ["later"]  # from the committed offsets, not from the start
    orders = kafka_server.streams.get("orders")
    assert orders is not None
    for partition in orders.partitions:  # the group is a consumer of each partition
        rows = await kafka_server.store.partition_log(partition).consumers()
        assert [row.component for row in rows] == ["kafka:billing"]


async def test_aiokafka_produces_and_consumes(kafka_server: EventServer) -> None:
    conf = python_conf(kafka_server)
    producer = AIOKafkaProducer(**conf)
    await producer.start()
    try:
        sent = await producer.send_and_wait("events", b"from aiokafka", key=b"a", headers=[])
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**conf, auto_offset_reset="earliest")
    await consumer.start()
    try:
        where = TopicPartition("events", 0)
        consumer.assign([where])
        await consumer.seek_to_beginning(where)
        record = await asyncio.wait_for(consumer.getone(), 10)
    finally:
        await consumer.stop()
    assert (record.offset, record.key, record.value) == (sent.offset, b"a", b"from aiokafka")


async def test_a_reader_may_not_produce_nor_see_what_it_holds_no_right_on(
    kafka_server: EventServer,
) -> None:
    await _add_reader(kafka_server, "carol", Right.READ)
    conf = confluent_conf(kafka_server, "carol", **{"sasl.password": USERS["bob"]})

    def produce() -> Any:
        producer = Producer(conf)
        errors: list[Any] = []
        producer.produce("events", value=b"x", on_delivery=lambda e, _m: errors.append(e))
        producer.flush(10)
        return errors[0]

    error = await asyncio.to_thread(produce)
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    def topics() -> set[str]:
        return set(AdminClient(conf).list_topics(timeout=10).topics)

    assert await asyncio.to_thread(topics) == {"events"}


async def test_a_wrong_password_is_refused(
    kafka_server: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    producer = AIOKafkaProducer(**python_conf(kafka_server, sasl_plain_password="not-it"))
    try:
        with pytest.raises(AioKafkaError):
            await producer.start()
    finally:
        await producer.stop()
    assert "kafka login failed for 'alice' from 127.0.0.1 (Invalid credentials)" in caplog.text


async def test_metadata_for_an_unknown_topic_creates_none(kafka_server: EventServer) -> None:
    conf = confluent_conf(kafka_server)

    def ask() -> Any:
        return AdminClient(conf).list_topics("nosuch", timeout=10).topics["nosuch"].error

    error = await asyncio.to_thread(ask)
    assert error is not None
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert kafka_server.streams.get("nosuch") is None


async def test_creating_a_topic_that_exists_is_refused(kafka_server: EventServer) -> None:
    conf = await _manager(kafka_server)

    def create() -> None:
        admin = AdminClient(conf)
        admin.create_topics([NewTopic("events", 1)])["events"].result(10)

    with pytest.raises(KafkaException) as refused:
        await asyncio.to_thread(create)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


# -- what no client sends ------------------------------------------------------------------


def _api_versions_error(frame: bytes) -> int:
    (_correlation, error) = struct.unpack_from(">ih", frame)
    return int(error)


async def test_a_too_new_api_versions_request_is_answered_in_version_0(
    kafka_server: EventServer,
) -> None:
    def ask() -> bytes:
        raw = RawKafka(kafka_server)
        try:
            raw.request(18, 99, b"")
            return raw.read_frame()
        finally:
            raw.close()

    frame = await asyncio.to_thread(ask)
    assert _api_versions_error(frame) == 35  # UNSUPPORTED_VERSION, with the versions served
    (count,) = struct.unpack_from(">i", frame, 6)
    assert count > 10


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(struct.pack(">i", 0x7FFF_FFFF), id="a 2 GiB size prefix"),
        pytest.param(struct.pack(">i", -5), id="a negative size"),
        pytest.param(struct.pack(">i", 3) + b"abc", id="a frame shorter than a header"),
        pytest.param(None, id="a request before the login"),
    ],
)
async def test_hostile_frames_close_the_connection_and_the_server_serves_on(
    kafka_server: EventServer, payload: bytes | None
) -> None:
    def send() -> bool:
        raw = RawKafka(kafka_server)
        try:
            if payload is None:
                raw.request(3, 1, struct.pack(">i", -1))  # Metadata of every topic
            else:
                raw.sock.sendall(payload)
            return raw.closed_by_server()
        finally:
            raw.close()

    assert await asyncio.to_thread(send)

    # and a client is served as before
    def topics() -> set[str]:
        return set(AdminClient(confluent_conf(kafka_server)).list_topics(timeout=10).topics)

    assert "events" in await asyncio.to_thread(topics)


async def test_an_api_not_served_gets_kafkas_error_in_its_own_answer(
    kafka_server: EventServer,
) -> None:
    def ask() -> bytes:
        raw = RawKafka(kafka_server)
        try:
            raw.request(17, 1, struct.pack(">h", 5) + b"PLAIN")  # SaslHandshake
            raw.read_frame()
            token = b"\0alice\0" + USERS["alice"].encode()
            raw.request(36, 1, struct.pack(">i", len(token)) + token)  # SaslAuthenticate
            raw.read_frame()
            raw.request(26, 0, struct.pack(">h", 1) + b"t" + struct.pack(">qh?", 1, 0, True))
            return raw.read_frame()  # EndTxn: transactions are not served
        finally:
            raw.close()

    frame = await asyncio.to_thread(ask)
    (_correlation, _throttle, error) = struct.unpack(">iih", frame)
    assert error == 35


# -- the schema registry ---------------------------------------------------------------------


async def test_confluents_json_serializer_works_end_to_end(kafka_server: EventServer) -> None:
    """A value the serializer made (its schema's id before the JSON) is an event of the
    schema's type, checked against it; it reads back byte for byte, and as JSON at FTN18."""
    await kafka_server.streams.add(OPERATOR, "orders", 1)
    alice = await kafka_server.store.get_user("alice")
    assert alice is not None
    await kafka_server.store.grant(alice.id, "orders", int(Right.MANAGE))
    await kafka_server.access.changed_here()
    assert kafka_server.schemas_url is not None
    registry = SchemaRegistryClient(
        {"url": kafka_server.schemas_url, "basic.auth.user.info": f"alice:{USERS['alice']}"}
    )
    conf = confluent_conf(kafka_server)
    context = SerializationContext("orders", MessageField.VALUE)

    def produce() -> tuple[bytes, list[Any]]:
        serializer = JSONSerializer(
            json.dumps(V1),
            registry,
            conf={"subject.name.strategy": topic_record_subject_name_strategy},
        )
        value = serializer({"order": 17, "total": "12.50"}, context)
        assert value is not None
        producer = Producer(conf)
        errors: list[Any] = []
        producer.produce("orders", value=value)
        assert producer.flush(10) == 0  # a batch of its own: a batch is stored whole or not
        # the same schema's id before data that breaks it (the serializer would not make it)
        broken = value[:5] + b'{"order": "seventeen"}'
        producer.produce("orders", value=broken, on_delivery=lambda e, _m: errors.append(e))
        assert producer.flush(10) == 0
        return value, errors

    value, errors = await asyncio.to_thread(produce)
    assert [error.code() for error in errors] == [KafkaError.INVALID_RECORD]
    (record,) = await asyncio.to_thread(_consume_all, python_conf(kafka_server), "orders", 0, 1)
    assert record.value == value
    deserializer = JSONDeserializer(None, schema_registry_client=registry)
    try:
        read = await asyncio.to_thread(deserializer, record.value, context)  # asks the registry
    finally:
        registry.close()
    assert read == {"order": 17, "total": "12.50"}
    async with await EventStreamClient.connect(
        f"{kafka_server.url}orders/0", credentials=f"alice:{USERS['alice']}"
    ) as client:
        await client.register_consumer("C")
        (event,) = await client.poll_events("C")
    assert (event.id, event.type, event.data) == (
        record.offset,
        "ORDER_PLACED",
        {"order": 17, "total": "12.50"},
    )


# -- administration and rights over time ---------------------------------------------------


async def test_topics_are_made_grown_described_and_dropped_with_the_manage_right(
    kafka_server: EventServer,
) -> None:
    conf = await _manager(kafka_server)

    def administer() -> tuple[int, dict[str, str], set[str]]:
        admin = AdminClient(conf)
        try:
            admin.create_topics([NewTopic("ledger", 2)])["ledger"].result(10)
            admin.create_partitions([NewPartitions("ledger", 3)])["ledger"].result(10)
            partitions = len(admin.list_topics("ledger", timeout=10).topics["ledger"].partitions)
            resource = ConfigResource(ConfigResource.Type.TOPIC, "ledger")
            configs = admin.describe_configs([resource])[resource].result(10)
            settings = {name: entry.value for name, entry in configs.items()}
            admin.delete_topics(["ledger"])["ledger"].result(10)
            return partitions, settings, set(admin.list_topics(timeout=10).topics)
        finally:
            del admin

    partitions, settings, left = await asyncio.to_thread(administer)
    assert partitions == 3
    assert settings["message.timestamp.type"] == "LogAppendTime"
    assert "ledger" not in left
    assert kafka_server.streams.get("ledger") is None


async def test_a_revoked_right_refuses_the_next_fetch(kafka_server: EventServer) -> None:
    await _add_reader(kafka_server, "carol", Right.READ)
    consumer = AIOKafkaConsumer(
        **python_conf(kafka_server, "carol", sasl_plain_password=USERS["bob"]),
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        where = TopicPartition("events", 0)
        consumer.assign([where])
        async with await _ftn18(kafka_server) as client:
            await client.add_event("ORDER_PLACED", {"n": 1})
        assert (await asyncio.wait_for(consumer.getone(), 10)).offset == 1
        carol = await kafka_server.store.get_user("carol")
        assert carol is not None
        await kafka_server.store.revoke(carol.id, "*", int(Right.READ))
        await kafka_server.access.changed_here()
        async with await _ftn18(kafka_server) as client:
            await client.add_event("ORDER_PLACED", {"n": 2})
        with pytest.raises(AioKafkaError):
            await asyncio.wait_for(consumer.getone(), 10)
    finally:
        await consumer.stop()


async def test_an_offset_past_the_log_end_is_not_committed(kafka_server: EventServer) -> None:
    """A group may commit only offsets of what it could have read: one past the log's end is
    refused as out of range (not as a rights failure), and the group's offset stays."""
    async with await _ftn18(kafka_server) as client:
        first = await client.add_event("ORDER_PLACED", {"n": 1})
    conf = {**confluent_conf(kafka_server), "group.id": "audit", "enable.auto.commit": False}

    def run() -> tuple[list[int], int]:
        consumer = Consumer(conf)
        try:
            at = ConfluentPartition("events", 0, first + 1)
            consumer.commit(offsets=[at], asynchronous=False)
            codes = []
            try:
                consumer.commit(
                    offsets=[ConfluentPartition("events", 0, first + 1000)], asynchronous=False
                )
            except KafkaException as exc:
                codes.append(exc.args[0].code())
            (kept,) = consumer.committed([ConfluentPartition("events", 0)], timeout=10)
            return codes, kept.offset
        finally:
            consumer.close()

    codes, kept = await asyncio.to_thread(run)
    assert codes == [KafkaError.OFFSET_OUT_OF_RANGE]
    assert kept == first + 1


async def test_list_offsets_finds_the_first_event_at_a_time(kafka_server: EventServer) -> None:
    async with await _ftn18(kafka_server) as client:
        first = await client.add_event("ORDER_PLACED", {"n": 1})
        await client.add_event("ORDER_PLACED", {"n": 2})
    consumer = AIOKafkaConsumer(**python_conf(kafka_server))
    await consumer.start()
    try:
        where = TopicPartition("events", 0)
        earliest = await consumer.beginning_offsets([where])
        latest = await consumer.end_offsets([where])
        found = await consumer.offsets_for_times({where: 0})
        future = await consumer.offsets_for_times({where: 2**50})
    finally:
        await consumer.stop()
    assert earliest[where] == first
    assert latest[where] == first + 2
    assert found[where] is not None
    assert found[where].offset == first
    assert future[where] is None


async def test_metrics_count_the_kafka_connections(
    start_server: ServerFactory,
) -> None:
    server = await start_server(kafka=KafkaConfig(port=0), metrics=("127.0.0.1", 0))
    producer = AIOKafkaProducer(**python_conf(server))
    await producer.start()
    try:
        await producer.send_and_wait("events", b"x")
        assert server.metrics_url is not None
        async with httpx.AsyncClient(timeout=30) as http:
            text = (await http.get(server.metrics_url)).text
    finally:
        await producer.stop()
    counted = re.search(r'futoin_evt_door_connections\{door="kafka"\} ([0-9.]+)', text)
    assert counted is not None
    assert float(counted.group(1)) >= 1  # the producer's (and its bootstrap's, if still open)
    assert 'futoin_evt_door_handshakes{door="kafka"} 0.0' in text


# -- TLS, acks and producers' keys -------------------------------------------------------------


async def test_sasl_ssl_with_the_servers_certificate(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    authority = trustme.CA()
    authority.issue_cert("127.0.0.1").configure_cert(
        context := ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    )
    server = await start_server(kafka=KafkaConfig(port=0, tls=context))
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    conf = confluent_conf(
        server, **{"security.protocol": "SASL_SSL", "ssl.ca.location": str(ca_file)}
    )

    def produce() -> list[Any]:
        producer = Producer(conf)
        delivered: list[Any] = []
        producer.produce(
            "events", value=b"over TLS", on_delivery=lambda e, m: delivered.append((e, m.offset()))
        )
        assert producer.flush(10) == 0
        return delivered

    ((error, offset),) = await asyncio.to_thread(produce)
    assert error is None
    python_tls = python_conf(server, security_protocol="SASL_SSL", ssl_cafile=str(ca_file))
    (record,) = await asyncio.to_thread(_consume_all, python_tls, "events", 0, 1)
    assert (record.offset, record.value) == (offset, b"over TLS")


async def test_acks_0_stores_without_an_answer(kafka_server: EventServer) -> None:
    def produce() -> None:
        producer = KafkaProducer(**python_conf(kafka_server), acks=0, enable_idempotence=False)
        try:
            for number in range(3):
                producer.send("events", value=str(number).encode())
            producer.flush(10)
        finally:
            producer.close()

    await asyncio.to_thread(produce)
    records = await asyncio.to_thread(_consume_all, python_conf(kafka_server), "events", 0, 3)
    assert [record.value for record in records] == [b"0", b"1", b"2"]


async def test_a_producers_key_header_stores_a_record_once(kafka_server: EventServer) -> None:
    """The other doors' dedup key: a record sent again (by a producer that restarted, say)
    with the same ``futoin-evt-key`` within the dedup window stores nothing and answers the
    first one's offset."""

    def produce_twice() -> list[int]:
        offsets = []
        for _ in range(2):  # two producers: Kafka's idempotence cannot tell the copies apart
            producer = KafkaProducer(**python_conf(kafka_server))
            try:
                sent = producer.send(
                    "events", value=b"pay 5", headers=[("futoin-evt-key", b"pay-1")]
                )
                offsets.append(sent.get(10).offset)
            finally:
                producer.close()
        return offsets

    first, second = await asyncio.to_thread(produce_twice)
    assert second == first
    async with await _ftn18(kafka_server) as client:
        event_id = await client.add_event("ORDER_PLACED", {"n": 1})
    assert event_id == first + 1  # nothing stored between
