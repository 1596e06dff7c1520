"""Clients racing conditional DCB appends on one tag, over FTN3: what the tests of several
servers (processes, workers) on one database share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from futoin_evt.client.aio import EventStreamClient, RemoteError

DCB = "futoin.evt.dcb:1.0"


async def race_on_one_tag(
    urls: Sequence[str], credentials: str, tag: str, clients: int = 32, wins_each: int = 3
) -> list[tuple[int, int]]:
    """``clients`` clients, spread over ``urls`` in turn, each appending to ``tag`` on the
    condition that nothing with it came after the newest it read, until ``wins_each`` of its
    appends went through (a refusal must be AppendConditionFailed: it reads and tries
    again). Returns each append that went through as (the position read, its position)."""
    query = {"items": [{"tags": [tag]}]}
    wins: list[tuple[int, int]] = []

    async def appender(url: str, number: int) -> None:
        async with await EventStreamClient.connect(url, credentials=credentials) as client:
            won = 0
            while won < wins_each:
                read = await client.ftn3.call(DCB, "readBackwards", {"query": query, "limit": 1})
                after = read["events"][0]["position"] if read["events"] else 0
                event = {"type": "Booked", "data": [number, won], "tags": [tag]}
                condition = {"failIfEventsMatch": query, "after": after}
                try:
                    position = await client.ftn3.call(
                        DCB, "append", {"events": [event], "condition": condition}
                    )
                except RemoteError as exc:
                    refused = exc.name
                else:
                    wins.append((after, position))
                    won += 1
                    continue
                assert refused == "AppendConditionFailed"

    async with asyncio.timeout(120):
        await asyncio.gather(*(appender(urls[n % len(urls)], n) for n in range(clients)))
    return wins


def assert_no_lost_update(wins: list[tuple[int, int]], count: int) -> None:
    """Exactly one append went through at each position read: each winner's position read
    is the position of the winner before it."""
    assert len(wins) == count
    previous = 0
    for after, position in sorted(wins, key=lambda win: win[1]):
        assert after == previous  # nothing came between: no lost update
        previous = position
