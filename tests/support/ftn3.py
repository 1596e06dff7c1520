"""FTN3 connections from the tests' side."""

from __future__ import annotations

import asyncio
from typing import Final

from futoin_evt.client.aio import FTN3Client

#: Bound of every wait for what the server does on its own (never reached when it works).
WITHIN: Final = 30.0


async def closed_with(client: FTN3Client) -> tuple[int, str]:
    """The code and reason of the server's close of ``client``'s connection."""
    async with asyncio.timeout(WITHIN):
        await client.wait_closed()
    close = client._io.ws.close_rcvd
    assert close is not None
    return int(close.code), close.reason
