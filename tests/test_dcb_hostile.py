"""Hostile bodies at the DCB HTTP API, against a server process: each gets a 400 or 413 with a
clear message and stores nothing, an honest client is served meanwhile, the server logs no
ERROR, every slot comes back and memory stays within a stated bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import CommError, EventStreamClient, RemoteError
from futoin_evt.storage.sqlite import SqliteStore

from .support.amqp_wire import ServerProcess
from .support.servers import USERS, add_user
from .support.waiting import until

pytestmark = pytest.mark.functional

MAX_CONNECTIONS = 6
MIB = 1024 * 1024
AUTH = ("alice", USERS["alice"])
CREDENTIALS = "alice:" + USERS["alice"]


@pytest.fixture(scope="module")
def dcb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("dcb-hostile") / "events.sqlite"

    async def add_alice() -> None:
        async with await SqliteStore.open(db) as store:
            await add_user(store, "alice", hash_password(USERS["alice"]))

    asyncio.run(add_alice())
    server = ServerProcess(db, "--max-connections", str(MAX_CONNECTIONS))
    yield server
    assert server.stop() == 0
    assert server.errors() == []


@pytest.fixture
async def honest(dcb_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    """A client keeping one connection open across the attack; it appends before and after,
    nothing else was stored, no ERROR was logged and every slot is free again."""
    mark = len(dcb_server.log())
    async with httpx.AsyncClient(
        base_url=dcb_server.http_url + "/dcb/v1", auth=AUTH, timeout=30
    ) as client:
        before = await append_one(client)
        yield client
        after = await append_one(client)
        assert after == before + 1, "something of the attack was stored"
    await assert_slots_free(dcb_server)
    new_lines = dcb_server.log()[mark:]
    assert " ERROR " not in new_lines, new_lines
    assert "Traceback" not in new_lines, new_lines


async def append_one(client: httpx.AsyncClient) -> int:
    response = await client.post("/append", json={"events": [{"type": "Honest", "tags": ["h"]}]})
    assert response.status_code == 200, response.text
    return int(response.json()["position"])


async def assert_slots_free(server: ServerProcess) -> None:
    """Every established slot can be taken again (the attack's connections are gone), and with
    all taken, a DCB request is refused with 503."""
    url = f"ws://127.0.0.1:{server.port}/"
    clients: list[EventStreamClient] = []

    async def one_more_served() -> bool:
        client = await EventStreamClient.connect(url, credentials=CREDENTIALS)
        try:
            await client.ping(1)
        except (RemoteError, CommError):  # a slot not yet seen free: it soon is
            await client.close()
            return False
        clients.append(client)
        return len(clients) == MAX_CONNECTIONS

    try:
        await until(one_more_served, "every slot served", interval=0.05)
        async with httpx.AsyncClient(base_url=server.http_url + "/dcb/v1", auth=AUTH) as late:
            refused = await late.post("/read", json={"limit": 1}, timeout=30)
        assert refused.status_code == 503, refused.text
    finally:
        for client in clients:
            await client.close()


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


HOSTILE: dict[str, tuple[str | bytes, int, str]] = {
    "data nested 100,000 deep": (
        '{"events":[{"type":"A","data":' + nested(100_000) + "}]}",
        400,
        "nested too deeply",
    ),
    "objects nested 50,000 deep": ('{"a":' * 50_000 + "1" + "}" * 50_000, 400, "nested too deeply"),
    "query nested 100,000 deep": (
        '{"query":{"items":' + nested(100_000) + "}}",
        400,
        "nested too deeply",
    ),
    "100,000 tags": (
        json.dumps({"events": [{"type": "A", "tags": ["t"] * 100_000}]}),
        400,
        "events[0].tags: at most 100",
    ),
    "10,000 query items": (
        json.dumps({"query": {"items": [{"types": ["A"]}] * 10_000}}),
        400,
        "query.items: at most 100",
    ),
    "10,000 types in an item": (
        json.dumps({"query": {"items": [{"types": ["A"] * 10_000}]}}),
        400,
        "at most 100",
    ),
    "a condition of 10,000 items": (
        json.dumps(
            {
                "events": [{"type": "A"}],
                "condition": {"failIfEventsMatch": {"items": [{"tags": ["t"]}] * 10_000}},
            }
        ),
        400,
        "condition.failIfEventsMatch.items: at most 100",
    ),
    "10,000 events": (
        json.dumps({"events": [{"type": "A"}] * 10_000}),
        400,
        "events: at most 1000",
    ),
    "a lone surrogate in data": ('{"events":[{"type":"A","data":"\\ud800"}]}', 400, "surrogate"),
    "a lone surrogate in a tag": ('{"events":[{"type":"A","tags":["\\udc00"]}]}', 400, "surrogate"),
    "a NUL in a type": ('{"events":[{"type":"A\\u0000"}]}', 400, "events[0].type"),
    "a 5,000-digit integer": (
        '{"events":[{"type":"A","data":' + "7" * 5000 + "}]}",
        400,
        "digits",
    ),
    "1e999": ('{"events":[{"type":"A","data":1e999}]}', 400, "range"),
    "after of 5,000 digits": ('{"after":' + "9" * 5000 + "}", 400, "digits"),
    "a huge limit": ('{"limit":' + "9" * 30 + "}", 400, "limit"),
    "not UTF-8": (b'{"events":[{"type":"\xff"}]}', 400, "not JSON"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_hostile_bodies_get_a_clear_refusal(
    dcb_server: ServerProcess, honest: httpx.AsyncClient, case: str
) -> None:
    body, status, reason = HOSTILE[case]
    content = body.encode() if isinstance(body, str) else body
    path = "/append" if b'"events"' in content or b'"a"' in content else "/read"
    async with httpx.AsyncClient(base_url=dcb_server.http_url + "/dcb/v1", auth=AUTH) as abuser:
        response = await abuser.post(path, content=content, timeout=30)
    assert response.status_code == status, response.text
    assert reason in response.text, response.text
    if status == 400:
        assert response.json()["error"] == "InvalidRequest"
    # the honest connection is served while and after
    assert (await honest.post("/read", json={"limit": 1})).status_code == 200


@pytest.mark.parametrize(
    ("length", "status", "answer"),
    [
        (MIB + 1, b"413 Request Entity Too Large\r\n", b"The body exceeds 1048576 bytes."),
        (4 * 2**30, b"413 Request Entity Too Large\r\n", b"The body exceeds 1048576 bytes."),
        (10**13, b"400 Bad Request\r\n", b"Bad Content-Length."),
    ],
)
async def test_a_body_above_the_limit_is_refused_before_it_is_read(
    dcb_server: ServerProcess, honest: httpx.AsyncClient, length: int, status: bytes, answer: bytes
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", dcb_server.port)
    writer.write(
        b"POST /dcb/v1/append HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YWxpY2U6YWxpY2UtcHc=\r\n"
        b"Content-Length: %d\r\n\r\n{" % length
    )
    async with asyncio.timeout(30):
        received = await reader.read()
    writer.close()
    assert received.startswith(b"HTTP/1.1 " + status)
    assert received.endswith(answer + b"\n")


async def test_a_client_that_sends_a_body_above_the_limit_whole_gets_the_413(
    dcb_server: ServerProcess, honest: httpx.AsyncClient
) -> None:
    """The server refuses before reading the body, and reads (and drops) the rest only so
    that the client, still sending, gets the answer rather than a reset connection."""
    async with httpx.AsyncClient(base_url=dcb_server.http_url + "/dcb/v1", auth=AUTH) as client:
        response = await client.post("/append", content=b"x" * (4 * MIB), timeout=30)
    assert response.status_code == 413
    assert response.text == "The body exceeds 1048576 bytes.\n"
    assert (await honest.post("/read", json={"limit": 1})).status_code == 200


async def test_a_body_that_never_ends_holds_at_most_the_limit(
    dcb_server: ServerProcess, honest: httpx.AsyncClient
) -> None:
    """Connections that announce 1 MiB and send all but its last byte: the most an HTTP client
    can make the server hold. Measured, then released when they go."""
    before = dcb_server.rss_kib()
    writers = []
    for _ in range(MAX_CONNECTIONS - 2):  # the honest client and a spare have theirs
        reader, writer = await asyncio.open_connection("127.0.0.1", dcb_server.port)
        writer.write(
            b"POST /dcb/v1/append HTTP/1.1\r\nHost: x\r\nAuthorization: Basic "
            b"YWxpY2U6YWxpY2UtcHc=\r\nContent-Length: 1048576\r\n\r\n" + b" " * (MIB - 1)
        )
        await writer.drain()
        writers.append((reader, writer))
    assert (await honest.post("/read", json={"limit": 1})).status_code == 200
    held = (dcb_server.rss_kib() - before) / len(writers)
    print(f"\nan unfinished 1 MiB DCB body: RSS +{held:.0f} KiB per connection")
    assert held < 3 * 1024
    for _reader, writer in writers:
        writer.close()


async def test_bodies_at_the_limit_cost_a_bounded_amount(
    dcb_server: ServerProcess, honest: httpx.AsyncClient
) -> None:
    """1 MiB bodies of the costliest shapes to parse, several at once: refused, and the memory
    they took while parsed comes back within a bound."""
    bad = '{"type":"bad type"}'  # last, so that all before it is parsed
    shapes = [
        '{"events":[{"type":"A","data":[' + ",".join(["0"] * (MIB // 2 - 200)) + "]}," + bad + "]}",
        '{"events":[{"type":"A","data":{'
        + ",".join(f'"{n}":0' for n in range(90_000))
        + "}},"
        + bad
        + "]}",
        '{"events":[' + ",".join(['{"type":"A","tags":["t"]}'] * 40_000) + "]}",
    ]

    async def post(client: httpx.AsyncClient, body: str) -> int:
        return (await client.post("/append", content=body.encode(), timeout=60)).status_code

    await post(honest, shapes[0])  # warm up: the first allocations of every kind
    before = dcb_server.rss_kib()
    peak = before
    async with httpx.AsyncClient(base_url=dcb_server.http_url + "/dcb/v1", auth=AUTH) as abuser:
        for _ in range(3):
            statuses = await asyncio.gather(*(post(abuser, body) for body in shapes))
            peak = max(peak, dcb_server.rss_kib())
            assert statuses == [400, 400, 400]
    grown = dcb_server.rss_kib() - before
    print(f"\n1 MiB DCB bodies: RSS peak +{peak - before} KiB, after +{grown} KiB")
    assert grown < 32 * 1024


# -- fuzz -------------------------------------------------------------------------------------

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["A", "t", "t:v", "course:c1", "", " ", "\u0000", "Ω"]),
)
DCB_KEYS = st.sampled_from(
    ["events", "type", "data", "tags", "id", "bytes", "query", "items", "types", "condition",
     "failIfEventsMatch", "after", "limit", "backwards", "wait", "criteria", "properties",
     "version", "expectedHighestSequenceNumber", "x"]
)  # fmt: skip


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(DCB_KEYS, inner, max_size=5)


JSON_VALUES = st.recursive(JSON_LEAVES, _containers, max_leaves=20)


def mangle(data: bytes, cuts: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for position, byte in cuts:
        if out:
            out[position % len(out)] = byte
    return bytes(out)


BODIES = st.one_of(
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.tuples(
        JSON_VALUES.map(lambda value: json.dumps(value).encode()),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    ).map(lambda pair: mangle(*pair)),
    st.binary(max_size=64),
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/append", "/read"]), body=BODIES)
def test_fuzzed_bodies_get_a_json_answer(
    fuzz_dcb: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient], path: str, body: bytes
) -> None:
    loop, client = fuzz_dcb

    async def post() -> httpx.Response:
        return await client.post(path, content=body, timeout=30)

    response = loop.run_until_complete(post())
    assert response.status_code in (200, 400, 409), response.text
    if response.status_code != 200:
        document = response.json()
        assert document["error"] in ("InvalidRequest", "AppendConditionFailed", "EventIdConflict")
        assert document["message"]


@pytest.fixture(scope="module")
def fuzz_dcb(dcb_server: ServerProcess) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(base_url=dcb_server.http_url + "/dcb/v1", auth=AUTH)
    mark = len(dcb_server.log())
    yield loop, client
    loop.run_until_complete(client.aclose())
    loop.close()
    assert " ERROR " not in dcb_server.log()[mark:]
