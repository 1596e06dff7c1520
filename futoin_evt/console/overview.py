"""What the console's overview tells about the server beyond its streams: the doors, their
addresses and connections, the workers. The server fills it in (the console has no wire in
it: :class:`ServerFacts` is what it is handed, by ``server/console_http.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import futoin_evt


@dataclass(frozen=True, slots=True)
class Door:
    #: What it is, as the overview names it ("FTN18 WebSocket", "HTTP feed"...).
    name: str
    #: Where a client reaches it (a URL).
    address: str
    #: Connections past their login now, in this worker; None: not counted.
    connections: int | None


@dataclass(frozen=True, slots=True)
class Workers:
    #: This worker's number (from 1) and how many the group has (1: one process).
    this: int
    count: int


class ServerFacts(Protocol):
    def doors(self) -> list[Door]: ...

    def workers(self) -> Workers: ...


@dataclass(frozen=True, slots=True)
class About:
    version: str
    build: str
    #: When the console (with its server) started: ``time.time()``.
    started: float

    @property
    def uptime(self) -> str:
        return uptime(time.time() - self.started)


@cache
def build() -> str:
    """Which build is installed (looked up once: it walks the package's files)."""
    return futoin_evt.build()


def about(started: float) -> About:
    return About(futoin_evt.__version__, build(), started)


def uptime(seconds: float) -> str:
    """``3 d 4 h``, ``4 h 5 min``, ``5 min 6 s``, ``6 s``."""
    whole = int(max(seconds, 0))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def size(count: float | None) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 KiB``, ``3.2 MiB``..."""
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
