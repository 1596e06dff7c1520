"""The schema registry from the tests' side."""

from __future__ import annotations

import base64
from typing import Any

from .servers import USERS

V1: dict[str, Any] = {
    "title": "ORDER_PLACED",
    "type": "object",
    "properties": {"order": {"type": "integer"}, "total": {"type": "string"}},
    "required": ["order"],
    "additionalProperties": False,
}


def basic(user: str, password: str | None = None) -> dict[str, str]:
    secret = USERS[user] if password is None else password
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}
