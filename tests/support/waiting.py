"""Waiting on a condition nothing signals (a server's state seen through its doors)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

#: How long a condition the tests wait on may take, on a loaded machine.
DEADLINE = 30.0


class Deadline:
    """``seconds`` from now: what is left of them, and a failure that names what did not
    happen within them."""

    def __init__(self, seconds: float = DEADLINE) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def check(self, what: str) -> None:
        """Fail naming ``what`` once the time is up."""
        if time.monotonic() > self.at:
            raise AssertionError(f"not within {self.seconds:g} s: {what}")


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    seconds: float = DEADLINE,
    *,
    interval: float = 0.02,
) -> None:
    """Return once ``condition()`` holds (awaited when it returns an awaitable); fail naming
    ``what`` when it has not within ``seconds``. ``interval``: the pause between checks (0:
    as often as the loop allows)."""
    deadline = Deadline(seconds)
    while True:
        met = condition()
        if not isinstance(met, bool):
            met = await met
        if met:
            return
        deadline.check(what)
        await asyncio.sleep(interval)  # between checks of a condition nothing signals


def until_blocking(
    condition: Callable[[], bool], what: str, seconds: float = DEADLINE, *, interval: float = 0.1
) -> None:
    """:func:`until` for code without an event loop: the thread sleeps between checks."""
    deadline = Deadline(seconds)
    while not condition():
        deadline.check(what)
        time.sleep(interval)  # between checks of a condition nothing signals
