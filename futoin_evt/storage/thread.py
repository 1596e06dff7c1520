"""One thread that runs blocking calls in order and hands results back to the event loop.

A ThreadPoolExecutor does the same with more Python code on the worker side (work items,
chained futures); every bytecode there needs the GIL, and while the event loop is busy a
thread waits up to the switch interval for it. This worker blocks in C (``SimpleQueue.get``)
and runs only the call itself, so a group commit costs one hop each way and little else.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any], asyncio.AbstractEventLoop]


class WorkerThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread; the future gets its result or exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, args, future, loop))
        return future

    def stop(self) -> None:
        """Finish the queued calls, then end the thread (without waiting for it)."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, future, loop = job
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller
                loop.call_soon_threadsafe(_fail, future, exc)
            else:
                loop.call_soon_threadsafe(_succeed, future, result)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
