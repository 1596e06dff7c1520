"""The blocking client (no event loop in the caller) against a real server."""

from __future__ import annotations

import asyncio

import pytest

from futoin_evt.client.aio import CommError, RemoteError
from futoin_evt.client.sync import BlockingClient
from futoin_evt.server.app import EventServer

pytestmark = pytest.mark.functional


def blocking_session(url: str) -> tuple[list[int], list[int], str]:
    with BlockingClient(url, credentials="alice:alice-pw") as client:
        assert client.ping(9) == 9
        ids = [client.add_event("SYNC", {"i": i}) for i in range(5)]
        client.register_consumer("BLOCKING")
        seen = [e.id for e in client.poll_events("BLOCKING")]
        assert client.poll_events("BLOCKING", last_id=seen[-1]) == []
        try:
            client.register_consumer("LIVE")
        except RemoteError as exc:
            return ids, seen, exc.name
    raise AssertionError("LIVE registration was accepted")


async def test_blocking_calls(server: EventServer) -> None:
    # the blocking client runs on a thread of its own, as it would in a Spark driver
    ids, seen, error = await asyncio.to_thread(blocking_session, server.url)
    assert seen == ids
    assert error == "LiveNotAllowed"


async def test_blocking_errors(server: EventServer) -> None:
    def wrong_password() -> str:
        with BlockingClient(server.url, credentials="alice:nope") as client:
            try:
                client.add_event("A", 1)
            except RemoteError as exc:
                return exc.name
        return "accepted"

    assert await asyncio.to_thread(wrong_password) == "SecurityError"
    with pytest.raises(CommError):
        await asyncio.to_thread(BlockingClient, "ws://127.0.0.1:1/")


def range_session(url: str) -> dict[str, object]:
    with BlockingClient(url, credentials="alice:alice-pw") as client:
        ids = [client.add_event("ODD" if i % 2 else "EVEN", {"i": i}) for i in range(2500)]
        client.register_consumer("BULK")
        start, head = client.consumer_state("BULK")
        read: list[int] = []
        after = start
        while page := client.read_events("BULK", after, upto_id=ids[2099]):
            read.extend(int(e["id"]) for e in page)
            after = read[-1]
        odd = client.read_events("BULK", ids[0] - 1, upto_id=ids[9], want=["ODD"])
        as_text = client.read_events("BULK", ids[0] - 1, upto_id=ids[0], data_as_text=True)
        unmoved, _head = client.consumer_state("BULK")
        acked = client.acknowledge("BULK", ids[999])
        try:
            client.read_events("BULK", ids[500])
            below = "accepted"
        except RemoteError as exc:
            below = exc.name
        rest = client.read_events("BULK", ids[999])
    with BlockingClient(url, credentials="bob:bob-pw") as other:
        try:
            other.read_events("BULK", 0)
            foreign = "accepted"
        except RemoteError as exc:
            foreign = exc.name
    return {
        "ids": ids,
        "start": start,
        "head": head,
        "read": read,
        "odd": [e["data"]["i"] for e in odd],
        "as_text": as_text[0]["data"],
        "unmoved": unmoved,
        "acked": acked,
        "below": below,
        "rest": int(rest[0]["id"]),
        "foreign": foreign,
    }


async def test_range_reads_leave_the_position_alone(server: EventServer) -> None:
    result = await asyncio.to_thread(range_session, server.url)
    ids = result["ids"]
    assert isinstance(ids, list)
    assert result["start"] < ids[0]
    assert result["head"] == ids[-1]
    assert result["read"] == ids[:2100]  # several replies, none past upto_id
    assert result["odd"] == [1, 3, 5, 7, 9]
    assert result["as_text"] == '{"i":0}'  # the stored JSON text
    assert result["unmoved"] == result["start"]
    assert result["acked"] == ids[999]
    assert result["below"] == "AlreadyAcknowledged"
    assert result["rest"] == ids[1000]
    assert result["foreign"] == "UnknownConsumer"
