"""What the console reads from a form or a query (numbers, times, lists, the page asked for)
and how its pages write numbers, ages, data and a refusal."""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from .exchange import PageError

#: Rows per page of every table.
PAGE_SIZE: Final = 50
#: Of an event's data, at most this many characters are shown.
DATA_CHARS: Final = 2000
_ISO_TIME: Final = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})(:\d{2})?Z?")


def sentence(exc: Exception) -> str:
    """A failure of ``log/`` as the console says it (``The read right on stream payroll is
    needed.``)."""
    return said(exc)


def said(exc: Exception) -> str:
    """A refusal's text as one sentence: capitalised, with its full stop."""
    text = str(exc)
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def total(values: list[float | None]) -> float | None:
    """The sum of the values known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def paged(items: list[Any], query: Mapping[str, str]) -> tuple[int, int, list[Any]]:
    page, pages = page_of(query, len(items))
    return page, pages, items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]


def page_of(query: Mapping[str, str], total: int) -> tuple[int, int]:
    """The page asked for (1 when it is not a number), within 1..pages."""
    pages = max(math.ceil(total / PAGE_SIZE), 1)
    text = query.get("page", "1")
    page = number_in(text, 6) or 1
    return min(max(page, 1), pages), pages


def number_in(text: str, digits: int) -> int | None:
    """``text`` as a number of at most ``digits`` ASCII digits, else None."""
    return int(text) if re.fullmatch(f"[0-9]{{1,{digits}}}", text) else None


def iso_time(text: str) -> str:
    """``YYYY-MM-DDTHH:MM[:SS][Z]`` (UTC) as the store writes times."""
    match = _ISO_TIME.fullmatch(text.strip())
    if match is None:
        raise PageError(400, "A time is YYYY-MM-DDTHH:MM:SS in UTC.")
    day, minutes, seconds = match.groups()
    return f"{day}T{minutes}{seconds or ':00'}Z"


def words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def shorten(text: str) -> str:
    return text if len(text) <= DATA_CHARS else text[:DATA_CHARS] + "…"


def age(ts: str | None, now: float) -> float | None:
    if ts is None:
        return None
    return max(now - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")), 0.0)


def number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"
