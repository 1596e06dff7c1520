"""``python -m bench.raw_reads``: the raw read limit's server, a bare websockets server that
sends groups of events read from a SQLite file.

A client's first message names the file, the group size and the window: ``{"db": PATH,
"count": N, "max_bytes": M, "window": W}``. The server then reads each group with ``sqlite3``
on a thread of its own (futoin-evt's page statement and columns, at most 1000 events or
``max_bytes`` of them, made into the FTN18 events' JSON there) and sends it as an
``onEvents``-like request, with at most ``W`` groups unacknowledged (futoin-evt: 1 for a
poll, its push window for a push stream), until ``N`` events are sent. It runs in a process
of its own, as futoin-evt does, so that its client does not share its interpreter lock and
its CPU time can be read from ``/proc``. Prints ``ws://127.0.0.1:PORT/`` once it listens,
then serves until terminated.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import sqlite3
from typing import Final

from websockets.asyncio.server import ServerConnection, serve

from futoin_evt.domain.stream import MAX_EVENTS_PER_CALL
from futoin_evt.storage.thread import WorkerThread

#: The statement and columns of futoin-evt's page read, on the same file layout.
PAGE_SQL: Final = (
    f"SELECT id, type, data, ts FROM events WHERE id > ? ORDER BY id LIMIT {MAX_EVENTS_PER_CALL}"
)


def read_group(conn: sqlite3.Connection, after_id: int, max_bytes: int) -> tuple[str, int, int]:
    """A group after ``after_id`` as a JSON array of FTN18 events of at most ``max_bytes``
    (ASCII events), its size in events and its last id."""
    parts: list[str] = []
    size = 2
    last_id = after_id
    cursor = conn.execute(PAGE_SQL, (after_id,))
    for event_id, event_type, data, ts in cursor:
        text = f'{{"id":"{event_id}","type":"{event_type}","data":{data},"ts":"{ts}"}}'
        size += len(text) + 1
        if parts and size > max_bytes:
            break
        parts.append(text)
        last_id = event_id
    cursor.close()
    return "[" + ",".join(parts) + "]", len(parts), last_id


async def send_groups(ws: ServerConnection) -> None:
    request = json.loads(await ws.recv())
    count, max_bytes = int(request["count"]), int(request["max_bytes"])
    window = int(request["window"])
    thread = WorkerThread("raw-reader")
    connect = functools.partial(sqlite3.connect, request["db"], isolation_level=None)
    conn = await thread.run(connect)
    room = asyncio.Semaphore(window)

    async def read_acks() -> None:
        async for _reply in ws:
            room.release()

    acks = asyncio.create_task(read_acks())
    try:
        after_id = 0
        sent = 0
        for seq in itertools.count():
            if sent >= count:
                break
            await room.acquire()
            events, size, after_id = await thread.run(read_group, conn, after_id, max_bytes)
            await ws.send(f'{{"f":"x","p":{{"seq":{seq},"events":{events}}},"rid":"S{seq}"}}')
            sent += size
        for _ in range(window):  # every group acknowledged
            await room.acquire()
    finally:
        acks.cancel()
        await thread.run(conn.close)
        thread.stop()


async def main() -> None:
    async with serve(send_groups, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"ws://127.0.0.1:{port}/", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
