"""``python -m bench.checksums --before DIR [--rounds N] [--events N]``

What each event's checksum costs in the store itself, without a network or a client in the
way: the CPU time (``time.process_time()``, every thread of the process) of appending
``--events`` events through the group commit (``--durability normal``: the CPU, not fsync,
is the limit), then reading them all back from the database in pages (what polls, push
streams and the feeds read) and in rows (what AMQP links and notification read), in a new
process each, alternating between the tree ``DIR`` (say, ``git worktree add DIR main``)
and this one, so both meet the same load from the rest of the machine. Prints the medians
of µs of CPU per event and their ratio after/before, and the cost of the checksum alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Final

from futoin_evt.storage.checksums import event_checksum

from .systems import payload

THIS_TREE: Final = Path(__file__).resolve().parent.parent

#: Run in each tree: the store's appends, page reads and row reads of N events, as µs of CPU
#: per event (its API is the same in both trees).
_RUN: Final = """
import asyncio, json, sys, time
from pathlib import Path
from bench.systems import payload
from futoin_evt.storage.base import Durability
from futoin_evt.storage.sqlite import SqliteStore

async def main(db, count):
    datas = [json.dumps(payload(i), separators=(",", ":")) for i in range(count)]
    result = {}
    async with await SqliteStore.open(db, durability=Durability.NORMAL) as store:
        start = time.process_time()
        for first in range(0, count, 1000):
            chunk = datas[first:first + 1000]
            await asyncio.gather(*(store.submit_append("ORDER", d) for d in chunk))
        result["append"] = time.process_time() - start
    async with await SqliteStore.open(db, durability=Durability.NORMAL) as store:
        start, after = time.process_time(), 0
        while after < count:
            page = await store.read_events(after, limit=1000, max_bytes=8 << 20)
            after = page.last_id
        result["page read"] = time.process_time() - start
        start, after = time.process_time(), 0
        while after < count:
            rows = await store.read_rows(after, limit=1000)
            after = rows[-1][0]
        result["row read"] = time.process_time() - start
    print(json.dumps({k: v / count * 1e6 for k, v in result.items()}))

asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
"""


def run_in(tree: Path, events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-checksums-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", _RUN, str(Path(tmp) / "store.sqlite"), str(events)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    figures: dict[str, float] = json.loads(out)
    return figures


def checksum_alone() -> dict[str, float]:
    """µs of one checksum, of a typical event and of a 4 KiB one."""
    ts = "2026-11-23T00:00:00Z"
    small = json.dumps(payload(17), separators=(",", ":"))
    large = json.dumps({"blob": "x" * 4096})
    found = {}
    for name, data in ((f"{len(small)} B", small), (f"{len(large)} B", large)):
        one = functools.partial(event_checksum, "ORDER", data, ts)
        seconds = min(timeit.repeat(one, number=100_000))
        found[f"checksum of a {name} event"] = seconds / 100_000 * 1e6
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checksums", description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": THIS_TREE}
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            seen[name].append(run_in(tree, args.events))
    print(f"{args.events:,} events, {args.rounds} rounds, medians of µs of CPU per event")
    print(f"{'':<12} {'before':>8} {'after':>8} {'ratio':>6}")
    for what in seen["before"][0]:
        before = statistics.median(r[what] for r in seen["before"])
        after = statistics.median(r[what] for r in seen["after"])
        print(f"{what:<12} {before:>8.2f} {after:>8.2f} {after / before:>5.3f}x")
    for what, micros in checksum_alone().items():
        print(f"{what}: {micros:.3f} µs")


if __name__ == "__main__":
    main()
