"""``server.streams``: every serving process knows a stream added, grown or dropped by another
process (the command line here) within 5 seconds, without a restart."""

from __future__ import annotations

import asyncio
import functools
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from futoin_evt.domain.partition import DEFAULT_PARTITION
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from . import waiting
from .test_cli import run

pytestmark = pytest.mark.functional

#: What the issue asks: a change is served by every process within this.
KNOWN_WITHIN_SECONDS = 5.0

#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=KNOWN_WITHIN_SECONDS)


async def stream_command(db: str, *args: str) -> None:
    result = await asyncio.to_thread(run, "stream", *args, "--db", db)
    assert result.returncode == 0, result.stderr


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


class _Serving:
    """``futoin-evt serve`` with info logs, read line by line on a thread, in a session of
    its own (its workers, if it has any, are killed with it)."""

    def __init__(self, db: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "futoin_evt", "--log-level", "info", "serve", "--db", db,
             "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.pipes = [self.proc.stdout, self.proc.stderr]
        self.readers = []
        for pipe in self.pipes:
            assert pipe is not None
            reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
            reader.start()
            self.readers.append(reader)
        self.wait_for_line(re.compile(r"ws://"), 60)

    def holds(self, holder: object) -> bool:
        """A lease's holder (``host:pid:...``) is this server or one of its workers."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = [self.proc.pid, *map(int, children.read_text().split())]
        return any(f":{pid}:" in str(holder) for pid in pids)

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.put(line)

    def wait_for_line(self, pattern: re.Pattern[str], seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern.pattern} within {seconds} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if pattern.search(line):
                return line

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        for reader, pipe in zip(self.readers, self.pipes, strict=True):
            reader.join(timeout=30)  # the pipe is at its end: the process is gone
            assert pipe is not None
            pipe.close()


@pytest.mark.postgres
def test_two_serve_processes_learn_a_stream_added_while_they_run(pg_url: str) -> None:
    servers = [_Serving(pg_url), _Serving(pg_url)]
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
