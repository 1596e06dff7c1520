"""The Kafka door with two more of Kafka's own clients: kafkajs (tests/js/kafka_kafkajs.js)
and kcat (librdkafka's command line tool), each against the FTN18 door on the same log."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import Event, EventStreamClient
from futoin_evt.domain.rights import Right
from futoin_evt.kafka.config import KafkaConfig
from futoin_evt.server.app import EventServer

from .support.js import run_js
from .support.kafka import bootstrap, python_conf
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional


@pytest.fixture
async def kafka_server(start_server: ServerFactory) -> EventServer:
    """A server with the Kafka door on a free port; alice and bob may read and write."""
    return await start_server(kafka=KafkaConfig(port=0))


async def _poll_all(server: EventServer, component: str) -> list[Event]:
    """Every event of ``events`` for a new FTN18 consumer ``component`` (as alice)."""
    credentials = f"alice:{USERS['alice']}"
    async with await EventStreamClient.connect(server.url, credentials=credentials) as client:
        await client.register_consumer(component)
        return await client.poll_events(component)


async def _add_event(server: EventServer, event_type: str, data: Any) -> int:
    credentials = f"alice:{USERS['alice']}"
    async with await EventStreamClient.connect(server.url, credentials=credentials) as client:
        return await client.add_event(event_type, data)


# -- kafkajs -----------------------------------------------------------------------------------


async def _kafkajs(js_peer: Path, server: EventServer, **scenario: Any) -> list[Any]:
    """Run tests/js/kafka_kafkajs.js as alice on ``events``: its JSON lines."""
    base = {"broker": bootstrap(server), "user": "alice", "password": USERS["alice"]}
    return await run_js(js_peer, "kafka_kafkajs.js", {**base, "topic": "events", **scenario})


def _text(encoded: str | None) -> str | None:
    return None if encoded is None else base64.b64decode(encoded).decode()


def _received(lines: list[Any]) -> list[tuple[int, str | None, str | None, list[Any]]]:
    """(offset, key, value, headers) of each record kafkajs printed, as text."""
    return [
        (
            line["offset"],
            _text(line["key"]),
            _text(line["value"]),
            [(name, _text(value)) for name, value in line["headers"]],
        )
        for line in lines
        if "offset" in line
    ]


@pytest.mark.interop
async def test_kafkajs_records_are_read_back_by_kafkajs_in_a_group_and_by_ftn18(
    js_peer: Path, kafka_server: EventServer
) -> None:
    records = [
        {
            "key": "k1",
            "value": '{"order": 7}',
            "headers": {"ce_type": "ORDER_PLACED", "content-type": "application/json"},
        },
        {"key": "k2", "value": "plain text", "headers": {"trace": "t-1", "h": ["a", "b"]}},
        {"key": None, "value": "no key", "headers": {"empty": ""}},
    ]
    out = await _kafkajs(js_peer, kafka_server, produce=records, group="js", count=3)
    (produced,) = out[0]["produced"]
    assert produced["partition"] == 0
    first = produced["offset"]
    assert _received(out) == [
        (
            first,
            "k1",
            '{"order": 7}',
            [("ce_type", "ORDER_PLACED"), ("content-type", "application/json")],
        ),
        (first + 1, "k2", "plain text", [("trace", "t-1"), ("h", "a"), ("h", "b")]),
        (first + 2, None, "no key", [("empty", "")]),
    ]
    # the group's offset is past the last record read
    assert out[-1] == {"committed": [{"partition": 0, "offset": first + 3}]}
    # the same events, by the same ids, through FTN18
    events = await _poll_all(kafka_server, "C")
    assert [(e.id, e.type) for e in events] == [
        (first, "ORDER_PLACED"),
        (first + 1, "EVENT"),
        (first + 2, "EVENT"),
    ]
    assert events[0].data == {"order": 7}
    assert events[1].data == {"$binary": base64.b64encode(b"plain text").decode()}


@pytest.mark.interop
async def test_kafkajs_reads_records_of_other_clients_with_their_type_header(
    js_peer: Path, kafka_server: EventServer
) -> None:
    def produce() -> Any:
        producer = KafkaProducer(**python_conf(kafka_server))
        try:
            sent = producer.send("events", key=b"p", value=b"paid", headers=[("ce_type", b"PAID")])
            return sent.get(10)
        finally:
            producer.close()

    sent = await asyncio.to_thread(produce)
    event_id = await _add_event(kafka_server, "ORDER_PLACED", {"order": 7})
    out = await _kafkajs(js_peer, kafka_server, group="js", count=2)
    (from_python, from_ftn18) = _received(out)
    assert from_python == (sent.offset, "p", "paid", [("ce_type", "PAID")])
    assert from_ftn18[:2] == (event_id, None)
    assert json.loads(from_ftn18[2] or "") == {"order": 7}
    assert from_ftn18[3] == [("ce_type", "ORDER_PLACED"), ("content-type", "application/json")]


@pytest.mark.interop
async def test_a_kafkajs_group_resumes_after_its_committed_offset(
    js_peer: Path, kafka_server: EventServer
) -> None:
    first = await _add_event(kafka_server, "A", 1)
    out = await _kafkajs(js_peer, kafka_server, group="js", count=1)
    assert [offset for offset, *_ in _received(out)] == [first]
    later = await _add_event(kafka_server, "B", 2)
    out = await _kafkajs(js_peer, kafka_server, group="js", count=1)
    assert [(offset, headers[0]) for offset, _k, _v, headers in _received(out)] == [
        (later, ("ce_type", "B"))
    ]
    assert out[-1] == {"committed": [{"partition": 0, "offset": later + 1}]}


# -- kcat --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kcat() -> str:
    """kcat's path (Debian's kcat package: .ci/run installs it)."""
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is needed for the kcat tests (apt-get install kcat)")
    return path


async def _kcat(
    kcat: str, server: EventServer, *args: str, user: str = "alice", stdin: bytes = b""
) -> str:
    """Run kcat as ``user`` (SASL PLAIN, password: USERS, else bob's) with ``args``; its
    stdout."""
    proc = await asyncio.create_subprocess_exec(
        kcat,
        "-b",
        bootstrap(server),
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanisms=PLAIN",
        "-X",
        f"sasl.username={user}",
        "-X",
        f"sasl.password={USERS.get(user, USERS['bob'])}",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate(stdin)
    assert proc.returncode == 0, err.decode()
    return out.decode()


#: kcat -C's format: partition, offset, key, value, headers (name=value,...).
CONSUME_FORMAT = "%p|%o|%k|%s|%h\\n"


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_kcat_produces_with_headers_and_reads_back_what_ftn18_reads(
    kcat: str, kafka_server: EventServer, codec: str
) -> None:
    values = b'{"sum": 1}\n{"sum": 2}\n{"sum": 3}\n'
    await _kcat(
        kcat,
        kafka_server,
        *("-P", "-t", "events", "-k", "acct-1", "-z", codec),
        *("-X", "enable.idempotence=true"),
        *("-H", "ce_type=PAID", "-H", "content-type=application/json", "-H", "trace=t-1"),
        stdin=values,
    )
    out = await _kcat(
        kcat, kafka_server, "-C", "-t", "events", "-o", "beginning", "-e", "-f", CONSUME_FORMAT
    )
    lines = [line.split("|") for line in out.splitlines()]
    offsets = [int(offset) for _p, offset, *_ in lines]
    headers = "ce_type=PAID,content-type=application/json,trace=t-1"
    assert lines == [
        ["0", str(offset), "acct-1", value, headers]
        for offset, value in zip(offsets, ['{"sum": 1}', '{"sum": 2}', '{"sum": 3}'], strict=True)
    ]
    assert offsets == list(range(offsets[0], offsets[0] + 3))
    events = await _poll_all(kafka_server, "C")
    assert [(e.id, e.type, e.data) for e in events] == [
        (offset, "PAID", {"sum": number}) for number, offset in enumerate(offsets, 1)
    ]


async def test_kcat_reads_an_ftn18_event_with_its_type_header(
    kcat: str, kafka_server: EventServer
) -> None:
    event_id = await _add_event(kafka_server, "ORDER_PLACED", {"order": 7})
    out = await _kcat(
        kcat, kafka_server, "-C", "-t", "events", "-o", "beginning", "-e", "-f", CONSUME_FORMAT
    )
    (line,) = out.splitlines()
    partition, offset, key, value, headers = line.split("|")
    assert (partition, int(offset), key) == ("0", event_id, "")
    assert json.loads(value) == {"order": 7}
    assert headers == "ce_type=ORDER_PLACED,content-type=application/json"


async def test_kcat_metadata_lists_the_streams_the_user_may_see(
    kcat: str, kafka_server: EventServer
) -> None:
    await kafka_server.store.add_stream("orders", 2)
    await kafka_server.store.add_stream("payroll", 1)
    await kafka_server.streams.refresh()
    dave = await kafka_server.store.add_user("dave", hash_password(USERS["bob"]))
    await kafka_server.store.grant(dave, "orders", int(Right.READ))
    await kafka_server.access.changed_here()

    def topics(metadata: dict[str, Any]) -> dict[str, list[int]]:
        return {
            topic["topic"]: sorted(p["partition"] for p in topic["partitions"])
            for topic in metadata["topics"]
        }

    everything = json.loads(await _kcat(kcat, kafka_server, "-L", "-J"))
    assert topics(everything) == {"events": [0], "orders": [0, 1], "payroll": [0]}
    assert [broker["name"] for broker in everything["brokers"]] == [bootstrap(kafka_server)]
    mine = json.loads(await _kcat(kcat, kafka_server, "-L", "-J", user="dave"))
    assert topics(mine) == {"orders": [0, 1]}


async def test_a_record_without_key_nor_headers_comes_back_without_headers(
    kcat: str, kafka_server: EventServer
) -> None:
    await _kcat(kcat, kafka_server, "-P", "-t", "events", stdin=b"bare\n")
    out = await _kcat(
        kcat, kafka_server, "-C", "-t", "events", "-o", "beginning", "-e", "-f", CONSUME_FORMAT
    )
    (line,) = out.splitlines()
    assert line.split("|")[2:] == ["", "bare", ""]  # no key, no headers
