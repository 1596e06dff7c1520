"""The store fixture of the storage contract (tests/test_store_contract_*.py), run against
every backend (``store_db``: a SQLite file and a PostgreSQL database), and its helpers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest

from futoin_evt.storage import open_store
from futoin_evt.storage.base import Durability, Store

BIG = 1 << 20
#: Seconds a consumer group's claim is held for.
HOLD = 60.0
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")


@pytest.fixture(params=[Durability.FULL, Durability.NORMAL], ids=["full", "normal"])
async def store(store_db: str, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """At NORMAL durability SQLite commits inline, on the event loop."""
    async with await open_store(store_db, durability=request.param) as opened:
        yield opened


def ids_of(page_json: str) -> list[int]:
    return [int(event["id"]) for event in json.loads(page_json)]
