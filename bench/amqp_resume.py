"""``python -m bench.amqp_resume [--db URL] [--rounds N]``: what a detach and re-attach round
of one AMQP consumer link costs, durable (its terminus kept on the detach with
``closed=false``, taken on the attach) and not (an attach that drops the terminus under its
name): µs of wall time and of this process's CPU per round, the server in this process, raw
frames on one connection (python-qpid-proton's codec), each answer awaited.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from proton import Described, symbol, uint, ulong

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.users import hash_password
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig
from tests.support.amqp_wire import ATTACH, DETACH, SOURCE, TARGET, frame, logged_in

PASSWORD = "alice-pw"


def attach(durable: int) -> bytes:
    """A receiving link ``resumed`` from ``events``, its source asking for ``durable``."""
    source = Described(ulong(SOURCE), ["events", uint(durable), symbol("session-end"), uint(60)])
    target = Described(ulong(TARGET), [])
    return frame(ATTACH, ["resumed", uint(0), True, None, None, source, target])


async def rounds(port: int, durable: int, count: int) -> tuple[list[float], float]:
    """Wall µs of each round, and the CPU µs per round."""
    peer = await logged_in(port, b"\0alice\0" + PASSWORD.encode())
    attaching, detaching = attach(durable), frame(DETACH, [uint(0), False])
    walls: list[float] = []
    cpu = time.process_time()
    for _ in range(count):
        started = time.perf_counter()
        await peer.send(attaching)
        await peer.until(ATTACH)
        await peer.send(detaching)
        await peer.until(DETACH)
        walls.append((time.perf_counter() - started) * 1e6)
        peer.frames.clear()
    cpu = (time.process_time() - cpu) * 1e6 / count
    await peer.close()
    return walls, cpu


async def measure(db: str, count: int) -> dict[str, Any]:
    config = ServerConfig(
        db=db,
        transport=TransportConfig(port=0),
        amqp=AmqpConfig(port=0),
        retention=RetentionConfig(interval=3600),
    )
    server = await EventServer.start(config)
    try:
        if await server.store.get_user("alice") is None:
            user = await server.store.add_user("alice", hash_password(PASSWORD))
            await server.store.grant(user, "*", 3)
            await server.access.changed_here()
        assert server.amqp is not None
        found: dict[str, Any] = {}
        for durable, label in ((2, "durable"), (0, "not durable")):
            await rounds(server.amqp.port, durable, count // 10)  # warm up
            walls, cpu = await rounds(server.amqp.port, durable, count)
            found[label] = {
                "wall_us_median": round(statistics.median(walls)),
                "wall_us_p90": round(statistics.quantiles(walls, n=10)[-1]),
                "cpu_us": round(cpu),
            }
        return found
    finally:
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", help="a PostgreSQL URL (default: a new SQLite file)")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        db = args.db or str(Path(tmp) / "resume.sqlite")
        print(json.dumps(asyncio.run(measure(db, args.rounds))))


if __name__ == "__main__":
    main()
