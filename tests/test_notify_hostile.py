"""Selector subscriptions at their limits, against a server process: a thousand subscribers with
selectors of the largest size at once, and selectors past the limit on every door. Each gets
the door's error, an honest subscriber is served meanwhile, the server logs no ERROR and the
memory the subscriptions hold stays within a stated bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient, RemoteError
from futoin_evt.client.notify import Notifications, Subscribed
from futoin_evt.ftn18.notify import MAX_PER_CONNECTION
from futoin_evt.notify.selector import MAX_SELECTOR_CHARS
from futoin_evt.storage.sqlite import SqliteStore

from .support.amqp_wire import ATTACH, DETACH, ServerProcess, frame, logged_in
from .support.servers import USERS, add_user

pytestmark = pytest.mark.functional

SUBSCRIBERS = 1000
#: Selectors that differ (equal ones are compiled once); each takes tens of milliseconds.
DISTINCT = 64
CREDENTIALS = "alice:" + USERS["alice"]


def largest_selector(variant: int) -> str:
    """A selector of exactly the largest size, distinct for each ``variant`` (nothing is shared
    between subscribers), that every event with ``total`` of 0 to 99 matches: a chain of ORs
    that the last clause makes true, each evaluated for every event."""
    clauses = [f"region = 'v{variant:05d}-{n:04d}'" for n in range(200)]
    head = " OR ".join(clauses)
    tail = " OR total < 100"
    text = head[: MAX_SELECTOR_CHARS - len(tail)]
    text = text[: text.rfind(" OR ")] + tail
    return text + " " * (MAX_SELECTOR_CHARS - len(text))


@pytest.fixture(scope="module")
def notify_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("notify-hostile") / "events.sqlite"

    async def add_alice() -> None:
        async with await SqliteStore.open(db) as store:
            await add_user(store, "alice", hash_password(USERS["alice"]))

    asyncio.run(add_alice())
    server = ServerProcess(db)
    yield server
    assert server.stop() == 0
    assert server.errors() == []


async def test_a_thousand_subscribers_with_the_largest_selectors(
    notify_server: ServerProcess,
) -> None:
    url = f"ws://127.0.0.1:{notify_server.port}/"
    honest_client = await EventStreamClient.connect(url, credentials=CREDENTIALS)
    honest = await Notifications(honest_client.ftn3).subscribe("total = 7")
    clients = [
        await EventStreamClient.connect(url, credentials=CREDENTIALS)
        for _ in range(-(-SUBSCRIBERS // MAX_PER_CONNECTION))
    ]
    try:
        receivers = [Notifications(client.ftn3) for client in clients]  # one per connection
        before = notify_server.rss_kib()
        started = time.perf_counter()
        queues: list[Subscribed] = list(
            await asyncio.gather(
                *(
                    receivers[n // MAX_PER_CONNECTION].subscribe(largest_selector(n % DISTINCT))
                    for n in range(SUBSCRIBERS)
                )
            )
        )
        subscribed_in = time.perf_counter() - started
        held = notify_server.rss_kib() - before
        await honest_client.add_event("ORDER", {"total": 7})
        async with asyncio.timeout(60):
            assert (await honest.get())["properties"]["total"] == 7
            for queue in queues:  # each of the thousand got it too
                assert (await queue.get())["properties"]["total"] == 7
        print(
            f"\n{SUBSCRIBERS} subscriptions with {MAX_SELECTOR_CHARS}-character selectors "
            f"({DISTINCT} different): "
            f"made in {subscribed_in:.1f} s, RSS +{held} KiB ({held / SUBSCRIBERS:.0f} KiB each)"
        )
        assert held < SUBSCRIBERS * 512, f"{held} KiB for {SUBSCRIBERS} subscriptions"
        # one more than a connection may hold is refused with the FTN3 error
        with pytest.raises(RemoteError) as refused:
            await receivers[0].subscribe(largest_selector(SUBSCRIBERS))
        assert refused.value.name == "TooManySubscriptions"
    finally:
        for client in [*clients, honest_client]:
            await client.close()


async def test_large_selectors_compiled_at_once_do_not_hold_up_other_connections(
    notify_server: ServerProcess,
) -> None:
    """A connection that subscribes with many large selectors at once: another connection's
    call is answered between their compiles, not after all of them."""
    url = f"ws://127.0.0.1:{notify_server.port}/"
    async with (
        await EventStreamClient.connect(url, credentials=CREDENTIALS) as abuser,
        await EventStreamClient.connect(url, credentials=CREDENTIALS) as honest,
    ):
        receiver = Notifications(abuser.ftn3)
        calls = [
            asyncio.ensure_future(receiver.subscribe(largest_selector(10_000 + n)))
            for n in range(MAX_PER_CONNECTION)
        ]
        async with asyncio.timeout(120):
            await next(asyncio.as_completed(calls))  # the server is compiling them now
            assert await honest.ping(5) == 5
            answered_before = sum(call.done() for call in calls)
            await asyncio.gather(*calls)
        assert answered_before < MAX_PER_CONNECTION // 2, answered_before


TOO_LONG = largest_selector(0) + " "


async def test_a_selector_past_the_limit_is_refused_on_every_door(
    notify_server: ServerProcess,
) -> None:
    url = f"ws://127.0.0.1:{notify_server.port}/"
    async with await EventStreamClient.connect(url, credentials=CREDENTIALS) as client:
        with pytest.raises(RemoteError) as refused:
            await Notifications(client.ftn3).subscribe(TOO_LONG)
        assert refused.value.name == "InvalidSelector"
        assert f"longer than {MAX_SELECTOR_CHARS}" in str(refused.value)
        assert await client.ping(1) == 1  # the connection stays
    async with httpx.AsyncClient(
        base_url=notify_server.http_url, auth=("alice", "alice-pw")
    ) as feed:
        token = (await feed.get("/feed")).json()["token"]
        response = await feed.get(
            f"/feed/events?token={token}&partition=0&cursor=_first&selector={quote(TOO_LONG)}"
        )
        assert response.status_code == 400
        assert f"longer than {MAX_SELECTOR_CHARS}" in response.text
    from proton import Described, symbol, ulong

    peer = await logged_in(notify_server.amqp_port)
    selector: Any = {symbol("s"): Described(ulong(0x0000468C00000004), TOO_LONG)}
    source = Described(ulong(0x28), ["$events", None, None, None, None, None, None, selector])
    await peer.send(frame(ATTACH, ["sub", 0, True, None, None, source, Described(ulong(0x29), [])]))
    assert not await peer.attached("sub")
    detached = await peer.until(DETACH)
    assert detached.condition() == "amqp:invalid-field"
    await peer.close()
