"""The HTTP feed on the server's port: the unmodified zeroeventhub client (ZeroEventHub v1), a
FeedAPI v2 client written here from the spec, and the errors both protocols define."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import pytest
from zeroeventhub import Client as ZeroEventHubClient
from zeroeventhub import Cursor, Event

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.http import FeedConfig
from futoin_evt.server.websocket import Limits, TransportConfig

from .support.feed import ALICE, FeedApiClient
from .support.servers import USERS, ServerFactory, add_user

pytestmark = pytest.mark.functional


async def add_events(
    client: EventStreamClient, count: int, types: tuple[str, ...], data: str | None = None
) -> list[int]:
    ids: list[int] = []
    for start in range(0, count, 200):
        batch = range(start, min(start + 200, count))
        ids += await asyncio.gather(
            *(client.add_event(types[i % len(types)], data or {"n": i}) for i in batch)
        )
    return ids


def feed_url(server: EventServer) -> str:
    assert server.feed_url is not None
    return server.feed_url


async def test_zeroeventhub_client_reads_every_event(
    server: EventServer, alice: EventStreamClient
) -> None:
    ids = await add_events(alice, 2345, ("ORDER", "PAYMENT"))
    async with httpx.AsyncClient(auth=httpx.BasicAuth(*ALICE)) as http:
        client = ZeroEventHubClient(feed_url(server), partition_count=1, http_client=http)
        cursor = Cursor(partition_id=0, cursor="_first")
        received: list[Event] = []
        pages = 0
        while True:
            page: list[Event] = []
            async for item in client.fetch_events([cursor], page_size_hint=400):
                if isinstance(item, Cursor):
                    cursor = item
                else:
                    page.append(item)
            pages += 1
            if not page:
                break
            received += page
    assert pages == 7  # 6 pages of at most 400 events, then an empty one
    assert [int(e.data["id"]) for e in received] == ids
    assert {e.partition_id for e in received} == {0}
    first = received[0].data
    assert (first["type"], first["data"]) == ("ORDER", {"n": 0})
    assert first["ts"].endswith("Z")
    assert cursor.cursor == str(ids[-1])


async def test_a_page_size_hint_of_any_length_is_clamped_to_the_page_limit(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    ids = await add_events(alice, 1001, ("ORDER",))
    async with httpx.AsyncClient(auth=httpx.BasicAuth(*ALICE)) as zeh_http:
        client = ZeroEventHubClient(feed_url(server), partition_count=1, http_client=zeh_http)
        cursor = Cursor(partition_id=0, cursor="_first")
        page = [
            item
            async for item in client.fetch_events([cursor], page_size_hint=10**40 - 1)
            if isinstance(item, Event)
        ]
    assert [int(e.data["id"]) for e in page] == ids[:1000]
    feed = FeedApiClient(http, feed_url(server))
    for hint, expected in [("9" * 4000, 1000), ("1" + "0" * 39, 1000), ("0" * 30 + "7", 7)]:
        events, cursor_after = await feed.page("_first", hint)
        assert [int(e["id"]) for e in events] == ids[:expected], hint[:50]
        assert cursor_after == str(ids[expected - 1])


async def test_feedapi_v2_discovery_paging_last_and_types(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    ids = await add_events(alice, 1050, ("ORDER", "PAYMENT", "REFUND"))
    client = FeedApiClient(http, feed_url(server))
    discovery = await client.discover()
    assert discovery["partitions"] == [{"id": "0"}]
    assert discovery["exactlyOnce"] is True

    events, cursor = await client.read_to_end("_first", 100)
    assert [int(e["id"]) for e in events] == ids
    assert cursor == str(ids[-1])

    # _last: nothing that is there now, then only what is added later
    events, last = await client.page("_last")
    assert (events, last) == ([], str(ids[-1]))
    newer = await add_events(alice, 3, ("ORDER",))
    events, _cursor = await client.page(last)
    assert [int(e["id"]) for e in events] == newer

    # a type filter: only REFUND, and the cursor moves past what it left out
    events, cursor = await client.page("_first", types="REFUND")
    assert [int(e["id"]) for e in events] == ids[2::3]
    assert cursor == str(newer[-1])
    events, _cursor = await client.page("_first", types="ORDER;PAYMENT", size=5)
    assert [e["type"] for e in events] == ["ORDER", "PAYMENT"] * 2 + ["ORDER"]

    # a page size above the cap gets the cap, streamed
    events, _cursor = await client.page("_first", size=100_000)
    assert len(events) == 1000


async def test_a_changed_token_is_409_and_the_client_discovers_again(
    server: EventServer,
    alice: EventStreamClient,
    http: httpx.AsyncClient,
    tmp_path: Path,
    password_hashes: dict[str, str],
) -> None:
    """A client that knew another stream (the database was replaced) gets 409, discovers the
    feed again, and reads on with the new token."""
    other = await EventServer.start(
        ServerConfig(db=tmp_path / "other.sqlite", transport=TransportConfig(port=0))
    )
    try:
        await add_user(other.store, "alice", password_hashes["alice"])
        await other.access.changed_here()
        stale = await FeedApiClient(http, feed_url(other)).discover()
    finally:
        await other.close()
    ids = await add_events(alice, 5, ("ORDER",))
    client = FeedApiClient(http, feed_url(server))
    client.token = stale["token"]
    response = await http.get(
        feed_url(server) + "/events",
        params={"token": client.token, "partition": "0", "cursor": "_first"},
    )
    assert response.status_code == 409
    events, _cursor = await client.page("_first")
    assert [int(e["id"]) for e in events] == ids
    assert client.discoveries == 1
    assert client.token != stale["token"]


async def test_events_added_while_paging_are_seen_once_in_order(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    client = FeedApiClient(http, feed_url(server))
    producer = asyncio.create_task(add_events(alice, 3000, ("ORDER", "PAYMENT")))
    seen: list[int] = []
    cursor = "_first"
    while not producer.done():
        events, cursor = await client.page(cursor, 37)
        seen += [int(e["id"]) for e in events]
    ids = await producer
    events, cursor = await client.read_to_end(cursor, 37)
    seen += [int(e["id"]) for e in events]
    assert seen == ids


async def test_long_poll_returns_when_an_event_arrives(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    client = FeedApiClient(http, feed_url(server))
    (first,) = await add_events(alice, 1, ("ORDER",))
    waiting = asyncio.create_task(client.page(str(first), wait=30))
    (second,) = await add_events(alice, 1, ("PAYMENT",))
    events, cursor = await waiting
    assert [int(e["id"]) for e in events] == [second]
    assert cursor == str(second)
    # caught up, with a short wait: just the cursor
    assert await client.page(cursor, wait=0.1) == ([], cursor)


async def test_zeroeventhub_v1_errors(server: EventServer, http: httpx.AsyncClient) -> None:
    url = feed_url(server)
    for params, status, message in [
        ({"n": "2", "cursor0": "_first"}, 400, "n must be 1"),
        ({"n": "1"}, 400, "No cursors given"),
        ({"n": "1", "cursor0": "_first", "cursor1": "_first"}, 400, "Unknown partition"),
        ({"n": "1", "cursor0": "abc"}, 400, "Bad cursor"),
        ({"n": "1", "cursor0": "_first", "pagesizehint": "-3"}, 400, "Bad pagesizehint"),
    ]:
        response = await http.get(url, params=params)
        assert response.status_code == status, (params, response.text)
        assert message in response.text, (params, response.text)


async def test_feedapi_v2_errors(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    url = feed_url(server)
    token = (await http.get(url)).json()["token"]
    (only,) = await add_events(alice, 1, ("ORDER",))
    cases: list[tuple[str, dict[str, str], int, str]] = [
        ("/events", {"partition": "0", "cursor": "_first"}, 400, "No token"),
        ("/events", {"token": "other", "partition": "0", "cursor": "_first"}, 409, "discover"),
        ("/events", {"token": token, "partition": "1", "cursor": "_first"}, 400, "partition"),
        ("/events", {"token": token, "partition": "0"}, 400, "No cursor"),
        ("/events", {"token": token, "partition": "0", "cursor": "x1"}, 400, "Bad cursor"),
        ("/events", {"token": token, "partition": "0", "cursor": str(only + 5)}, 400, "beyond"),
        ("/events", {"token": token, "partition": "0", "cursor": "0", "wait": "999"}, 400, "wait"),
        ("/events", {"token": token, "partition": "0", "cursor": "0", "event-types": "a"}, 400,
         "event-types"),
        ("", {"token": token}, 400, "/events"),
        ("/other", {}, 404, "No such"),
    ]  # fmt: skip
    for path, params, status, message in cases:
        response = await http.get(url + path, params=params)
        assert response.status_code == status, (path, params, response.text)
        assert message in response.text, (path, params, response.text)
    # the connection is still usable after errors
    assert (await http.get(url)).status_code == 200


async def test_feed_credentials(start_server: ServerFactory) -> None:
    server = await start_server()
    bob = await server.store.get_user("bob")
    assert bob is not None
    await server.store.revoke(bob.id, "*", 3)  # bob may read no stream
    await server.access.changed_here()
    url = feed_url(server)
    async with httpx.AsyncClient() as anonymous:
        response = await anonymous.get(url)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Basic")
        assert (await anonymous.get(url, auth=("alice", "wrong"))).status_code == 401
        assert (await anonymous.get(url, auth=("nobody", "x"))).status_code == 401
        refused = await anonymous.get(url, auth=("bob", USERS["bob"]))
        assert (refused.status_code, refused.text) == (
            403,
            "The read right on stream events is needed.\n",
        )
        assert (await anonymous.get(url, auth=ALICE)).status_code == 200
        # other paths are still the WebSocket endpoint's
        response = await anonymous.get(url.removesuffix("/feed") + "/other")
        assert response.status_code == 426


async def test_no_feed_when_turned_off(start_server: ServerFactory) -> None:
    server = await start_server(feed=FeedConfig(path=None))
    assert server.feed_url is None
    async with httpx.AsyncClient(auth=ALICE) as http:
        response = await http.get(server.url.replace("ws", "http", 1) + "feed")
        assert response.status_code == 426


async def test_other_methods_and_http_1_0(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    url = feed_url(server)
    response = await http.request("DELETE", url)
    assert (response.status_code, response.headers["allow"]) == (405, "GET")
    ids = await add_events(alice, 3, ("ORDER",))
    token = (await http.get(url)).json()["token"]
    # HTTP/1.0 has no chunked encoding: the body ends when the server closes the connection
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    credentials = base64.b64encode(":".join(ALICE).encode()).decode()
    writer.write(
        f"GET /feed/events?token={token}&partition=0&cursor=_first HTTP/1.0\r\n"
        f"Authorization: Basic {credentials}\r\n\r\n".encode()
    )
    raw = await reader.read()  # to EOF
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    assert "chunked" not in head
    lines = [json.loads(line) for line in body.splitlines()]
    assert [int(line["data"]["id"]) for line in lines[:-1]] == ids
    assert lines[-1] == {"cursor": str(ids[-1])}


async def test_a_client_that_stops_reading_does_not_hold_up_shutdown(
    tmp_path: Path, password_hashes: dict[str, str]
) -> None:
    limits = Limits(drain_seconds=0.5)
    transport = TransportConfig(port=0, limits=limits)
    server = await EventServer.start(ServerConfig(tmp_path / "db.sqlite", transport=transport))
    await add_user(server.store, "alice", password_hashes["alice"])
    await server.access.changed_here()
    async with await EventStreamClient.connect(server.url, credentials=":".join(ALICE)) as alice:
        await add_events(alice, 400, ("BIG",), data="x" * 60_000)  # 24 MB of events
    async with httpx.AsyncClient(auth=ALICE) as http:
        token = (await http.get(feed_url(server))).json()["token"]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    credentials = base64.b64encode(":".join(ALICE).encode()).decode()
    writer.write(
        f"GET /feed/events?token={token}&partition=0&cursor=_first HTTP/1.1\r\n"
        f"Authorization: Basic {credentials}\r\n\r\n".encode()
    )
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")  # streaming, then unread
    await asyncio.wait_for(server.close(), timeout=60)
    writer.close()
