"""A lean FTN3 load generator: pre-encoded requests, replies matched by rid and checked for
errors, nothing else. It keeps the measuring side cheap so the figures are the server's; it
drives every server under test the same way."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

from futoin_evt.client.aio import CLIENT_MAX_FRAME_BYTES, normalize_url
from futoin_evt.wsio import ClientIO, open_client


class LoadError(RuntimeError):
    """The server answered a load request with an error."""


#: Handles a request from the server (pushed events): gets the decoded message, returns ``r``.
PushHandler = Callable[[dict[str, Any]], Any]


class LoadClient:
    def __init__(self, io: ClientIO, credentials: str) -> None:
        self._io = io
        self._sec = json.dumps(credentials)
        self._rids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self.on_push: PushHandler | None = None
        io.on_message = self._on_message

    @classmethod
    async def connect(cls, url: str, credentials: str) -> LoadClient:
        io = await open_client(normalize_url(url), max_size=CLIENT_MAX_FRAME_BYTES)
        return cls(io, credentials)

    async def call(self, f: str, params_json: str) -> Any:
        """Send ``f`` with params given as JSON text; return ``r`` or raise LoadError."""
        rid = f"C{next(self._rids)}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        if not self._io.writable:
            await self._io.drain()
        self._io.send(f'{{"f":"{f}","p":{params_json},"rid":"{rid}","sec":{self._sec}}}'.encode())
        return await future

    def _on_message(self, frame: bytes) -> None:
        msg = json.loads(frame)
        if msg["rid"][0] == "S":
            result = self.on_push(msg) if self.on_push is not None else None
            if self._io.is_open:  # a push in the same read as the server's close gets no answer
                self._io.send(json.dumps({"r": result, "rid": msg["rid"]}).encode())
            return
        future = self._pending.pop(msg["rid"], None)
        if future is None:
            return
        if "e" in msg:
            future.set_exception(LoadError(f"{msg['e']}: {msg.get('edesc', '')}"))
        else:
            future.set_result(msg.get("r"))

    async def close(self) -> None:
        self._io.close()
        await self._io.closed
