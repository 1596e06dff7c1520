"""``python -m bench.hostile``: what hostile peers cost everyone else.

- A user's first login (a password check) on a quiet server, and the same while another
  address pipelines 200 different wrong passwords on one connection.
- SIGTERM to exit: on a quiet server, and with a push consumer and an HTTP feed client that
  both stopped reading (each far behind on a backlog of 60 KB events).
- A siege of never-finishing handshakes (``python -m bench.hostile siege`` runs it alone): with
  ``--max-connections 150``, 600 sockets opened at 100 per second from 50 addresses: 100 each
  start a WebSocket handshake, a feed GET, a DCB read and a Kafka SaslHandshake request, 200
  start AMQP SASL; each sends one more byte every 0.5 s and never finishes. Meanwhile a
  logged-in FTN3 client calls ``ping`` one call after another, and a new client connects
  every 0.25 s (a WebSocket login and call, a feed GET, a DCB read, an AMQP login, a Kafka
  SASL login and Metadata call in turn). The same two clients alone, in the
  same run, are the comparison. The attacker and the new clients are processes of their
  own; ``--source DIR`` runs the server from another source tree (the code before a change).

Each server is a process of its own on 127.0.0.1 with a fresh database.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import signal
import sqlite3
import statistics
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.stream import utc_timestamp

from .spark import start_server
from .systems import (
    PASSWORD,
    USER,
    free_port,
    prepare_futoin_evt_db,
    print_figures,
    start_futoin_evt,
)

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


# -- a siege of never-finishing handshakes ---------------------------------------------------------

SIEGE_SOCKETS = 600
SIEGE_RATE = 100.0  # sockets opened per second
SIEGE_HOLD = 5.0  # seconds they are held after the last one opened
SIEGE_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 52)]
TRICKLE_SECONDS = 0.5
#: How each kind of socket starts; then one byte of an endless header every 0.5 s.
SIEGE_STARTS = {
    "ws": b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nX-Slow: ",
    "feed": b"GET /feed HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    "dcb": b"POST /dcb/v1/read HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    # a SASL header, then a sasl-init frame of 4000 bytes that never ends
    "amqp": b"AMQP\x03\x01\x00\x00" + (4000).to_bytes(4, "big") + b"\x02\x01\x00\x00",
    # a request frame of 4000 bytes (a SaslHandshake v1, by its header) that never ends
    "kafka": struct.pack(">ihhih", 4000, 17, 1, 1, 5) + b"siege",
}
SIEGE_MIX = ["ws", "amqp", "feed", "kafka", "amqp", "dcb"]


async def _besiege(ws_port: int, amqp_port: int, kafka_port: int) -> dict[str, float]:
    sockets: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    # 100 each of the kinds on the WebSocket port (300 there), 200 on the AMQP port, 100 on
    # the Kafka port
    ports = {"amqp": amqp_port, "kafka": kafka_port}
    kinds = itertools.cycle([(kind, SIEGE_STARTS[kind]) for kind in SIEGE_MIX])
    failed = 0
    start = time.perf_counter()

    async def trickle() -> None:
        while True:
            await asyncio.sleep(TRICKLE_SECONDS)
            for _reader, writer in sockets:
                if not writer.is_closing():
                    writer.write(b"a")

    trickler = asyncio.create_task(trickle())
    for i in range(SIEGE_SOCKETS):
        await asyncio.sleep(max(start + i / SIEGE_RATE - time.perf_counter(), 0))
        kind, opening = next(kinds)
        port = ports.get(kind, ws_port)
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(SIEGE_ADDRESSES[i % len(SIEGE_ADDRESSES)], 0)
            )
        except OSError:
            failed += 1
            continue
        writer.write(opening)
        sockets.append((reader, writer))
    await asyncio.sleep(SIEGE_HOLD)
    trickler.cancel()
    cut = sum(
        writer.is_closing() or reader.at_eof() or reader.exception() is not None
        for reader, writer in sockets
    )
    for _reader, writer in sockets:
        writer.transport.abort()
    return {"opened": len(sockets), "failed to open": failed, "cut": cut}


def besiege(ws_port: int, amqp_port: int, kafka_port: int) -> dict[str, float]:
    """The attacker, in a process of its own."""
    return asyncio.run(_besiege(ws_port, amqp_port, kafka_port))


async def kafka_login(port: int) -> None:
    """A Kafka client's SASL PLAIN login on a socket of its own, then a Metadata call."""
    from kafka.protocol import metadata, sasl

    from futoin_evt.kafka.wire import KNOWN

    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def call(request: Any) -> Any:
        request.with_header(correlation_id=request.API_KEY, client_id="bench")
        writer.write(bytes(request.encode(header=True, framed=True)))
        size = int.from_bytes(await reader.readexactly(4), "big")
        frame = await reader.readexactly(size)
        return KNOWN[request.API_KEY][1].decode(frame, version=request.version, header=True)

    try:
        await call(sasl.SaslHandshakeRequest(version=1, mechanism="PLAIN"))
        token = f"\0{USER}\0{PASSWORD}".encode()
        login = await call(sasl.SaslAuthenticateRequest(version=1, auth_bytes=token))
        if login.error_code:
            raise RuntimeError(f"Kafka login failed: {login.error_message}")
        await call(metadata.MetadataRequest(version=1, topics=None))
    finally:
        writer.close()


async def _newcomers(
    url: str, amqp_url: str, kafka_port: int, seconds: float
) -> dict[str, list[float]]:
    """A new client every 0.25 s, each kind in turn: the seconds each took, or -1 failed."""
    from proton.utils import BlockingConnection

    credentials = f"{USER}:{PASSWORD}"
    base = url.replace("ws", "http", 1)
    results: dict[str, list[float]] = {"ws": [], "feed": [], "dcb": [], "amqp": [], "kafka": []}

    def amqp_login() -> None:
        conn = BlockingConnection(
            amqp_url, user=USER, password=PASSWORD, allowed_mechs="PLAIN", timeout=5
        )
        conn.close()

    async def one(kind: str) -> None:
        if kind == "ws":
            async with await EventStreamClient.connect(url, credentials=credentials) as client:
                await client.ping(1)
        elif kind == "amqp":
            await asyncio.to_thread(amqp_login)
        elif kind == "kafka":
            await kafka_login(kafka_port)
        else:
            async with httpx.AsyncClient(auth=(USER, PASSWORD)) as http:
                if kind == "feed":
                    response = await http.get(base + "feed")
                else:
                    response = await http.post(base + "dcb/v1/read", json={"limit": 1})
                response.raise_for_status()

    end = time.perf_counter() + seconds
    for kind in itertools.cycle(results):
        if time.perf_counter() >= end:
            break
        started = time.perf_counter()
        try:
            async with asyncio.timeout(5):
                await one(kind)
            results[kind].append(time.perf_counter() - started)
        except Exception:
            results[kind].append(-1.0)
        await asyncio.sleep(max(started + 0.25 - time.perf_counter(), 0))
    return results


def newcomers(url: str, amqp_url: str, kafka_port: int, seconds: float) -> dict[str, list[float]]:
    """New clients, in a process of their own."""
    return asyncio.run(_newcomers(url, amqp_url, kafka_port, seconds))


async def caller(url: str, seconds: float) -> tuple[list[float], int]:
    """A logged-in FTN3 client calling ping for ``seconds``: each call's seconds, errors."""
    latencies: list[float] = []
    errors = 0
    client = await EventStreamClient.connect(url, credentials=f"{USER}:{PASSWORD}")
    await client.ping(0)  # logged in: the password is checked
    end = time.perf_counter() + seconds
    for i in itertools.count(1):
        started = time.perf_counter()
        if started >= end:
            break
        try:
            await client.ping(i)
            latencies.append(time.perf_counter() - started)
        except Exception:
            errors += 1
            await client.close()
            client = await EventStreamClient.connect(url, credentials=f"{USER}:{PASSWORD}")
    await client.close()
    return latencies, errors


def _percentile(values: list[float], n: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[n - 1] if values else 0.0


async def siege_phase(url: str, amqp_url: str, kafka_port: int, attacked: bool) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    seconds = SIEGE_SOCKETS / SIEGE_RATE + SIEGE_HOLD
    host_port = int(url.rstrip("/").rsplit(":", 1)[1])
    amqp_port = int(amqp_url.rsplit(":", 1)[1])
    with ProcessPoolExecutor(2) as pool:
        arrivals = loop.run_in_executor(pool, newcomers, url, amqp_url, kafka_port, seconds)
        attack = (
            loop.run_in_executor(pool, besiege, host_port, amqp_port, kafka_port)
            if attacked
            else None
        )
        latencies, errors = await caller(url, seconds)
        fresh = await arrivals
        siege = await attack if attack is not None else {}
    label = "under siege" if attacked else "alone"
    figures = {
        f"{label}: calls": float(len(latencies)),
        f"{label}: call errors": float(errors),
        f"{label}: call p50 (ms)": _percentile(latencies, 50) * 1000,
        f"{label}: call p99 (ms)": _percentile(latencies, 99) * 1000,
        f"{label}: call max (ms)": max(latencies, default=0.0) * 1000,
    }
    for kind, results in fresh.items():
        ok = [r for r in results if r >= 0]
        figures[f"{label}: new {kind} clients tried"] = float(len(results))
        figures[f"{label}: new {kind} clients served"] = float(len(ok))
        figures[f"{label}: new {kind} clients, slowest (ms)"] = max(ok, default=0.0) * 1000
    for key, value in siege.items():
        figures[f"{label}: hostile sockets {key}"] = value
    return figures


async def siege(source: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        kafka_port = free_port()
        system = await start_futoin_evt(
            Path(tmp),
            *("--max-connections", "150", "--amqp", "127.0.0.1:0"),
            *("--kafka", f"127.0.0.1:{kafka_port}"),
            source=source,
        )
        try:
            assert system.amqp_url is not None
            figures = await siege_phase(system.url, system.amqp_url, kafka_port, attacked=False)
            figures |= await siege_phase(system.url, system.amqp_url, kafka_port, attacked=True)
        finally:
            await system.stop()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile")
    parser.add_argument("only", nargs="?", choices=["siege"], help="run only this part")
    parser.add_argument("--source", type=Path, help="run the siege's server from this tree")
    args = parser.parse_args()
    if args.only is None:
        print_figures("hostile peers", await logins_and_sigterm())
    print_figures("a siege of never-finishing handshakes", await siege(args.source))


async def logins_and_sigterm() -> dict[str, float]:
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
    return figures


if __name__ == "__main__":
    asyncio.run(main())
