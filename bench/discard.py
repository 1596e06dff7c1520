"""``python -m bench.discard [--events N] [--adds N]``: how fast read events are discarded
while producers run at full speed, and how much the producers slow down meanwhile.

The server runs in this process (so the discard pass can be started and timed exactly); the
producers (addEvent, 32 in flight) run in a second process, once without and once during a
discard of ``--events`` events every consumer has read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from futoin_evt.domain.stream import UserId
from futoin_evt.log.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

from .systems import USER, prepare_futoin_evt_db

ROOT = str(Path(__file__).resolve().parent.parent)
PRODUCER = """
import asyncio, json, sys
sys.path.insert(0, {root!r})
from bench import workloads
from bench.systems import System
class Target:
    url = {url!r}
    credentials = {credentials!r}
    name = "futoin-evt"
print(json.dumps(asyncio.run(workloads.add_in_flight(Target(), {adds}))))
"""


async def produce(url: str, adds: int) -> float:
    code = PRODUCER.format(
        root=ROOT,
        url=url,
        credentials=f"{USER}:bench-pw",
        adds=adds,
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return float(json.loads(out))


async def measure(events: int, adds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-discard-") as tmp:
        db = Path(tmp) / "discard.sqlite"
        prepare_futoin_evt_db(db, events)
        with sqlite3.connect(db) as conn:  # a consumer that has read none of them yet
            conn.execute(
                "INSERT INTO consumers (user_id, component, position, registered_at,"
                " last_seen_at) VALUES (1, 'READER', 0, '2026-01-01T00:00:00Z',"
                " '2099-01-01T00:00:00Z')"
            )
        config = ServerConfig(
            db=db,
            transport=TransportConfig(port=0),
            retention=RetentionConfig(interval=3600),  # started by hand below
        )
        async with await EventServer.start(config) as server:
            baseline = await produce(server.url, adds)
            await server.store.acknowledge(UserId(1), "READER", events)  # now it has read all
            start = time.perf_counter()
            discarding = asyncio.create_task(server.discarder.discard())
            during = await produce(server.url, adds)
            produced_seconds = time.perf_counter() - start
            deleted = await discarding
            discard_seconds = time.perf_counter() - start
    return {
        "events deleted": deleted,
        "discard (events/s)": deleted / discard_seconds,
        "addEvent 32 in flight, alone (calls/s)": baseline,
        "addEvent 32 in flight, during discard (calls/s)": during,
        "producer throughput kept (%)": 100 * during / baseline,
        "producers done before the discard (1 = yes)": float(produced_seconds < discard_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.discard", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--adds", type=int, default=10_000)
    args = parser.parse_args()
    for name, value in asyncio.run(measure(args.events, args.adds)).items():
        print(f"{name:48s} {value:12,.1f}")


if __name__ == "__main__":
    main()
