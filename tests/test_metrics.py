"""serve --metrics: /metrics read by prometheus-client's own parser after known work, /healthz,
/readyz; --log-format json."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import Event, EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.partition import Partition
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from futoin_evt.storage import open_store

from .support.amqp_wire import Peer, login
from .support.servers import USERS, ServerFactory, add_user, run_without

pytestmark = pytest.mark.functional

STREAM = {"stream": "events", "partition": "0"}

#: Every family docs/operations.md lists (counters without their _total, as the parser names them).
FAMILIES = {
    "futoin_evt_events_appended": "counter",
    "futoin_evt_events_appended_bytes": "counter",
    "futoin_evt_stream_head_id": "gauge",
    "futoin_evt_stream_oldest_id": "gauge",
    "futoin_evt_consumer_position": "gauge",
    "futoin_evt_consumer_lag_events": "gauge",
    "futoin_evt_consumer_oldest_unread_age_seconds": "gauge",
    "futoin_evt_consumer_push_groups_in_flight": "gauge",
    "futoin_evt_consumer_push_retries": "counter",
    "futoin_evt_consumers_registered": "gauge",
    "futoin_evt_consumers_left_out": "gauge",
    "futoin_evt_consumers_read_seconds": "gauge",
    "futoin_evt_door_connections": "gauge",
    "futoin_evt_door_handshakes": "gauge",
    "futoin_evt_door_refusals": "counter",
    "futoin_evt_calls": "counter",
    "futoin_evt_call_duration_seconds": "histogram",
    "futoin_evt_commit_batch_writes": "histogram",
    "futoin_evt_commit_duration_seconds": "histogram",
    "futoin_evt_events_discarded": "counter",
    "futoin_evt_events_archived": "counter",
    "futoin_evt_management_events": "counter",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "python_info": "gauge",
}


class Scrape:
    """One parsed /metrics: samples by name, each family's type and help."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples if s.name == name and _has(s, labels)]
        assert len(found) == 1, f"{name} {labels}: {found}"
        return found[0]

    def count(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when there is none yet (a series starts with its first call)."""
        return sum(self.values(name, **labels))

    def values(self, name: str, **labels: str) -> list[float]:
        return [s.value for s in self.samples if s.name == name and _has(s, labels)]


def _has(sample: Sample, labels: dict[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels.items())


@pytest.fixture
async def metered(start_server: ServerFactory) -> EventServer:
    return await start_server(metrics=("127.0.0.1", 0))


@pytest.fixture
async def alice(metered: EventServer) -> AsyncIterator[EventStreamClient]:
    """alice on the metered server."""
    async with await client_of(metered) as client:
        yield client


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """Without credentials: /metrics is open, and a test sets its own."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def scrape(http: httpx.AsyncClient, server: EventServer) -> Scrape:
    assert server.metrics_url is not None
    reply = await http.get(server.metrics_url)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    # scrapes within the cache time share a read of the store: each test wants a fresh one
    assert server.metrics is not None
    server.metrics.snapshot.cache_seconds = 0.0
    return Scrape(reply.text)


async def client_of(server: EventServer, user: str = "alice") -> EventStreamClient:
    return await EventStreamClient.connect(server.url, credentials=f"{user}:{USERS[user]}")


async def test_every_family_is_there_with_help_and_known_labels(
    metered: EventServer, http: httpx.AsyncClient
) -> None:
    async with await client_of(metered) as alice:
        await alice.register_consumer("C")
        await alice.add_event("E", {})
        metered.metrics.snapshot.cache_seconds = 0.0  # type: ignore[union-attr]
        result = await scrape(http, metered)
    for name, kind in FAMILIES.items():
        family = result.families.get(name)
        assert family is not None, f"{name} missing"
        assert family.type == kind, name
        assert family.documentation, f"{name} has no HELP"
    for name in ("futoin_evt_events_appended_total", "futoin_evt_stream_head_id"):
        assert result.value(name, **STREAM) >= 1
    assert result.value("futoin_evt_consumer_position", user="alice", component="C", **STREAM) == 0
    assert result.value("futoin_evt_door_connections", door="websocket") == 1
    # labels of bounded sets only: nothing per event, per peer or per request
    allowed = {"stream", "partition", "user", "component", "door", "reason", "iface"}
    allowed |= {"function", "outcome", "type", "le"}
    for sample in result.samples:
        if sample.name.startswith("futoin_evt_"):
            assert set(sample.labels) <= allowed, sample


async def test_n_events_added_count_n_and_the_head_follows(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    before = await scrape(http, metered)
    ids = [await alice.add_event("E", {"i": i}) for i in range(25)]
    after = await scrape(http, metered)
    name = "futoin_evt_events_appended_total"
    assert after.value(name, **STREAM) - before.value(name, **STREAM) == 25
    assert after.value("futoin_evt_stream_head_id", **STREAM) == ids[-1]
    assert after.value("futoin_evt_stream_oldest_id", **STREAM) == 1
    assert after.value("futoin_evt_events_appended_bytes_total", **STREAM) > 25 * len('{"i":0}')
    calls = {"door": "websocket", "iface": "futoin.evt.gen", "function": "addEvent"}
    assert (
        after.value("futoin_evt_calls_total", outcome="ok", **calls)
        - before.count("futoin_evt_calls_total", outcome="ok", **calls)
        == 25
    )
    assert after.value("futoin_evt_call_duration_seconds_count", outcome="ok", **calls) >= 25
    writes = after.value("futoin_evt_commit_batch_writes_sum")
    assert writes - before.value("futoin_evt_commit_batch_writes_sum") >= 25


async def _orders(server: EventServer, partitions: int = 2) -> list[Partition]:
    """A stream ``orders`` the server serves at once."""
    info = await server.store.add_stream("orders", partitions)
    await server.streams.refresh()
    return list(info.partitions)


async def test_every_partition_of_every_stream_counts_its_own(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    zero, one = await _orders(metered)
    before = await scrape(http, metered)
    assert before.value("futoin_evt_stream_head_id", stream="orders", partition="1") == 0
    orders = metered.store.partition_log(one)
    ids = [await orders.append("Placed", f'{{"n":{n}}}') for n in range(3)]
    await alice.add_event("E", {})
    await alice.add_event("E", {})
    after = await scrape(http, metered)
    appended = "futoin_evt_events_appended_total"
    assert after.value(appended, stream="orders", partition="1") == 3
    assert after.value(appended, stream="orders", partition="0") == 0
    assert after.value(appended, **STREAM) - before.value(appended, **STREAM) == 2
    assert after.value("futoin_evt_stream_head_id", stream="orders", partition="1") == ids[-1] == 3
    assert after.value("futoin_evt_stream_oldest_id", stream="orders", partition="1") == 1
    assert after.value("futoin_evt_stream_oldest_id", stream="orders", partition="0") == 0
    size = after.value("futoin_evt_events_appended_bytes_total", stream="orders", partition="1")
    assert size > 3 * len('{"n":0}')
    # a stream dropped is no longer reported
    await metered.store.drop_stream("orders")
    await metered.streams.refresh()
    gone = await scrape(http, metered)
    assert not gone.values("futoin_evt_stream_head_id", stream="orders")
    assert zero.stream == "orders"


async def test_lag_per_partition_is_what_the_store_reports(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    _zero, one = await _orders(metered)
    orders = metered.store.partition_log(one)
    user = await metered.store.get_user("alice")
    assert user is not None
    await orders.register_consumer(user.id, "BILLING")
    await alice.register_consumer("BILLING")  # the same name on events/0: another consumer
    ids = [await orders.append("Placed", "{}") for _ in range(4)]
    labels = {"user": "alice", "component": "BILLING", "stream": "orders", "partition": "1"}
    result = await scrape(http, metered)
    (row,) = await orders.consumers(user.id)
    assert result.value("futoin_evt_consumer_lag_events", **labels) == row.behind == 4
    assert result.value("futoin_evt_consumer_lag_events", **{**labels, **STREAM}) == 0
    await orders.acknowledge(user.id, "BILLING", ids[1])
    result = await scrape(http, metered)
    assert result.value("futoin_evt_consumer_lag_events", **labels) == 2
    assert result.value("futoin_evt_consumer_position", **labels) == ids[1]
    assert result.value("futoin_evt_consumers_registered") == 2


async def test_the_consumer_limit_spans_partitions(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    assert metered.metrics is not None
    metered.metrics.snapshot.limit = 3
    zero, one = await _orders(metered)
    user = await metered.store.get_user("alice")
    assert user is not None
    for partition in (zero, one):
        for name in ("A", "B"):
            await metered.store.partition_log(partition).register_consumer(user.id, name)
    result = await scrape(http, metered)
    assert len(result.values("futoin_evt_consumer_lag_events")) == 3
    assert result.value("futoin_evt_consumers_registered") == 4
    assert result.value("futoin_evt_consumers_left_out") == 1


async def test_connections_count_under_their_door_not_their_port(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    """The WebSocket port serves several doors: each connection counts under the one it uses."""
    await alice.ping()  # logged in: past its handshake
    async with await client_of(metered, "bob") as bob:
        await Notifications(bob.ftn3).subscribe("eventType = 'E'")
        assert metered.feed_url is not None
        basic = {"Authorization": "Basic " + base64.b64encode(b"alice:alice-pw").decode()}
        async with httpx.AsyncClient(timeout=30) as feed, httpx.AsyncClient(timeout=30) as dcb:
            assert (await feed.get(metered.feed_url, headers=basic)).status_code == 200
            dcb_url = metered.url.replace("ws", "http", 1).rstrip("/") + "/dcb/v1/read"
            assert (await dcb.post(dcb_url, json={}, headers=basic)).status_code == 200
            result = await scrape(http, metered)
    connections = {
        door: result.value("futoin_evt_door_connections", door=door)
        for door in ("websocket", "notify", "feed", "dcb", "amqp", "console")
    }
    assert connections == {
        "websocket": 1,
        "notify": 1,
        "feed": 1,
        "dcb": 1,
        "amqp": 0,
        "console": 0,
    }


async def test_calls_are_counted_by_function_and_outcome(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    with pytest.raises(RemoteError):
        await alice.add_event("bad type", {})
    with pytest.raises(RemoteError):
        await alice.ftn3.call("futoin.evt.gen:1.0", "noSuchFunction", {})
    result = await scrape(http, metered)
    gen = {"door": "websocket", "iface": "futoin.evt.gen"}
    assert (
        result.value("futoin_evt_calls_total", function="addEvent", outcome="InvalidRequest", **gen)
        == 1
    )
    # a function the iface does not define is not a label value
    assert (
        result.value(
            "futoin_evt_calls_total", function="unknown", outcome="InvalidRequest", iface="unknown"
        )
        == 1
    )
    assert not [s for s in result.samples if "noSuchFunction" in s.labels.values()]


async def test_lag_is_what_the_store_reports_and_goes_down_after_acknowledging(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    await alice.register_consumer("LAGGY")
    ids = [await alice.add_event("E", {"i": i}) for i in range(10)]
    result = await scrape(http, metered)
    consumer = {"user": "alice", "component": "LAGGY", **STREAM}
    (row,) = [r for r in await metered.store.consumers() if r.component == "LAGGY"]
    assert result.value("futoin_evt_consumer_lag_events", **consumer) == row.behind == 10
    assert result.value("futoin_evt_consumer_oldest_unread_age_seconds", **consumer) >= 0
    await alice.poll_events("LAGGY", last_id=ids[3])
    result = await scrape(http, metered)
    assert result.value("futoin_evt_consumer_lag_events", **consumer) == 6
    assert result.value("futoin_evt_consumer_position", **consumer) == ids[3]


async def test_consumers_past_the_limit_are_counted_not_listed(
    metered: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    assert metered.metrics is not None
    metered.metrics.snapshot.limit = 3
    for index in range(5):
        await alice.register_consumer(f"C{index}")
    result = await scrape(http, metered)
    assert len(result.values("futoin_evt_consumer_lag_events")) == 3
    assert result.value("futoin_evt_consumers_registered") == 5
    assert result.value("futoin_evt_consumers_left_out") == 2


async def test_a_refused_login_counts_with_its_door_and_reason(
    metered: EventServer, http: httpx.AsyncClient
) -> None:
    before = await scrape(http, metered)
    async with await EventStreamClient.connect(metered.url, credentials="alice:wrong") as bad:
        with pytest.raises(RemoteError):
            await bad.ping()
    assert metered.feed_url is not None
    basic = base64.b64encode(b"bob:wrong").decode()
    reply = await http.get(metered.feed_url, headers={"Authorization": f"Basic {basic}"})
    assert reply.status_code == 401
    after = await scrape(http, metered)
    name = "futoin_evt_door_refusals_total"
    for door in ("websocket", "feed"):
        grown = after.value(name, door=door, reason="bad_credentials") - before.value(
            name, door=door, reason="bad_credentials"
        )
        assert grown == 1, door
    feed = {"door": "feed", "iface": "feed", "function": "read", "outcome": "401"}
    assert after.value("futoin_evt_calls_total", **feed) == 1
    assert after.value("futoin_evt_management_events_total", type="org.futoin.evt.authFailed") >= 2


async def test_healthz_and_readyz_then_not_ready_when_a_listener_or_the_store_stops(
    metered: EventServer, http: httpx.AsyncClient
) -> None:
    assert metered.metrics_url is not None
    base = metered.metrics_url.removesuffix("/metrics")
    assert (await http.get(base + "/healthz")).status_code == 200
    assert (await http.get(base + "/readyz")).status_code == 200
    assert (await http.get(base + "/other")).status_code == 404
    assert (await http.post(base + "/metrics")).status_code == 405
    await metered.transport.close(asyncio.get_running_loop().time())
    reply = await http.get(base + "/readyz")
    assert reply.status_code == 503
    assert reply.text == "not ready: the WebSocket port is not serving\n"
    assert (await http.get(base + "/healthz")).status_code == 200


async def test_readyz_is_503_when_the_store_is_closed(
    metered: EventServer, http: httpx.AsyncClient
) -> None:
    assert metered.metrics_url is not None
    base = metered.metrics_url.removesuffix("/metrics")
    await metered.store.close()
    reply = await http.get(base + "/readyz")
    assert reply.status_code == 503
    assert reply.text.startswith("not ready: the store does not answer")
    assert reply.text.count("\n") == 1
    # the rest of /metrics is still served
    assert (await scrape(http, metered)).value("futoin_evt_door_connections", door="websocket") == 0


async def test_two_servers_in_one_process_count_apart(
    start_server: ServerFactory, http: httpx.AsyncClient
) -> None:
    """Each server has its own registry (two processes on one file, as in production)."""
    one = await start_server(metrics=("127.0.0.1", 0))
    two = await start_server(metrics=("127.0.0.1", 0))
    async with await client_of(one) as alice:
        await alice.add_event("E", {})
    name = "futoin_evt_events_appended_total"
    assert (await scrape(http, one)).value(name, **STREAM) == 1
    assert (await scrape(http, two)).value(name, **STREAM) == 0


async def test_on_postgresql_the_pool_is_reported_too(pg_url: str, http: httpx.AsyncClient) -> None:
    config = ServerConfig(db=pg_url, transport=TransportConfig(port=0), metrics=("127.0.0.1", 0))
    async with await EventServer.start(config) as server:
        # with read on the stream, or the retention pass drops the consumer
        user = await add_user(server.store, "alice", hash_password(USERS["alice"]))
        await server.store.register_consumer(user, "PG")
        for _ in range(3):
            await server.store.append("E", "{}")
        result = await scrape(http, server)
        assert result.value("futoin_evt_events_appended_total", **STREAM) == 3
        consumer = {"user": "alice", "component": "PG", **STREAM}
        assert result.value("futoin_evt_consumer_lag_events", **consumer) == 3
        assert result.value("futoin_evt_pg_pool_requests_waiting") == 0
        assert result.value("futoin_evt_pg_pool_connections_in_use") >= 0
        assert result.families["futoin_evt_pg_pool_connections_in_use"].documentation
        (_zero, one) = await _orders(server)
        await server.store.partition_log(one).append("Placed", "{}")
        result = await scrape(http, server)
        assert result.value("futoin_evt_events_appended_total", stream="orders", partition="1") == 1
        assert result.value("futoin_evt_stream_head_id", stream="orders", partition="1") == 1


# -- the command line ---------------------------------------------------------------------------


def _serve(
    db: Path, *extra: str
) -> tuple[subprocess.Popen[str], str, tempfile._TemporaryFileWrapper[str]]:
    log = tempfile.NamedTemporaryFile("w+")  # noqa: SIM115 (closed by the test)
    # one process: with --workers, /metrics counts worker 0's connections only
    proc = subprocess.Popen(
        [sys.executable, "-m", "futoin_evt", "--log-format", "json", "serve",
         "--db", str(db), "--port", "0", "--workers", "1", *extra],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline(), log


async def _add_users(db: Path) -> None:
    store = await open_store(db)
    try:
        for name, password in USERS.items():
            await add_user(store, name, hash_password(password))
    finally:
        await store.close()


async def test_cli_metrics_on_port_0_and_json_log_lines_with_the_connection(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cli.sqlite"
    await _add_users(db)
    proc, line, log = _serve(db, "--metrics", "127.0.0.1:0", "--amqp", "127.0.0.1:0")
    try:
        metrics_url = re.search(r"http://127\.0\.0\.1:[0-9]+/metrics", line)
        assert metrics_url is not None, line
        ws_url = re.search(r"ws://[^ ]+", line)
        assert ws_url is not None
        failures = 1
        got: list[Event] = []
        done = asyncio.Event()

        async def flaky(events: list[Event]) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                raise RuntimeError("failing once on purpose")
            got.extend(events)
            done.set()

        receiver = ReliableReceiver(
            ws_url.group(0), credentials="alice:alice-pw", component="FLAKY", on_events=flaky
        )
        task = asyncio.create_task(receiver.run())
        async with asyncio.timeout(30):
            await receiver.ready.wait()
        async with await EventStreamClient.connect(
            ws_url.group(0), credentials="alice:alice-pw"
        ) as alice:
            await alice.add_event("E", {"n": 1})
            with pytest.raises(RemoteError):
                async with await EventStreamClient.connect(
                    ws_url.group(0), credentials="bob:secret-not-logged"
                ) as bob:
                    await bob.ping()
        async with asyncio.timeout(30):
            await done.wait()
        amqp_url = re.search(r"amqp://127\.0\.0\.1:([0-9]+)", line)
        assert amqp_url is not None, line
        peer = await Peer.connect(int(amqp_url.group(1)))
        await peer.send(login(b"\0alice\0amqp-wrong-pw"))
        await peer.until_closed()
        await peer.close()
        async with httpx.AsyncClient(timeout=30) as http:
            result = Scrape((await http.get(metrics_url.group(0))).text)
        assert result.value("futoin_evt_events_appended_total", **STREAM) == 1
        retries = {"user": "alice", "component": "FLAKY", **STREAM}
        assert result.value("futoin_evt_consumer_push_retries_total", **retries) == 1
        refused = {"reason": "bad_credentials"}
        assert result.value("futoin_evt_door_refusals_total", door="amqp", **refused) == 1
        assert result.value("futoin_evt_door_refusals_total", door="websocket", **refused) == 1
        receiver.stop()
        await task
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    log.seek(0)
    text = log.read()
    log.close()
    entries = [json.loads(line) for line in text.splitlines()]
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    (retry,) = [e for e in entries if "retry" in e["message"]]
    assert retry["level"] == "warning"
    assert retry["door"] == "websocket"
    assert retry["user"] == "alice"
    assert retry["peer"].startswith("127.0.0.1:")
    (amqp,) = [e for e in entries if e["message"].startswith("AMQP login failed")]
    assert amqp["door"] == "amqp"
    assert amqp["peer"].startswith("127.0.0.1:")
    assert "user" not in amqp  # not logged in
    assert "amqp-wrong-pw" not in text
    # a line written outside any connection carries none
    (shutdown,) = [e for e in entries if e["message"] == "shutting down"]
    assert "door" not in shutdown
    assert "secret-not-logged" not in text
    assert "alice-pw" not in text


def test_cli_metrics_refuses_a_bad_address(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "futoin_evt", "serve", "--db", str(tmp_path / "x.sqlite"),
         "--metrics", "nowhere"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == "futoin-evt: --metrics must be HOST:PORT, not 'nowhere'.\n"


def test_cli_metrics_without_prometheus_client_says_what_to_install(tmp_path: Path) -> None:
    db = str(tmp_path / "x.sqlite")
    proc = run_without("prometheus_client", ["serve", "--db", db, "--metrics", "127.0.0.1:0"])
    assert proc.returncode == 2
    assert proc.stderr == (
        "futoin-evt: --metrics needs prometheus-client: pip install 'futoin-evt[metrics]'\n"
    )
