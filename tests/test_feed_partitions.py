"""Each stream's HTTP feed under ``/feeds/NAME``, on both backends: the unmodified zeroeventhub
client over all partitions of a 4-partition stream, FeedAPI v2 paging one partition, the 409
after the stream grows, 404 once it is dropped, and the errors of both protocols."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from zeroeventhub import Client as ZeroEventHubClient
from zeroeventhub import Cursor, Event

from futoin_evt.domain.partition import StreamInfo
from futoin_evt.ftn3.messages import encode_json
from futoin_evt.server.app import EventServer

from .support.feed import ALICE, FeedApiClient
from .support.servers import ServerFactory

pytestmark = pytest.mark.functional

STREAM = "orders"


@pytest.fixture
async def server(start_server: ServerFactory, store_db: str) -> EventServer:
    return await start_server(db=store_db)


async def add_stream(server: EventServer, name: str, partitions: int) -> StreamInfo:
    info = await server.store.add_stream(name, partitions)
    await server.streams.refresh()
    return info


async def append(server: EventServer, name: str, number: int, count: int) -> list[int]:
    """``count`` events on one partition; their ids. Each event's data names its partition."""
    partition = server.streams.partition(name, number)
    assert partition is not None
    log = server.store.partition_log(partition)
    ids: list[int] = []
    for start in range(0, count, 200):
        futures = [
            log.submit_append("ORDER", encode_json({"p": number, "n": n}))
            for n in range(start, min(start + 200, count))
        ]
        ids += await asyncio.gather(*futures)
    return ids


def feed_url(server: EventServer, name: str = STREAM) -> str:
    url = server.stream_feed_url(name)
    assert url is not None
    return url


async def read_all_with_zeroeventhub(
    url: str, partitions: int, page_size: int
) -> tuple[dict[int, list[dict[str, Any]]], dict[int, str], int]:
    """Page every partition from ``_first`` until a page is empty: the events by partition,
    the last cursors, and how many pages it took."""
    async with httpx.AsyncClient(auth=httpx.BasicAuth(*ALICE), timeout=30) as http:
        client = ZeroEventHubClient(url, partition_count=partitions, http_client=http)
        cursors = {k: Cursor(partition_id=k, cursor="_first") for k in range(partitions)}
        received: dict[int, list[dict[str, Any]]] = {k: [] for k in range(partitions)}
        pages = 0
        while True:
            events = 0
            async for item in client.fetch_events(list(cursors.values()), page_size):
                if isinstance(item, Cursor):
                    cursors[item.partition_id] = item
                else:
                    assert isinstance(item, Event)
                    received[item.partition_id].append(item.data)
                    events += 1
            pages += 1
            if not events:
                return received, {k: c.cursor for k, c in cursors.items()}, pages


async def test_zeroeventhub_client_reads_every_partition(server: EventServer) -> None:
    await add_stream(server, STREAM, 4)
    counts = {0: 523, 1: 130, 2: 777, 3: 1}
    ids = {k: await append(server, STREAM, k, n) for k, n in counts.items()}
    received, cursors, pages = await read_all_with_zeroeventhub(feed_url(server), 4, 200)
    for k, count in counts.items():
        events = received[k]
        assert [int(e["id"]) for e in events] == ids[k] == list(range(1, count + 1))
        assert {e["data"]["p"] for e in events} == {k}
        assert [e["data"]["n"] for e in events] == list(range(count))
        assert cursors[k] == str(count)
    # 1431 events in pages of at most 200, each shared by the partitions that have events
    assert pages == 9
    # the stream events is not these: it has one partition, and nothing
    _, events_cursors, _ = await read_all_with_zeroeventhub(feed_url(server, "events"), 1, 200)
    assert events_cursors == {0: "0"}


async def test_a_zeroeventhub_page_is_shared_by_the_partitions(
    server: EventServer, http: httpx.AsyncClient
) -> None:
    await add_stream(server, STREAM, 4)
    for k in range(4):
        await append(server, STREAM, k, 50)
    params = {"n": "4", "cursor0": "_first", "cursor2": "10", "cursor3": "_last"}
    response = await http.get(feed_url(server), params={**params, "pagesizehint": "30"})
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in response.text.splitlines()]
    events: dict[int, list[int]] = {}
    cursors: dict[int, str] = {}
    for line in lines:
        if "data" in line:
            events.setdefault(line["partition"], []).append(int(line["data"]["id"]))
        else:
            cursors[line["partition"]] = line["cursor"]
    # partition 1 was not asked for; 3 is caught up: 0 and 2 share the page
    assert events == {0: list(range(1, 16)), 2: list(range(11, 26))}
    assert cursors == {0: "15", 2: "25", 3: "50"}


async def test_feedapi_pages_one_partition(server: EventServer, http: httpx.AsyncClient) -> None:
    await add_stream(server, STREAM, 4)
    ids = {k: await append(server, STREAM, k, 120 * (k + 1)) for k in range(4)}
    client = FeedApiClient(http, feed_url(server))
    discovery = await client.discover()
    assert discovery["partitions"] == [{"id": str(k)} for k in range(4)]
    assert discovery["exactlyOnce"] is True
    for k in range(4):
        events, cursor = await client.read_to_end("_first", 50, partition=str(k))
        assert [int(e["id"]) for e in events] == ids[k]
        assert {e["data"]["p"] for e in events} == {k}
        assert cursor == str(ids[k][-1])
    # _last on one partition: only what comes to that partition later
    _events, last = await client.page("_last", partition="2")
    newer = await append(server, STREAM, 2, 3)
    await append(server, STREAM, 1, 3)
    events, _cursor = await client.page(last, partition="2")
    assert [int(e["id"]) for e in events] == newer
    assert client.discoveries == 1


async def test_a_wait_ends_when_any_partition_gets_an_event(
    server: EventServer, http: httpx.AsyncClient
) -> None:
    await add_stream(server, STREAM, 4)
    params = {"n": "4", **{f"cursor{k}": "0" for k in range(4)}, "wait": "30"}
    waiting = asyncio.create_task(http.get(feed_url(server), params=params))
    (added,) = await append(server, STREAM, 3, 1)
    response = await waiting
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["data"]["id"] for line in lines if "data" in line] == [str(added)]
    assert {line["partition"]: line["cursor"] for line in lines if "cursor" in line} == {
        0: "0", 1: "0", 2: "0", 3: str(added)
    }  # fmt: skip


async def test_growing_a_stream_changes_its_token(
    server: EventServer, http: httpx.AsyncClient
) -> None:
    """FeedAPI's method 1: fetches with the old token get 409, the discovery lists the new
    partitions, and the cursors of the old ones stay valid."""
    await add_stream(server, STREAM, 4)
    before = await append(server, STREAM, 1, 5)
    url = feed_url(server)
    client = FeedApiClient(http, url)
    old = await client.discover()
    _events, cursor = await client.page("_first", partition="1")
    await server.store.grow_stream(STREAM, 6)
    await server.streams.refresh()
    for k in ("0", "1", "5"):
        response = await http.get(
            url + "/events", params={"token": old["token"], "partition": k, "cursor": "_first"}
        )
        assert response.status_code == 409, response.text
        assert "discover the feed again" in response.text
    new = (await http.get(url)).json()
    assert new["token"] != old["token"]
    # every partition keeps taking events (none is closed): none starts after another
    assert new["partitions"] == [{"id": str(k)} for k in range(6)]
    after = await append(server, STREAM, 1, 2)
    added = await append(server, STREAM, 5, 3)
    events, _cursor = await client.page(cursor, partition="1")  # discovers again on 409
    assert client.discoveries == 2
    assert [int(e["id"]) for e in events] == after
    assert cursor == str(before[-1])
    events, _cursor = await client.page("_first", partition="5")
    assert [int(e["id"]) for e in events] == added
    # the unmodified ZeroEventHub client needs the new count
    response = await http.get(url, params={"n": "4", "cursor0": "_first"})
    assert (response.status_code, response.text) == (
        400,
        "n must be 6: this feed has 6 partitions.\n",
    )


async def test_a_dropped_stream_answers_404(server: EventServer, http: httpx.AsyncClient) -> None:
    await add_stream(server, STREAM, 2)
    await append(server, STREAM, 0, 3)
    url = feed_url(server)
    token = (await http.get(url)).json()["token"]
    assert await server.store.drop_stream(STREAM)
    await server.streams.refresh()
    for params in ({}, {"n": "2", "cursor0": "_first"}):
        response = await http.get(url, params=params)
        assert (response.status_code, response.text) == (404, "No stream 'orders'.\n")
    response = await http.get(
        url + "/events", params={"token": token, "partition": "0", "cursor": "_first"}
    )
    assert response.status_code == 404
    # added again, it is another stream: another token, the old one gets 409
    await add_stream(server, STREAM, 2)
    again = (await http.get(url)).json()["token"]
    assert again != token
    response = await http.get(
        url + "/events", params={"token": token, "partition": "0", "cursor": "_first"}
    )
    assert response.status_code == 409


async def test_the_stream_events_is_also_the_feed(
    server: EventServer, http: httpx.AsyncClient
) -> None:
    assert server.feed_url is not None
    assert (await http.get(feed_url(server, "events"))).json() == (
        await http.get(server.feed_url)
    ).json()


async def test_stream_feed_errors(server: EventServer, http: httpx.AsyncClient) -> None:
    await add_stream(server, STREAM, 4)
    await append(server, STREAM, 2, 3)
    url = feed_url(server)
    base = url.removesuffix("/" + STREAM)
    token = (await http.get(url)).json()["token"]
    ok = {"token": token, "cursor": "_first"}
    cases: list[tuple[str, dict[str, str], int, str]] = [
        (base, {}, 404, "Name a stream: /feeds/NAME."),
        (base + "/", {}, 404, "Name a stream"),
        (base + "/nosuch", {}, 404, "No stream 'nosuch'."),
        (base + "/Bad!", {}, 404, "No stream 'Bad!'."),
        (base + "/" + "x" * 3000, {}, 404, "(3000 characters)"),
        (url + "/other", {}, 404, "No such resource"),
        (url + "/events", {**ok, "partition": "4"}, 400,
         "Unknown partition '4': this feed has partitions 0 to 3."),
        (url + "/events", {**ok, "partition": "01"}, 400, "Unknown partition '01'"),
        (url + "/events", {**ok, "partition": "-1"}, 400, "Unknown partition"),
        (url + "/events", {**ok, "partition": "9" * 100}, 400, "Unknown partition"),
        (url + "/events", {"token": token, "cursor": "_first"}, 400, "Unknown partition"),
        (url + "/events", {"token": token, "partition": "2", "cursor": "4"}, 400,
         "Cursor 4 is beyond the newest event of partition 2 (3)."),
        (url, {"n": "1", "cursor0": "_first"}, 400, "n must be 4: this feed has 4 partitions."),
        (url, {"n": "4"}, 400, "No cursors given: pass cursor0 (to cursor3)."),
        (url, {"n": "4", "cursor4": "_first"}, 400,
         "Unknown partition in 'cursor4': this feed has partitions 0 to 3."),
        (url, {"n": "4", "cursorx": "_first"}, 400, "Unknown partition in 'cursorx'"),
        (url, {"n": "4", "cursor01": "_first"}, 400, "Unknown partition in 'cursor01'"),
        (url, {"n": "4", "cursor1": ""}, 400, "Bad cursor"),
        (url, {"n": "4", "cursor3": "1"}, 400, "beyond the newest event of partition 3 (0)"),
    ]  # fmt: skip
    for target, params, status, message in cases:
        response = await http.get(target, params=params)
        assert response.status_code == status, (target[-40:], params, response.text)
        assert message in response.text, (target[-40:], params, response.text)
    # the connection is still usable after errors
    assert (await http.get(url)).status_code == 200
