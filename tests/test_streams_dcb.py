"""DCB on named streams: ``/dcb/v1/streams/NAME/...`` serves a stream of one partition, with
positions of its own; a stream of several partitions, an unknown one and a bad name are
refused with a status that says why, and nothing is stored. On both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.dcb.client import DcbClient, DcbError, Event, Query, QueryItem, condition
from futoin_evt.domain.partition import DEFAULT_STREAM
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.stream import UserId
from futoin_evt.ftn3.calls import CallContext
from futoin_evt.ftn3.errors import FTN3Error
from futoin_evt.ftn18.dcb import DcbCalls
from futoin_evt.server.app import EventServer

from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

ALICE = ("alice", USERS["alice"])


@pytest.fixture
async def streams_server(start_server: ServerFactory, store_db: str) -> EventServer:
    """A server on each backend with the streams ``ledger`` (1 partition) and ``orders`` (4)."""
    server = await start_server(db=store_db)
    await server.store.add_stream("ledger", 1)
    await server.store.add_stream("orders", 4)
    await server.streams.refresh()
    return server


def base_url(server: EventServer) -> str:
    return server.url.replace("ws", "http", 1)


@pytest.fixture
async def http(streams_server: EventServer) -> AsyncIterator[httpx.AsyncClient]:
    url = base_url(streams_server) + "dcb/v1"
    async with httpx.AsyncClient(auth=ALICE, base_url=url, timeout=60) as client:
        yield client


def course(name: str) -> dict[str, Any]:
    return {"type": "CourseDefined", "data": {"course": name}, "tags": [f"course:{name}"]}


async def stored(server: EventServer) -> dict[str, int]:
    """The newest id of every partition of every stream, by ``stream/partition``."""
    heads: dict[str, int] = {}
    for info in server.streams:
        for partition in info.partitions:
            log = server.store.partition_log(partition)
            heads[str(partition)] = await log.last_given_id()
    return heads


async def test_a_named_stream_of_one_partition_has_its_own_positions(
    streams_server: EventServer, http: httpx.AsyncClient
) -> None:
    assert (await http.post("/append", json={"events": [course("c0")]})).json() == {"position": 1}
    first = await http.post("/streams/ledger/append", json={"events": [course("c1")]})
    assert first.status_code == 200, first.text
    assert first.json() == {"position": 1}  # ids from 1 in each stream
    second = await http.post(
        "/streams/ledger/append", json={"events": [course("c2"), course("c1")]}
    )
    assert second.json() == {"position": 3}

    read = (await http.post("/streams/ledger/read", json={})).json()
    assert [(e["position"], e["data"]["course"]) for e in read["events"]] == [
        (1, "c1"),
        (2, "c2"),
        (3, "c1"),
    ]
    assert read["head"] == 3
    tagged = await http.post(
        "/streams/ledger/read", json={"query": {"items": [{"tags": ["course:c1"]}]}}
    )
    assert [e["position"] for e in tagged.json()["events"]] == [1, 3]

    # The condition is checked against this stream only: c0 of events is not in it.
    refused = await http.post(
        "/streams/ledger/append",
        json={
            "events": [course("c1")],
            "condition": {"failIfEventsMatch": {"items": [{"tags": ["course:c1"]}]}, "after": 1},
        },
    )
    assert refused.status_code == 409
    assert refused.json()["error"] == "AppendConditionFailed"
    accepted = await http.post(
        "/streams/ledger/append",
        json={
            "events": [course("c0")],
            "condition": {"failIfEventsMatch": {"items": [{"tags": ["course:c0"]}]}},
        },
    )
    assert accepted.json() == {"position": 4}
    # /dcb/v1 and /dcb/v1/streams/events are the same log.
    events = (await http.post(f"/streams/{DEFAULT_STREAM}/read", json={})).json()
    assert [e["data"]["course"] for e in events["events"]] == ["c0"]
    assert (await stored(streams_server))["ledger/0"] == 4


@pytest.mark.parametrize(
    ("path", "status", "error", "says"),
    [
        ("/streams/orders/append", 400, "PartitionedStream", "4 partitions"),
        ("/streams/orders/read", 400, "PartitionedStream", "one order of events"),
        ("/streams/nowhere/append", 404, "UnknownStream", "no stream nowhere"),
        ("/streams/Bad!Name/append", 400, "InvalidStream", "invalid stream name"),
        ("/streams/dcb/append", 400, "InvalidStream", "reserved"),
        ("/streams/" + "x" * 49 + "/read", 400, "InvalidStream", "1 to 48"),
        ("/streams/ledger/other", 404, "NotFound", "streams/NAME/append"),
        ("/streams/ledger", 404, "NotFound", "/append and /read"),
        ("/streams//append", 400, "InvalidStream", "invalid stream name"),
    ],
)
async def test_streams_dcb_cannot_serve_are_refused_and_store_nothing(
    streams_server: EventServer,
    http: httpx.AsyncClient,
    path: str,
    status: int,
    error: str,
    says: str,
) -> None:
    before = await stored(streams_server)
    response = await http.post(path, json={"events": [course("c1")]})
    assert response.status_code == status, response.text
    assert response.json()["error"] == error
    assert says in response.json()["message"]
    assert await stored(streams_server) == before


async def test_a_refusal_needs_credentials_first(streams_server: EventServer) -> None:
    url = base_url(streams_server) + "dcb/v1/streams/orders/append"
    async with httpx.AsyncClient(timeout=60) as anonymous:
        assert (await anonymous.post(url, json={"events": [course("c1")]})).status_code == 401


async def test_the_python_clients_take_a_stream(streams_server: EventServer) -> None:
    url = base_url(streams_server)
    credentials = ":".join(ALICE)

    def run() -> tuple[list[int], list[int], DcbError, DcbError]:
        with (
            DcbClient(url, credentials=credentials, stream="ledger") as ledger,
            DcbClient(url, credentials=credentials) as events,
        ):
            ledger.append([Event("A", {"n": 1}, ["k:1"]), Event("B", b"\x00\x01", ["k:2"])])
            events.append([Event("A", {"n": 0}, ["k:1"])])
            query = Query([QueryItem(tags=["k:1"])])
            ledger.append([Event("C", 3, ["k:1"])], condition(query, after=1))
            in_ledger = [e.position for e in ledger.read(query).events]
            in_events = [e.position for e in events.read(query).events]
            with (
                DcbClient(url, credentials=credentials, stream="orders") as orders,
                pytest.raises(DcbError) as partitioned,
            ):
                orders.read()
            with (
                DcbClient(url, credentials=credentials, stream="a/b") as bad,
                pytest.raises(DcbError) as invalid,
            ):
                bad.append([Event("A", 1)])
            return in_ledger, in_events, partitioned.value, invalid.value

    in_ledger, in_events, partitioned, invalid = await asyncio.to_thread(run)
    assert in_ledger == [1, 3]
    assert in_events == [1]
    assert (partitioned.status, partitioned.error) == (400, "PartitionedStream")
    assert (invalid.status, invalid.error) == (400, "InvalidStream")
    assert (await stored(streams_server))["orders/0"] == 0


async def test_the_eventsourcing_recorder_takes_a_stream(streams_server: EventServer) -> None:
    pytest.importorskip("eventsourcing")
    from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem

    from futoin_evt.dcb.eventsourcing import FutoinDCBRecorder

    def run() -> tuple[int, list[int]]:
        recorder = FutoinDCBRecorder(
            base_url(streams_server), credentials=":".join(ALICE), stream="ledger"
        )
        try:
            query = DCBQuery(items=[DCBQueryItem(tags=["x"])])
            position = recorder.append(
                [DCBEvent("E", b"1", ["x"])], DCBAppendCondition(query, after=None)
            )
            return position, [e.position for e in recorder.read(query)]
        finally:
            recorder.close()

    assert await asyncio.to_thread(run) == (1, [1])
    assert (await stored(streams_server))["events/0"] == 0


async def test_the_ftn3_calls_of_a_stream(streams_server: EventServer) -> None:
    """What the FTN3 door on ``/NAME`` calls: the DCB calls of a stream, or the refusal."""
    streams, logs = streams_server.streams, streams_server.logs
    calls = DcbCalls.of_stream("ledger", streams.get, logs.partition)
    context = CallContext(Principal(UserId(1), "alice", is_admin=False), 65536)
    params = {"events": [course("c1")], "condition": None}
    assert await calls.append(context, params).future == 1  # answered from the commit's future
    for name, says in [
        ("orders", "4 partitions: a DCB condition needs one order of events"),
        ("nowhere", "There is no stream nowhere"),
        ("Bad", "invalid stream name"),
    ]:
        with pytest.raises(FTN3Error) as refused:
            DcbCalls.of_stream(name, streams.get, logs.partition)
        assert refused.value.name == "InvalidRequest"
        assert says in refused.value.desc
    assert (await stored(streams_server))["ledger/0"] == 1


async def test_ftn3_dcb_on_the_paths_of_a_stream(
    streams_server: EventServer, http: httpx.AsyncClient
) -> None:
    """``ws://HOST:PORT/NAME`` and ``/NAME/0`` serve DCB of a stream of one partition, the
    same log as ``/dcb/v1/streams/NAME``; on a stream of more every call says why not."""
    iface = "futoin.evt.dcb:1.0"
    credentials = ":".join(ALICE)
    query = {"items": [{"tags": ["course:c1"]}]}
    async with (
        await EventStreamClient.connect(
            streams_server.url + "ledger", credentials=credentials
        ) as ledger,
        await EventStreamClient.connect(
            streams_server.url + "ledger/0", credentials=credentials
        ) as ledger_0,
    ):
        assert await ledger.ftn3.call(iface, "append", {"events": [course("c1")]}) == 1
        assert await ledger_0.ftn3.call(iface, "append", {"events": [course("c1")]}) == 2
        over_http = await http.post("/streams/ledger/read", json={"query": query})
        assert [e["position"] for e in over_http.json()["events"]] == [1, 2]
        with pytest.raises(RemoteError) as failed:
            await ledger.ftn3.call(
                iface,
                "append",
                {"events": [course("c1")], "condition": {"failIfEventsMatch": query, "after": 1}},
            )
        assert failed.value.name == "AppendConditionFailed"
        backwards = await ledger_0.ftn3.call(iface, "readBackwards", {"query": query, "limit": 1})
        assert [e["position"] for e in backwards["events"]] == [2]
    for path in ("orders", "orders/2"):
        async with await EventStreamClient.connect(
            streams_server.url + path, credentials=credentials
        ) as orders:
            for func, params in [("append", {"events": [course("c1")]}), ("read", {})]:
                with pytest.raises(RemoteError) as refused:
                    await orders.ftn3.call(iface, func, params)
                assert refused.value.name == "InvalidRequest"
                assert "a DCB condition needs one order of events" in refused.value.desc
    heads = await stored(streams_server)
    assert (heads["ledger/0"], heads["events/0"]) == (2, 0)
    assert all(heads[f"orders/{n}"] == 0 for n in range(4))
