"""Logins at the Kafka door other than PLAIN with a password: SCRAM-SHA-256 and SCRAM-SHA-512
(RFC 5802, RFC 7677) with each Kafka client, users without SCRAM credentials, and the Event
Hubs login (``$ConnectionString``); the SCRAM exchange itself against RFC 7677's example."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import struct
from pathlib import Path
from typing import Any

import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError as AioKafkaError
from confluent_kafka import Consumer, KafkaError, Producer

from futoin_evt.auth.connection_string import ConnectionString
from futoin_evt.auth.sas import policy_hash, sas_key
from futoin_evt.auth.scram import (
    INVALID_CREDENTIALS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramFailure,
    ScramServer,
    derive,
    parse_client_first,
    scram_credentials,
    stand_in,
)
from futoin_evt.auth.users import hash_password
from futoin_evt.domain.rights import Right
from futoin_evt.kafka.config import KafkaConfig
from futoin_evt.server.app import EventServer

from .support.cli import run
from .support.kafka import RawKafka, confluent_conf, python_conf
from .support.servers import USERS, ServerFactory
from .support.sql import execute_sql

functional = pytest.mark.functional
#: kafka-python's clients (untyped).
PythonProducer: Any = kafka.KafkaProducer
PythonConsumer: Any = kafka.KafkaConsumer

SECRET = b"a test secret of more than thirty-two characters"
NO_SCRAM_LINE = "it must set its password again to log in with SCRAM"


# -- the exchange (RFC 7677, section 3) -------------------------------------------------------

RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)


def _rfc_exchange() -> ScramServer:
    credential = derive(SCRAM_SHA_256, "pencil", RFC_SALT, 4096)
    first = parse_client_first(RFC_CLIENT_FIRST)
    return ScramServer(SCRAM_SHA_256, first, credential, server_nonce=RFC_SERVER_NONCE)


def test_the_exchange_of_rfc_7677_checks_its_proof_and_signs_its_answer() -> None:
    server = _rfc_exchange()
    assert server.server_first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert server.finish(RFC_CLIENT_FINAL) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_another_password_or_nonce_fails_as_invalid_credentials() -> None:
    wrong = derive(SCRAM_SHA_256, "pencil!", RFC_SALT, 4096)
    first = parse_client_first(RFC_CLIENT_FIRST)
    server = ScramServer(SCRAM_SHA_256, first, wrong, server_nonce=RFC_SERVER_NONCE)
    with pytest.raises(ScramFailure, match=INVALID_CREDENTIALS):
        server.finish(RFC_CLIENT_FINAL)
    with pytest.raises(ScramFailure, match=INVALID_CREDENTIALS):
        _rfc_exchange().finish(RFC_CLIENT_FINAL.replace(b"$k0", b"$k1"))


def test_a_name_without_credentials_gets_a_like_answer_and_fails() -> None:
    key = b"k" * 32
    first = parse_client_first(b"n,,n=nobody,r=abc")
    once, again = stand_in(SCRAM_SHA_512, "nobody", key), stand_in(SCRAM_SHA_512, "nobody", key)
    assert once.salt == again.salt  # asking twice tells nothing
    real = scram_credentials("pw")[1]
    assert (len(once.salt), once.iterations) == (len(real.salt), real.iterations)
    server = ScramServer(SCRAM_SHA_512, first, once, known=False)
    nonce = server.server_first.split(b",")[0][2:]
    with pytest.raises(ScramFailure, match=INVALID_CREDENTIALS):
        server.finish(b"c=biws,r=" + nonce + b",p=" + base64.b64encode(bytes(64)))


def test_client_first_messages() -> None:
    assert parse_client_first(b"n,,n=a=2Cb=3Dc,r=x").user == "a,b=c"
    assert parse_client_first(b"n,a=alice,n=alice,r=x").user == "alice"
    assert parse_client_first(b"y,,n=alice,r=x").gs2_header == "y,,"
    with pytest.raises(ScramFailure, match="channel binding"):
        parse_client_first(b"p=tls-unique,,n=alice,r=x")
    for refused in (
        b"n,a=bob,n=alice,r=x",  # acting for another user
        b"n,,n=al=ice,r=x",  # an = that is no escape
        b"n,,n=alice,r=x,tokenauth=true",  # a delegation token
        b"n,,m=ext,n=alice,r=x",
        b"n,,r=x",
        b"\xff",
    ):
        with pytest.raises(ScramFailure, match=INVALID_CREDENTIALS):
            parse_client_first(refused)


# -- Kafka's clients ---------------------------------------------------------------------------


async def _set_password(server: EventServer, name: str, password: str) -> None:
    """As ``futoin-evt user passwd`` sets it: the hash and the SCRAM credentials."""
    assert await server.store.set_password(
        name, hash_password(password), scram_credentials(password)
    )
    await server.access.changed_here()


@pytest.fixture
async def scram_server(start_server: ServerFactory) -> EventServer:
    """The Kafka door with the SAS secret; alice's and bob's passwords set with SCRAM
    credentials."""
    server = await start_server(kafka=KafkaConfig(port=0, sas_secret=SECRET))
    for name, password in USERS.items():
        await _set_password(server, name, password)
    return server


def _confluent_round_trip(conf: dict[str, Any], value: bytes) -> list[bytes]:
    """Produce ``value`` to events/0 and read events/0 from its start, with confluent-kafka."""
    producer = Producer(conf)
    producer.produce("events", value=value, partition=0)
    assert producer.flush(10) == 0
    consumer = Consumer(
        {**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    try:
        consumer.subscribe(["events"])
        for _ in range(200):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                return [bytes(message.value() or b"")]
        return []
    finally:
        consumer.close()


@functional
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_confluent_kafka_logs_in_with_scram(
    scram_server: EventServer, mechanism: str
) -> None:
    conf = confluent_conf(scram_server, "bob", **{"sasl.mechanism": mechanism})
    assert await asyncio.to_thread(_confluent_round_trip, conf, b"scram") == [b"scram"]


@functional
async def test_kafka_python_logs_in_with_scram_sha_256(scram_server: EventServer) -> None:
    conf = python_conf(scram_server, sasl_mechanism="SCRAM-SHA-256")

    def round_trip() -> list[bytes]:
        producer = PythonProducer(**conf)
        try:
            producer.send("events", value=b"from kafka-python").get(10)
        finally:
            producer.close()
        consumer = PythonConsumer(**conf, consumer_timeout_ms=10_000)
        try:
            where = kafka.TopicPartition("events", 0)
            consumer.assign([where])
            consumer.seek_to_beginning(where)
            return [record.value for record in consumer][:1]
        finally:
            consumer.close()

    assert await asyncio.to_thread(round_trip) == [b"from kafka-python"]


@functional
async def test_aiokafka_logs_in_with_scram_sha_512(scram_server: EventServer) -> None:
    conf = python_conf(scram_server, sasl_mechanism="SCRAM-SHA-512")
    producer = AIOKafkaProducer(**conf)
    await producer.start()
    try:
        sent = await producer.send_and_wait("events", b"from aiokafka")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**conf)
    await consumer.start()
    try:
        where = TopicPartition("events", 0)
        consumer.assign([where])
        await consumer.seek_to_beginning(where)
        record = await asyncio.wait_for(consumer.getone(), 10)
    finally:
        await consumer.stop()
    assert (record.offset, record.value) == (sent.offset, b"from aiokafka")


async def _aiokafka_login_fails(conf: dict[str, Any]) -> None:
    producer = AIOKafkaProducer(**conf)
    try:
        with pytest.raises(AioKafkaError):
            await producer.start()
    finally:
        await producer.stop()


@functional
async def test_a_wrong_password_or_unknown_user_fails_alike(
    scram_server: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    for user, password in (("alice", "not-it"), ("nobody", "not-it")):
        conf = python_conf(
            scram_server, user, sasl_mechanism="SCRAM-SHA-256", sasl_plain_password=password
        )
        await _aiokafka_login_fails(conf)
    assert "login failed for 'alice' from 127.0.0.1 (SCRAM: Invalid credentials)" in caplog.text
    assert "login failed for 'nobody' from 127.0.0.1 (SCRAM: no such user)" in caplog.text


@functional
async def test_a_user_whose_password_predates_scram_sets_it_again(
    start_server: ServerFactory, store_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_server(db=store_db, kafka=KafkaConfig(port=0))
    await _set_password(server, "alice", USERS["alice"])
    execute_sql(
        store_db, "DELETE FROM user_scram WHERE user_id = (SELECT id FROM users WHERE name = ?)",
        ("alice",),
    )  # fmt: skip
    conf = python_conf(server, sasl_mechanism="SCRAM-SHA-512")
    for _attempt in range(2):
        await _aiokafka_login_fails(conf)
    told = [r for r in caplog.records if NO_SCRAM_LINE in r.getMessage()]
    assert len(told) == 1  # once per user
    assert "user 'alice' has no SCRAM credentials" in told[0].getMessage()
    # PLAIN still works, and a new password gives SCRAM credentials
    await _aiokafka_producer_starts(python_conf(server))
    changed = await asyncio.to_thread(
        run, "user", "passwd", "alice", "--password-stdin", "--db", store_db,
        stdin=USERS["alice"] + "\n",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    await _aiokafka_producer_starts(conf)


async def _aiokafka_producer_starts(conf: dict[str, Any]) -> None:
    producer = AIOKafkaProducer(**conf)
    await producer.start()
    await producer.stop()


@functional
async def test_a_user_added_on_the_command_line_logs_in_with_scram(
    start_server: ServerFactory, db_path: Path
) -> None:
    server = await start_server(kafka=KafkaConfig(port=0))
    added = await asyncio.to_thread(
        run, "user", "add", "carol", "--password-stdin", "--db", str(db_path), stdin="carol-pw\n"
    )
    assert added.returncode == 0, added.stderr
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        conf = python_conf(
            server, "carol", sasl_mechanism=mechanism, sasl_plain_password="carol-pw"
        )
        await _aiokafka_producer_starts(conf)


def _raw_scram_v0(raw: RawKafka, user: str, password: str) -> bytes:
    """SaslHandshake v0 for SCRAM-SHA-256, then the exchange in bare frames, as a client
    computes it (RFC 5802); the server-final frame."""
    mechanism = b"SCRAM-SHA-256"
    raw.request(17, 0, struct.pack(">h", len(mechanism)) + mechanism)
    (_correlation, error) = struct.unpack_from(">ih", raw.read_frame())
    assert error == 0
    bare = f"n={user},r=client-nonce"
    raw.send_frame(b"n,," + bare.encode())
    server_first = raw.read_frame()
    fields = dict(part.split(b"=", 1) for part in server_first.split(b","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields[b"s"]), int(fields[b"i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = b"c=biws,r=" + fields[b"r"]
    signed = bare.encode() + b"," + server_first + b"," + without_proof
    signature = hmac.digest(hashlib.sha256(client_key).digest(), signed, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    raw.send_frame(without_proof + b",p=" + base64.b64encode(proof))
    return raw.read_frame()


@functional
async def test_after_a_version_0_handshake_scram_goes_in_bare_frames(
    scram_server: EventServer,
) -> None:
    def login() -> tuple[bytes, bytes, bool]:
        raw = RawKafka(scram_server)
        try:
            server_final = _raw_scram_v0(raw, "alice", USERS["alice"])
            raw.request(3, 1, struct.pack(">i", 0))  # Metadata: served once logged in
            metadata = raw.read_frame()
        finally:
            raw.close()
        wrong = RawKafka(scram_server)
        try:
            refused = _raw_scram_v0(wrong, "alice", "not-it") == b"" and wrong.closed_by_server()
        finally:
            wrong.close()
        return server_final, metadata, refused

    server_final, metadata, refused = await asyncio.to_thread(login)
    assert server_final.startswith(b"v=")
    assert metadata  # an answer, not a closed connection
    assert refused


# -- the Event Hubs login ----------------------------------------------------------------------


def _connection_string(server: EventServer, name: str, key: str) -> str:
    assert server.kafka is not None
    return (
        f"Endpoint=sb://127.0.0.1:{server.kafka.port}/;SharedAccessKeyName={name};"
        f"SharedAccessKey={key};EntityPath=orders"
    )


def test_a_connection_string_is_read_without_showing_its_key() -> None:
    parsed = ConnectionString.parse(
        "Endpoint=sb://ns.example/;SharedAccessKeyName=shop;SharedAccessKey=S3cr3t=;"
        "EntityPath=orders"
    )
    assert (parsed.key_name, parsed.key, parsed.resource) == (
        "shop",
        "S3cr3t=",
        "sb://ns.example/orders",
    )
    assert "S3cr3t" not in repr(parsed)
    with pytest.raises(ValueError, match="SharedAccessKey"):
        ConnectionString.parse("Endpoint=sb://ns.example/;SharedAccessKeyName=shop")


def _event_hubs_conf(server: EventServer, connection_string: str) -> dict[str, Any]:
    """confluent-kafka as Azure's Event Hubs samples set it up."""
    return confluent_conf(server, "$ConnectionString", **{"sasl.password": connection_string})


@functional
async def test_confluent_kafka_logs_in_with_an_event_hubs_connection_string(
    scram_server: EventServer,
) -> None:
    store = scram_server.store
    await store.add_stream("orders", 1)
    await store.add_stream("payments", 1)
    await scram_server.streams.refresh()
    policy = await store.add_user("shop", policy_hash())
    await store.grant(policy, "orders", int(Right.WRITE | Right.READ))  # Send,Listen on orders
    await scram_server.access.changed_here()
    user = await store.get_user("shop")
    assert user is not None
    conf = _event_hubs_conf(
        scram_server, _connection_string(scram_server, "shop", sas_key(SECRET, user))
    )

    def produce(topic: str) -> Any:
        errors: list[Any] = []
        producer = Producer(conf)
        producer.produce(topic, value=b"paid", on_delivery=lambda e, _m: errors.append(e))
        producer.flush(10)
        return errors[0]

    assert await asyncio.to_thread(produce, "orders") is None
    refused = await asyncio.to_thread(produce, "payments")  # no claim there
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    def consume() -> bytes | None:
        consumer = Consumer({**conf, "group.id": "$Default", "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["orders"])
            for _ in range(200):
                message = consumer.poll(0.1)
                if message is not None and message.error() is None:
                    return bytes(message.value() or b"")
            return None
        finally:
            consumer.close()

    assert await asyncio.to_thread(consume) == b"paid"


@functional
async def test_a_connection_string_with_a_wrong_key_fails(
    scram_server: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = _connection_string(scram_server, "alice", base64.b64encode(bytes(32)).decode())

    def produce() -> Any:
        errors: list[Any] = []
        producer = Producer({**_event_hubs_conf(scram_server, wrong), "message.timeout.ms": 3000})
        producer.produce("events", value=b"x", on_delivery=lambda e, _m: errors.append(e))
        producer.flush(10)
        return errors[0]

    error = await asyncio.to_thread(produce)
    assert error is not None
    assert "login failed for 'alice' from 127.0.0.1 ($ConnectionString:" in caplog.text
