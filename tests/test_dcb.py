"""The DCB API over HTTP against a real server: conditional appends, tag reads, both request
forms, idempotent retries, bad input, and one log with the FTN18 consumers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.dcb.client import (
    AppendConditionFailed,
    AsyncDcbClient,
    DcbClient,
    Event,
    Query,
    QueryItem,
    condition,
)
from futoin_evt.server.app import EventServer

from .support.servers import USERS

pytestmark = pytest.mark.functional

ALICE = ("alice", USERS["alice"])


def dcb_url(server: EventServer) -> str:
    return server.url.replace("ws", "http", 1) + "dcb/v1"


@pytest.fixture
async def http(server: EventServer) -> Any:
    async with httpx.AsyncClient(auth=ALICE, base_url=dcb_url(server), timeout=60) as client:
        yield client


async def append(http: httpx.AsyncClient, events: list[dict[str, Any]], **body: Any) -> Any:
    return await http.post("/append", json={"events": events, **body})


async def read(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/read", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def subscribed(student: str) -> dict[str, Any]:
    return {
        "type": "StudentSubscribed",
        "data": {"student": student},
        "tags": ["course:c1", f"student:{student}"],
    }


async def test_append_and_read_by_tag_type_and_position(http: httpx.AsyncClient) -> None:
    first = await append(http, [
        {"type": "CourseDefined", "data": {"places": 10}, "tags": ["course:c1"]},
        {"type": "CourseDefined", "data": {"places": 5}, "tags": ["course:c2"]},
    ])  # fmt: skip
    assert first.status_code == 200
    assert first.json() == {"position": 2}
    second = await append(http, [subscribed("s1")])
    assert second.json() == {"position": 3}

    everything = await read(http)
    assert [e["position"] for e in everything["events"]] == [1, 2, 3]
    assert everything["head"] == 3
    event = everything["events"][2]
    assert event["type"] == "StudentSubscribed"
    assert event["data"] == {"student": "s1"}
    assert event["tags"] == ["course:c1", "student:s1"]
    assert event["ts"].endswith("Z")

    c1 = await read(http, query={"items": [{"tags": ["course:c1"]}]})
    assert [e["position"] for e in c1["events"]] == [1, 3]
    defined = await read(http, query={"items": [{"types": ["CourseDefined"]}]}, after=1)
    assert [e["position"] for e in defined["events"]] == [2]
    both = await read(
        http, query={"items": [{"types": ["StudentSubscribed"], "tags": ["course:c1"]}]}
    )
    assert [e["position"] for e in both["events"]] == [3]
    nothing = await read(http, query={"items": [{"tags": ["course:c9"]}]})
    assert nothing == {"events": [], "head": 3}  # the head even when nothing matched
    backwards = await read(http, backwards=True, limit=2)
    assert [e["position"] for e in backwards["events"]] == [3, 2]
    before = await read(http, backwards=True, after=3, query={"items": [{"tags": ["course:c1"]}]})
    assert [e["position"] for e in before["events"]] == [1]


async def test_the_draft_query_form_with_a_tag_key_wildcard(http: httpx.AsyncClient) -> None:
    await append(http, [
        {"type": "A", "data": 1, "tags": ["course:c1"]},
        {"type": "B", "data": 2, "tags": ["student:s1"]},
        {"type": "C", "data": 3, "tags": ["course:c2", "student:s2"]},
    ])  # fmt: skip
    query: dict[str, Any] = {
        "version": "1.0",
        "criteria": [{"type": "Tags", "properties": {"tags": ["course"]}}],
    }
    assert [e["position"] for e in (await read(http, query=query))["events"]] == [1, 3]
    query["criteria"].append(
        {"type": "EventTypesAndTags", "properties": {"event_types": ["B"], "tags": ["student"]}}
    )
    assert [e["position"] for e in (await read(http, query=query))["events"]] == [1, 2, 3]
    expected = {"query": query, "expectedHighestSequenceNumber": 1}
    refused = await append(http, [{"type": "D", "data": 4}], condition=expected)
    assert refused.status_code == 409
    expected["expectedHighestSequenceNumber"] = 3
    assert (await append(http, [{"type": "D", "data": 4}], condition=expected)).status_code == 200


async def test_a_condition_fails_only_when_a_matching_event_came_after(
    http: httpx.AsyncClient,
) -> None:
    c1 = {"items": [{"tags": ["course:c1"]}]}
    await append(http, [subscribed("s1")])
    seen = await read(http, query=c1)
    head = seen["head"]
    await append(http, [{"type": "Unrelated", "data": None, "tags": ["course:c2"]}])
    ok = await append(http, [subscribed("s2")], condition={"failIfEventsMatch": c1, "after": head})
    assert ok.status_code == 200  # the event in between did not match
    late = await append(
        http, [subscribed("s3")], condition={"failIfEventsMatch": c1, "after": head}
    )
    assert late.status_code == 409
    assert late.json()["error"] == "AppendConditionFailed"
    never = await append(http, [subscribed("s4")], condition={"failIfEventsMatch": c1})
    assert never.status_code == 409  # no "after": any matching event at all
    stored = await read(http, query=c1)
    assert [e["data"]["student"] for e in stored["events"]] == ["s1", "s2"]


async def test_retries_with_ids_are_idempotent(http: httpx.AsyncClient) -> None:
    batch: list[dict[str, Any]] = [
        {"type": "A", "data": {"n": 1}, "tags": ["k:1"], "id": "evt-1"},
        {"type": "B", "data": [1, "two"], "id": "evt-2"},
    ]
    first = await append(http, batch)
    again = await append(http, batch)
    assert first.json() == again.json() == {"position": 2}
    assert (await read(http))["head"] == 2  # nothing stored the second time
    changed = [{**batch[0], "data": {"n": 2}}, batch[1]]
    conflict = await append(http, changed)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "EventIdConflict"
    stored = (await read(http))["events"]
    assert [(e["id"], e["data"]) for e in stored] == [("evt-1", {"n": 1}), ("evt-2", [1, "two"])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": []}, "events"),
        ({"events": [{"type": "bad type", "data": 1}]}, "events[0].type"),
        ({"events": [{"type": "A", "tags": ["a:b:c"]}]}, "events[0].tags[0]"),
        ({"events": [{"type": "A", "id": "no/slash"}]}, "events[0].id"),
        ({"events": [{"type": "A"}], "condition": {"after": 1}}, "condition.failIfEventsMatch"),
        ({"events": [{"type": "A"}], "extra": 1}, "extra"),
    ],
)
async def test_bad_appends_are_400_naming_the_field_and_store_nothing(
    http: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await http.post("/append", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == "InvalidRequest"
    assert response.json()["message"].startswith(field + ":")
    assert (await read(http))["head"] == 0


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"{not json", 400),
        (b"[1]", 400),
        (b'{"query": {"items": [{"tags": ["x y"]}]}}', 400),
        (b'{"limit": -1}', 400),
        (b'{"wait": 100}', 400),
    ],
)
async def test_bad_reads_are_400(http: httpx.AsyncClient, content: bytes, status: int) -> None:
    response = await http.post("/read", content=content)
    assert response.status_code == status
    assert response.json()["error"] == "InvalidRequest"


async def test_credentials_and_paths(server: EventServer) -> None:
    async with httpx.AsyncClient(base_url=dcb_url(server)) as anonymous:
        assert (await anonymous.post("/read", json={})).status_code == 401
        wrong = await anonymous.post("/read", json={}, auth=("alice", "wrong"))
        assert wrong.status_code == 401
        assert (await anonymous.post("/other", json={}, auth=ALICE)).status_code == 404
        assert (await anonymous.get("/read", auth=ALICE)).status_code == 405


async def test_one_log_ftn18_consumers_skip_what_ftn18_cannot_carry(
    http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    await alice.register_consumer("BILLING")
    ftn18_first = await alice.add_event("ORDER_PLACED", {"n": 1})
    await append(http, [
        {"type": "StudentSubscribed", "data": 1, "tags": ["course:c1"]},
        {"type": "ORDER_SHIPPED", "data": {"n": 1}, "tags": ["order:1"]},
        {"type": "course.renamed", "data": 2},
    ])  # fmt: skip
    ftn18_last = await alice.add_event("ORDER_PLACED", {"n": 2})
    polled = await alice.poll_events("BILLING")
    assert [(e.id, e.type) for e in polled] == [
        (ftn18_first, "ORDER_PLACED"),
        (ftn18_first + 2, "ORDER_SHIPPED"),  # a DCB event with an FTN18 type is seen
        (ftn18_last, "ORDER_PLACED"),
    ]
    live = await alice.poll_events("LIVE", ftn18_first)
    assert [e.id for e in live] == [ftn18_first + 2, ftn18_last]
    # DCB reads see every event of the log, the FTN18 ones too
    everything = await read(http)
    assert [e["position"] for e in everything["events"]] == list(range(1, ftn18_last + 1))
    assert everything["events"][0] == {**everything["events"][0], "tags": []}


async def test_ftn18_consumers_skip_a_tail_of_dcb_events(
    http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    await alice.register_consumer("TAIL")
    await append(http, [{"type": "Only.Dcb", "data": i} for i in range(5)])
    assert await alice.poll_events("TAIL") == []
    assert await alice.poll_events("TAIL") == []
    added = await alice.add_event("AFTER", None)
    assert [e.id for e in await alice.poll_events("TAIL")] == [added]


async def test_dcb_events_survive_discarding(
    server: EventServer, http: httpx.AsyncClient, alice: EventStreamClient
) -> None:
    await alice.register_consumer("ALL")
    ftn18 = await alice.add_event("OLD", None)
    await append(http, [{"type": "Kept", "data": 1, "tags": ["t"]}])
    newest = await alice.add_event("NEW", None)
    read_by_all = await alice.poll_events("ALL")
    assert await alice.poll_events("ALL", last_id=read_by_all[-1].id) == []  # acknowledged
    await server.discarder.discard()  # the only consumer has read everything
    left = await read(http)
    assert [e["type"] for e in left["events"]] == ["Kept"]
    assert ftn18 < left["events"][0]["position"] < newest


async def test_a_read_without_limit_streams_every_page(http: httpx.AsyncClient) -> None:
    for chunk in range(3):
        events = [{"type": "Bulk", "data": chunk * 1000 + i, "tags": ["bulk"]} for i in range(1000)]
        assert (await append(http, events)).status_code == 200
    everything = await read(http, query={"items": [{"tags": ["bulk"]}]})
    assert [e["data"] for e in everything["events"]] == list(range(3000))
    limited = await read(http, query={"items": [{"tags": ["bulk"]}]}, after=10, limit=1500)
    assert [e["position"] for e in limited["events"]] == list(range(11, 1511))
    # a small first step, then whole pages: the events over a step's edge come once
    for limit in (49, 50, 51, 1050, 1051, None):
        newest = await read(
            http, query={"items": [{"tags": ["bulk"]}]}, backwards=True, limit=limit
        )
        assert [e["position"] for e in newest["events"]] == list(
            range(3000, 3000 - (limit or 3000), -1)
        )
        oldest = await read(http, query={"items": [{"tags": ["bulk"]}]}, limit=limit)
        assert [e["position"] for e in oldest["events"]] == list(range(1, (limit or 3000) + 1))
    async with http.stream(
        "POST", "/read", json={"limit": 3}, headers={"Accept": "application/x-ndjson"}
    ) as response:
        lines = [json.loads(line) async for line in response.aiter_lines() if line]
    assert [line.get("position") for line in lines[:3]] == [1, 2, 3]
    assert lines[3] == {"head": 3000}


async def test_exactly_ten_of_200_concurrent_subscriptions_succeed(
    server: EventServer, http: httpx.AsyncClient
) -> None:
    """The invariant DCB exists for: each client reads the course's subscriptions and
    appends only while fewer than 10 exist, on the condition that none came since."""
    course = {"items": [{"tags": ["course:c1"]}]}
    clients = [
        httpx.AsyncClient(auth=ALICE, base_url=dcb_url(server), timeout=120) for _ in range(8)
    ]

    async def try_to_subscribe(student: int) -> bool:
        client = clients[student % len(clients)]
        while True:
            seen = (await client.post("/read", json={"query": course})).json()
            if len(seen["events"]) >= 10:
                return False
            condition = {"failIfEventsMatch": course, "after": seen["head"]}
            response = await client.post(
                "/append", json={"events": [subscribed(f"s{student}")], "condition": condition}
            )
            if response.status_code == 200:
                return True
            assert response.json()["error"] == "AppendConditionFailed"  # retry with news

    try:
        outcomes = await asyncio.gather(*(try_to_subscribe(i) for i in range(200)))
    finally:
        for client in clients:
            await client.aclose()
    assert outcomes.count(True) == 10
    stored = await read(http, query=course)
    assert len(stored["events"]) == 10
    assert len({e["data"]["student"] for e in stored["events"]}) == 10


async def test_python_clients_round_trip_bytes_json_and_subscribe(server: EventServer) -> None:
    url = server.url.replace("ws", "http", 1)
    credentials = "alice:" + USERS["alice"]
    raw = bytes(range(256))
    with DcbClient(url, credentials=credentials) as blocking:
        first = await asyncio.to_thread(
            blocking.append,
            [Event("Blob", raw, ["kind:blob"], "b-1"), Event("Doc", {"big": 2**70}, ["kind:doc"])],
        )
        assert first == 2
        result = await asyncio.to_thread(blocking.read, Query([QueryItem(tags=["kind:blob"])]))
        assert [(e.position, e.data, e.id) for e in result.events] == [(1, raw, "b-1")]
        with pytest.raises(AppendConditionFailed):
            await asyncio.to_thread(
                blocking.append,
                [Event("Doc", None)],
                condition(Query([QueryItem(types=["Doc"])]), after=1),
            )
    async with AsyncDcbClient(url, credentials=credentials) as client:
        docs = await client.read({"items": [{"types": ["Doc"]}]})
        assert [e.data for e in docs.events] == [{"big": 2**70}]
        stream = client.subscribe({"items": [{"tags": ["kind:live"]}]}, after=docs.head)
        pending = asyncio.ensure_future(anext(stream))
        await client.append([Event("Other", 1, ["kind:other"]), Event("Live", 2, ["kind:live"])])
        async with asyncio.timeout(30):
            live = await pending
        assert (live.type, live.data, live.position) == ("Live", 2, 4)
        await stream.aclose()


DCB_IFACE = "futoin.evt.dcb:1.0"


async def test_the_ftn3_iface_shares_the_log_and_the_rules(
    alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    call = alice.ftn3.call
    c1 = {"items": [{"tags": ["course:c1"]}]}
    first = await call(DCB_IFACE, "append", {"events": [subscribed("s1")]})
    assert first == 1
    over_http = await append(http, [subscribed("s2")])
    assert over_http.json() == {"position": 2}
    seen = await call(DCB_IFACE, "read", {"query": c1})
    assert [e["position"] for e in seen["events"]] == [1, 2]
    assert seen["head"] == 2
    assert "next" not in seen
    backwards = await call(DCB_IFACE, "readBackwards", {"query": c1, "limit": 1})
    assert [e["position"] for e in backwards["events"]] == [2]
    with pytest.raises(RemoteError) as failed:
        await call(
            DCB_IFACE,
            "append",
            {"events": [subscribed("s3")], "condition": {"failIfEventsMatch": c1, "after": 1}},
        )
    assert failed.value.name == "AppendConditionFailed"
    with pytest.raises(RemoteError) as bad:
        await call(DCB_IFACE, "append", {"events": [{"type": "A", "tags": ["x y"]}]})
    assert (bad.value.name, bad.value.desc.split(":")[0]) == ("InvalidRequest", "events[0].tags[0]")
    with pytest.raises(RemoteError) as empty:
        await call(DCB_IFACE, "append", {"events": []})
    assert empty.value.name == "InvalidRequest"


async def test_the_ftn3_iface_pages_large_reads(alice: EventStreamClient) -> None:
    big = "x" * 60_000
    for _ in range(15):  # 9 MB: more than one 8 MiB reply
        batch = [{"type": "Big", "data": big, "tags": ["big"]} for _ in range(10)]
        await alice.ftn3.call(DCB_IFACE, "append", {"events": batch})
    positions: list[int] = []
    replies = 0
    after = 0
    while True:
        reply = await alice.ftn3.call(
            DCB_IFACE, "read", {"query": {"items": [{"tags": ["big"]}]}, "after": after}
        )
        positions += [e["position"] for e in reply["events"]]
        replies += 1
        if "next" not in reply:
            break
        after = reply["next"]
    assert positions == list(range(1, 151))
    assert replies == 2
