"""The HTTP feed (FeedAPI) from the tests' side."""

from __future__ import annotations

import json
from typing import Any

import httpx

from .servers import USERS

ALICE = ("alice", USERS["alice"])


class FeedApiClient:
    """A FeedAPI v2 consumer as the spec describes one: discover, then page with cursors;
    on 409, discover again."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.token: str | None = None
        self.discoveries = 0

    async def discover(self) -> dict[str, Any]:
        response = await self.http.get(self.url)
        response.raise_for_status()
        discovery: dict[str, Any] = response.json()
        self.token = discovery["token"]
        self.discoveries += 1
        return discovery

    async def page(
        self,
        cursor: str,
        size: int | str | None = None,
        types: str | None = None,
        wait: float = 0,
        partition: str = "0",
    ) -> tuple[list[dict[str, Any]], str]:
        """One response of a partition: its events' data, and the last cursor in it."""
        while True:
            if self.token is None:
                await self.discover()
            params: dict[str, Any] = {"token": self.token, "partition": partition, "cursor": cursor}
            if size is not None:
                params["pagesizehint"] = size
            if types is not None:
                params["event-types"] = types
            if wait:
                params["wait"] = wait
            response = await self.http.get(self.url + "/events", params=params)
            if response.status_code == 409:
                self.token = None
                continue
            response.raise_for_status()
            assert response.headers["content-type"] == "application/x-ndjson"
            events, cursors = [], []
            for line in response.text.splitlines():
                message = json.loads(line)
                if "data" in message:
                    events.append(message["data"])
                elif "cursor" in message:
                    cursors.append(message["cursor"])
            assert cursors, "every response has a cursor"
            assert all(isinstance(c, str) and c for c in cursors)
            return events, cursors[-1]

    async def read_to_end(
        self, cursor: str, size: int, partition: str = "0"
    ) -> tuple[list[dict[str, Any]], str]:
        seen: list[dict[str, Any]] = []
        while True:
            events, cursor = await self.page(cursor, size, partition=partition)
            if not events:
                return seen, cursor
            seen += events
