"""``serve --workers N``: a group of processes, and which worker took a connection."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from futoin_evt.client.aio import FTN3Client
from futoin_evt.storage import open_store

from . import waiting
from .amqp_wire import (
    Peer,
    logged_in,
)
from .servers import ALICE, ServerProcess, add_user

#: Bound of every wait for something the processes do not signal to the test.
WITHIN_SECONDS = 60.0


#: What the waits of this file allow.
until = functools.partial(waiting.until, seconds=WITHIN_SECONDS)


def children(pid: int) -> list[int]:
    """The pids of the process's children (a supervisor's workers)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(child) for child in path.read_text().split()]
    except FileNotFoundError:
        return []


class Group(ServerProcess):
    """``futoin-evt serve --workers N`` with debug logs (each connection is logged by the
    worker that took it)."""

    def __init__(self, db: str, *extra: str, workers: int = 2) -> None:
        super().__init__(db, 0, *extra, log_level="debug", workers=workers)
        self.count = workers

    def workers(self) -> list[int]:
        """The pids of the running workers (the supervisor's children)."""
        return children(self.proc.pid)

    def connections(self) -> dict[int, int]:
        """Worker slot -> connections it logged."""
        found: dict[int, int] = {}
        for slot in re.findall(r" worker (\d+) \S+: connection from ", self.logged()):
            found[int(slot)] = found.get(int(slot), 0) + 1
        return found

    async def worker_of(self, client: FTN3Client) -> int:
        """The slot of the worker that took ``client``'s connection."""
        transport = client._io.transport
        assert transport is not None
        return await self.worker_at(transport.get_extra_info("sockname")[1])

    async def worker_at(self, port: int) -> int:
        """The slot of the worker that took the WebSocket from local port ``port``."""
        if self.count == 1:
            return 0
        pattern = re.compile(rf" worker (\d+) \S+: connection from 127\.0\.0\.1:{port}\n")
        await until(lambda: pattern.search(self.logged()) is not None, "the connection logged")
        match = pattern.search(self.logged())
        assert match is not None
        return int(match.group(1))

    def channel(self) -> Path | None:
        """The group's channel directory (from a worker's command line), if it has one."""
        for pid in self.workers():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            return Path(argv[argv.index(b"--worker") + 1].decode().split("/", 3)[3])
        return None

    def kill_all(self) -> None:
        """SIGKILL to the supervisor and every worker at once."""
        self.kill()


async def connect_to(group: Group, slot: int) -> FTN3Client:
    """A connection the kernel gave worker ``slot`` (others are closed until one is); with
    one worker, slot 1 is that worker too."""
    slot %= group.count
    for _ in range(200):
        client = await FTN3Client.connect(group.url, credentials=ALICE)
        if await group.worker_of(client) == slot:
            return client
        await client.close()
    raise AssertionError(f"no connection reached worker {slot}")


async def prepare(db: str | Path, users: dict[str, str] | None = None) -> None:
    """Three events in ``events``, and the users, before any server starts (so none waits
    to hear of them)."""
    async with await open_store(db) as store:
        for name, password_hash in (users or {}).items():
            await add_user(store, name, password_hash)
        for n in range(3):
            await store.append("T", json.dumps(n))


def amqp_port(process: ServerProcess) -> int:
    assert process.amqp_url is not None
    return int(process.amqp_url.rsplit(":", 1)[1].strip("/"))


async def on_worker(process: ServerProcess, slot: int) -> Peer:
    """A logged-in connection the kernel gave worker ``slot`` of ``process`` (those it gave
    the other worker are closed until one lands there). The worker logs the connection as
    it takes it, before it answers anything: once logged in, the line is there."""
    port = amqp_port(process)
    for _ in range(200):
        peer = await logged_in(port)
        local = peer.writer.get_extra_info("sockname")[1]
        line = rf" worker (\d+) \S+: AMQP connection from 127\.0\.0\.1:{local}\n"
        found = re.search(line, process.logged())
        assert found is not None, f"the connection from port {local} is not logged"
        if int(found.group(1)) == slot:
            return peer
        await peer.close()
    raise AssertionError(f"no connection reached worker {slot}")
