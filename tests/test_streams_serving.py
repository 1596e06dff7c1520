"""``server.streams``: every serving process knows a stream added, grown or dropped by another
process (the command line here) within 5 seconds, without a restart."""

from __future__ import annotations

import functools
import re

import pytest

from futoin_evt.domain.partition import DEFAULT_PARTITION
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from .support import waiting
from .support.cli import run, stream_command
from .support.servers import Serving

pytestmark = pytest.mark.functional

#: What the issue asks: a change is served by every process within this.
KNOWN_WITHIN_SECONDS = 5.0

#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=KNOWN_WITHIN_SECONDS)


async def test_a_server_follows_streams_changed_by_the_command_line(store_db: str) -> None:
    config = ServerConfig(
        db=store_db,
        transport=TransportConfig(port=0),
        retention=RetentionConfig(interval=3600),
    )
    async with await EventServer.start(config) as server:
        streams = server.streams
        assert streams.partition("events", 0) == DEFAULT_PARTITION
        assert streams.get("orders") is None
        await stream_command(store_db, "add", "orders", "--partitions", "3")
        await until(lambda: streams.get("orders") is not None, "orders is known")
        info = streams.get("orders")
        assert info is not None
        assert [p.number for p in info.partitions] == [0, 1, 2]
        assert streams.partition("orders", 3) is None
        assert streams.partition("orders", -1) is None
        await stream_command(store_db, "grow", "orders", "--partitions", "5")
        await until(lambda: streams.partition("orders", 4) is not None, "orders has 5")
        assert streams.partition("orders", 2) == info.partitions[2]
        await stream_command(store_db, "drop", "orders", "--yes")
        await until(lambda: streams.get("orders") is None, "orders is gone")
        # its own changes are known at once
        await server.store.add_stream("mine", 2)
        await until(lambda: streams.get("mine") is not None, "mine is known")
        assert [s.name for s in streams] == ["events", "mine"]


@pytest.mark.postgres
def test_two_serve_processes_learn_a_stream_added_while_they_run(pg_url: str) -> None:
    servers = [Serving(pg_url), Serving(pg_url)]
    try:
        assert run("stream", "add", "orders", "--partitions", "3", "--db", pg_url).returncode == 0
        for server in servers:
            server.wait_for_line(re.compile(r"stream orders: 3 partitions"), KNOWN_WITHIN_SECONDS)
        assert run("stream", "grow", "orders", "--partitions", "4", "--db", pg_url).returncode == 0
        for server in servers:
            server.wait_for_line(re.compile(r"stream orders: 4 partitions"), KNOWN_WITHIN_SECONDS)
    finally:
        for server in servers:
            server.stop()
