"""Push (FTN18 receivers) from the tests' side: collecting what a server sends."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from futoin_evt.client.aio import Event, EventStreamClient
from futoin_evt.client.receiver import Receiver


async def add_many(
    client: EventStreamClient, count: int, event_type: str = "E", **data: Any
) -> list[int]:
    """Add ``count`` events with 32 in flight; return their ids in order."""
    ids: list[int] = []
    for start in range(0, count, 32):
        batch = range(start, min(start + 32, count))
        ids.extend(
            await asyncio.gather(*(client.add_event(event_type, {"i": i, **data}) for i in batch))
        )
    return sorted(ids)


class Collector:
    """An application callback that records what it got and can fail or block on purpose."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.fail_times = 0
        self.gate: asyncio.Event | None = None
        self.arrived = asyncio.Event()
        self.changed = asyncio.Event()

    async def __call__(self, events: list[Event]) -> None:
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("the application failed on purpose")
        self.events.extend(events)
        self.changed.set()

    @property
    def ids(self) -> list[int]:
        return [e.id for e in self.events]

    async def wait_for(self, last_id: int) -> None:
        async with asyncio.timeout(60):
            while not self.events or self.events[-1].id < last_id:
                self.changed.clear()
                await self.changed.wait()


async def running(receiver: Receiver) -> asyncio.Task[None]:
    task = asyncio.create_task(receiver.run())
    async with asyncio.timeout(30):
        await receiver.ready.wait()
    return task


async def stop(receiver: Receiver, task: asyncio.Task[None]) -> None:
    receiver.stop()
    async with asyncio.timeout(30):
        await task


class JsReceiver:
    """receive.js: the official receiver, printing what it gets."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        #: Events pushed before the readyToReceive reply (FTN18 allows that).
        self.early: list[dict[str, str]] = []

    @classmethod
    async def start(cls, js_peer: Path, options: dict[str, Any]) -> JsReceiver:
        proc = await asyncio.create_subprocess_exec(
            "node", "receive.js", json.dumps(options), cwd=js_peer,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )  # fmt: skip
        receiver = cls(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while (line := json.loads(await proc.stdout.readline())) != {"ready": True}:
                receiver.early.append(line)
        return receiver

    async def received(self) -> list[dict[str, str]]:
        async with asyncio.timeout(120):
            out, err = await self.proc.communicate()
        assert self.proc.returncode == 0, err.decode()
        return self.early + [json.loads(line) for line in out.decode().splitlines()]
