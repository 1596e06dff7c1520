"""Waiting on a condition nothing signals (a server's state seen through its doors)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

#: How long a condition the tests wait on may take, on a loaded machine.
DEADLINE = 30.0


async def until(
    condition: Callable[[], bool | Awaitable[bool]], what: str, seconds: float = DEADLINE
) -> None:
    """Return once ``condition()`` holds (awaited when it returns an awaitable); fail naming
    ``what`` when it has not within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        met = condition()
        if not isinstance(met, bool):
            met = await met
        if met:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        await asyncio.sleep(0.02)  # between checks of a condition nothing signals
