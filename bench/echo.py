"""``python -m bench.echo``: a bare websockets server that sends every message back as it came.

The raw limit of a call's round trip: the load generator's requests come back as replies
(same ``rid``, no ``e``), so it drives this server exactly as it drives futoin-evt. It runs in
a process of its own so that its CPU time can be read from ``/proc`` like a server's. Prints
``ws://127.0.0.1:PORT/`` once it listens, then serves until terminated.
"""

from __future__ import annotations

import asyncio

from websockets.asyncio.server import ServerConnection, serve


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


async def main() -> None:
    async with serve(echo, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"ws://127.0.0.1:{port}/", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
