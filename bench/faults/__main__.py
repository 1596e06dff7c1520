"""``python -m bench.faults [--minutes N] [--cuts-per-run C] [--seed S]``: the power-loss
schedule (:mod:`bench.faults.powerloss`) for N minutes, half at ``--durability full`` and half
at ``normal``, in runs of C cuts (each on a new database and filesystem), then one table:
cuts (and how many hit the moment they aimed at), adds and their outcomes, the verdicts of
:mod:`bench.faults.checker`, and what each cut took (acknowledged events, and milliseconds
of acknowledged history). Needs FUSE (``/dev/fuse``, Debian's ``fuse3``, ``mfusepy``).
The exit status is 1 when ``full`` shows any anomaly, or a server did not start after a cut.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.faultfs import unavailable

from .checker import Verdicts
from .powerloss import KINDS, Result, Schedule, run

COLUMNS = (
    "durability", "runs", "cuts", "aimed: random/checkpoint/retention", "adds", "acknowledged",
    "refused", "unknown", "events read at the end", "discarded", "lost", "wrong id",
    "duplicated", "reordered", "phantom", "skipped", "delivered twice",
    "lost per cut: events mean / max", "ms of history mean / max",
)  # fmt: skip


def row(durability: str, results: list[Result]) -> list[str]:
    totals = Verdicts()
    for result in results:
        for name, count in result.verdicts.counts().items():
            setattr(totals, name, getattr(totals, name) + count)
    cuts = [cut for result in results for cut in result.cuts]
    aimed = "/".join(str(sum(c.aimed for c in cuts if c.kind == kind)) for kind in KINDS)
    losses = [loss for result in results for loss in result.verdicts.losses]
    per_cut = [loss.events for loss in losses] + [0] * (len(cuts) - len(losses))
    ms = [loss.ms for loss in losses] + [0.0] * (len(cuts) - len(losses))
    counts = totals.counts()
    return [
        durability, str(len(results)), str(len(cuts)), aimed,
        *(str(counts[name]) for name in ("adds", "acknowledged", "refused", "unknown")),
        str(sum(result.events for result in results)), str(counts["discarded"]),
        *(str(counts[name]) for name in Verdicts.ANOMALIES),
        f"{statistics.fmean(per_cut or [0]):.0f} / {max(per_cut or [0])}",
        f"{statistics.fmean(ms or [0]):.0f} / {max(ms or [0]):.0f}",
    ]  # fmt: skip


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--cuts-per-run", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"bench.faults: {reason}", file=sys.stderr)
        return 2
    table: list[list[str]] = []
    failed = False
    for number, durability in enumerate(("full", "normal")):
        results: list[Result] = []
        until = time.monotonic() + args.minutes * 30
        while not results or time.monotonic() < until:
            seed = args.seed * 1000 + number * 100 + len(results)
            schedule = Schedule(durability, cuts=args.cuts_per_run, seed=seed)
            workdir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
            result = await run(schedule, workdir)
            results.append(result)
            print(
                f"{durability} run {len(results)} (seed {seed}, at the end {result.end}): "
                f"{result.verdicts.describe()}",
                flush=True,
            )
            if durability == "full" and not result.verdicts.valid:
                print(f"  the disk is kept in {workdir}", flush=True)
            else:
                shutil.rmtree(workdir)
            if result.failed_start is not None:
                print(f"  {result.failed_start}", flush=True)
                failed = True
                break
        failed |= durability == "full" and not all(r.verdicts.valid for r in results)
        table.append(row(durability, results))
    print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for line in table:
        print("| " + " | ".join(line) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
