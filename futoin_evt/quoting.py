"""Input quoted in error messages: whole, or cut with the cut said, never read as another value."""

from __future__ import annotations

from typing import Any, Final

#: Characters of a value shown before it is cut.
QUOTE_LIMIT: Final = 40


def quote_input(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` when it is short; else its start, an ellipsis and its full length, as
    ``'99999…' (40 characters)``, so a cut value cannot pass for a shorter one."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        shown = repr(value[:limit])
        return f"{shown[:-1]}…{shown[-1]} ({len(value)} characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters in all)"
