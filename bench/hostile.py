"""``python -m bench.hostile``: what hostile peers cost everyone else.

- A user's first login (a password check) on a quiet server, and the same while another
  address pipelines 200 different wrong passwords on one connection.
- SIGTERM to exit: on a quiet server, and with a push consumer and an HTTP feed client that
  both stopped reading (each far behind on a backlog of 60 KB events).

Each server is a process of its own on 127.0.0.1 with a fresh database.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.stream import utc_timestamp

from .spark import start_server
from .systems import PASSWORD, USER, prepare_futoin_evt_db, print_figures

GEN = "futoin.evt.gen:1.1"
OTHER_LOOPBACK = "127.0.0.2"


def _frame(rid: int, f: str, params: dict[str, object], sec: str) -> str:
    return json.dumps({"rid": f"C{rid}", "f": f, "p": params, "sec": sec})


def add_users(db: Path, count: int) -> None:
    """Users u0, u1, ... with password pw: each first login is a real password check (a
    verified password is remembered)."""
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO users (name, password_hash, created_at) VALUES (?, ?, ?)",
            [(f"u{i}", hash_password("pw"), utc_timestamp()) for i in range(count)],
        )


async def first_login_seconds(url: str, user: str) -> float:
    start = time.perf_counter()
    client = await EventStreamClient.connect(url, credentials=f"{user}:pw")
    await client.ping(1)
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed


async def login_under_flood(url: str, user: str, flood: int = 200) -> float:
    async with connect(url, local_addr=(OTHER_LOOPBACK, 0)) as attacker:
        for i in range(flood):
            await attacker.send(_frame(i, f"{GEN}:ping", {"echo": i}, f"{USER}:wrong-{i}"))
        await attacker.recv()  # the flood is in
        elapsed = await first_login_seconds(url, user)
        for _ in range(flood - 1):
            await attacker.recv()
    return elapsed


def sigterm_seconds(proc: subprocess.Popen[str]) -> float:
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    return time.perf_counter() - start


async def stall_readers(url: str) -> list[object]:
    """A push consumer and a feed client, each with far more to read than it reads."""
    credentials = f"{USER}:{PASSWORD}"
    async with await EventStreamClient.connect(url, credentials=credentials) as client:
        big = "z" * 60_000
        await asyncio.gather(*(client.add_event("BIG", big) for _ in range(600)))
    push = await connect(url, max_size=None).__aenter__()
    await push.send(
        _frame(1, "futoin.evt.push:1.1:registerConsumer", {"component": "S"}, credentials)
    )
    await push.recv()
    await push.send(
        _frame(2, "futoin.evt.push:1.1:readyToReceive", {"component": "S"}, credentials)
    )
    await push.recv()
    host, port = url.removeprefix("ws://").rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    basic = base64.b64encode(credentials.encode()).decode()
    writer.write(
        f"GET /feed?n=1&cursor0=_first HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Basic {basic}\r\n\r\n".encode()
    )
    await reader.readuntil(b"\r\n\r\n")
    return [push, writer]


async def main() -> None:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "a.sqlite"
        prepare_futoin_evt_db(db, 0)
        add_users(db, 10)
        proc, url = start_server(db)
        quiet = [await first_login_seconds(url, f"u{i}") for i in range(5)]
        flooded = [await login_under_flood(url, f"u{i}") for i in range(5, 10)]
        figures["first login, quiet (ms, median of 5)"] = statistics.median(quiet) * 1000
        figures["first login, 200-password flood elsewhere (ms, median)"] = (
            statistics.median(flooded) * 1000
        )
        figures["the same, worst of 5 (ms)"] = max(flooded) * 1000
        figures["SIGTERM to exit, quiet (s)"] = sigterm_seconds(proc)

        db = Path(tmp) / "b.sqlite"
        prepare_futoin_evt_db(db, 0)
        proc, url = start_server(db)
        stalled = await stall_readers(url)
        figures["SIGTERM to exit, stalled push + feed readers (s)"] = sigterm_seconds(proc)
        del stalled
    print_figures("hostile peers", figures)


if __name__ == "__main__":
    asyncio.run(main())
