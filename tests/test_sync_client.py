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
