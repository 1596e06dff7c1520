"""The HTTP feed's ``?selector=``: every selector case, push-down, and refusals."""

from __future__ import annotations

import json

import httpx
import pytest

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.server.app import EventServer

from .support.notify import CASES, EVENTS

pytestmark = pytest.mark.functional


async def read(
    http: httpx.AsyncClient, server: EventServer, selector: str, **extra: str
) -> tuple[list[int], str]:
    """Ids of the events of one response from the start, and its last cursor."""
    url = server.feed_url or ""
    token = (await http.get(url)).json()["token"]
    params = {"token": token, "partition": "0", "cursor": "_first", "selector": selector, **extra}
    response = await http.get(url + "/events", params=params)
    response.raise_for_status()
    lines = [json.loads(line) for line in response.text.splitlines()]
    ids = [int(line["data"]["id"]) for line in lines if "data" in line]
    return ids, [line["cursor"] for line in lines if "cursor" in line][-1]


async def test_every_selector_case_over_the_feed(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    for event_type, data in EVENTS:
        await alice.add_event(event_type, data)
    for selector, expected in CASES:
        ids, cursor = await read(http, server, selector)
        assert set(ids) == expected, selector
        assert ids == sorted(ids)
        assert cursor == str(len(EVENTS))  # past what the selector left out


async def test_selector_with_event_types_and_pinned_nothing(
    server: EventServer, alice: EventStreamClient, http: httpx.AsyncClient
) -> None:
    for event_type, data in EVENTS:
        await alice.add_event(event_type, data)
    ids, _ = await read(http, server, "total > 90", **{"event-types": "RARE;ORDER_SHIPPED"})
    assert ids == [11]
    ids, cursor = await read(http, server, "eventType = 'NONE' AND eventType = 'OTHER'")
    assert (ids, cursor) == ([], str(len(EVENTS)))


@pytest.mark.parametrize(
    ("selector", "status", "message"),
    [
        ("total > > 1", 400, "unexpected '>' (at column 9)"),
        ("upper(x) = 1", 400, "unknown function: upper"),
        ("(" * 100 + "1" + ")" * 100, 400, "nested deeper than 64 levels"),
        ("x" * 5000, 400, "longer than 4096"),
        # beyond what the HTTP layer reads of a request line
        ("(" * 10_000 + "1" + ")" * 10_000, 414, ""),
    ],
)
async def test_bad_selector_is_refused(
    server: EventServer, http: httpx.AsyncClient, selector: str, status: int, message: str
) -> None:
    url = server.feed_url or ""
    token = (await http.get(url)).json()["token"]
    params = {"token": token, "partition": "0", "cursor": "_first", "selector": selector}
    response = await http.get(url + "/events", params=params)
    assert response.status_code == status
    assert message in response.text
    ids, _cursor = await read(http, server, "id > 0")  # the server goes on
    assert ids == []
