"""``python -m bench.faults [--minutes N] [--cuts-per-run C] [--seed S]``: the power-loss
schedule (:mod:`bench.faults.powerloss`) for N minutes, half at ``--durability full`` and half
at ``normal``, in runs of C cuts (each on a new database and filesystem), then one table:
cuts (and how many hit the moment they aimed at), adds and their outcomes, the verdicts of
:mod:`bench.faults.checker`, and what each cut took (acknowledged events, and milliseconds
of acknowledged history). Needs FUSE (``/dev/fuse``, Debian's ``fuse3``, ``mfusepy``).
The exit status is 1 when ``full`` shows any anomaly, or a server did not start after a cut.

``python -m bench.faults --net [--kinds cut slow pause] [--minutes N] [--faults-per-run F]``:
the network fault schedules (:mod:`bench.faults.netfaults`) instead, N minutes shared by the
kinds, in runs of F faults (each on a new PostgreSQL server and new hosts), then one table.
Needs root, iproute2, iptables and PostgreSQL's server binaries. The exit status is 1 when
any run shows an anomaly or ended early.
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

from tests import nethosts
from tests.faultfs import unavailable

from . import netfaults
from .checker import Verdicts
from .powerloss import KINDS, Result, Schedule, run

COLUMNS = (
    "durability", "runs", "cuts", "aimed: random/checkpoint/retention", "adds", "acknowledged",
    "refused", "unknown", "events read at the end", "discarded",
    *(name.replace("_", " ") for name in Verdicts.ANOMALIES),
    "lost per cut: events mean / max", "ms of history mean / max",
)  # fmt: skip


NET_COLUMNS = (
    "schedule", "runs", "faults", "adds", "acknowledged", "refused", "unknown",
    "events read at the end", "aggregate copies",
    *(name.replace("_", " ") for name in Verdicts.ANOMALIES),
    "in flight at a pause", "written late", "serving again after a fault, s: mean / max",
)  # fmt: skip


def totals(verdicts: list[Verdicts]) -> Verdicts:
    total = Verdicts()
    for each in verdicts:
        for name, count in each.counts().items():
            setattr(total, name, getattr(total, name) + count)
        total.in_flight_at_pause += each.in_flight_at_pause
        total.late_write += each.late_write
    return total


def net_row(kind: str, results: list[netfaults.Result]) -> list[str]:
    counts = totals([result.verdicts for result in results])
    again = [f.serving_again or 0.0 for result in results for f in result.faults]
    return [
        kind, str(len(results)), str(sum(len(result.faults) for result in results)),
        *(f"{getattr(counts, name):,}" for name in ("adds", "acknowledged", "refused", "unknown")),
        f"{sum(result.events for result in results):,}",
        f"{sum(result.copies for result in results):,}",
        *(str(getattr(counts, name)) for name in Verdicts.ANOMALIES),
        str(counts.in_flight_at_pause),
        str(counts.late_write),
        f"{statistics.fmean(again or [0]):.2f} / {max(again or [0]):.2f}",
    ]  # fmt: skip


def print_table(columns: tuple[str, ...], rows: list[list[str]]) -> None:
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for line in rows:
        print("| " + " | ".join(line) + " |")


async def net_main(args: argparse.Namespace) -> int:
    reason = nethosts.unavailable()
    if reason is not None:
        print(f"bench.faults --net: {reason}", file=sys.stderr)
        return 2
    table: list[list[str]] = []
    failed = False
    for number, kind in enumerate(args.kinds):
        results: list[netfaults.Result] = []
        until = time.monotonic() + args.minutes * 60 / len(args.kinds)
        while not results or time.monotonic() < until:
            seed = args.seed * 1000 + number * 100 + len(results)
            schedule = netfaults.Schedule(kind, faults=args.faults_per_run, seed=seed)
            workdir = Path(tempfile.mkdtemp(prefix="bench-netfaults-"))
            result = await netfaults.run(schedule, workdir)
            results.append(result)
            print(
                f"{kind} run {len(results)} (seed {seed}, {result.seconds:.0f} s): "
                f"{result.verdicts.describe()}",
                flush=True,
            )
            bad = not result.verdicts.valid or result.failed is not None
            if result.failed is not None:
                print(f"  ended early: {result.failed}", flush=True)
            if bad:
                print(f"  the servers' logs are kept in {workdir}", flush=True)
                failed = True
            else:
                shutil.rmtree(workdir)
        table.append(net_row(kind, results))
    print_table(NET_COLUMNS, table)
    return 1 if failed else 0


def row(durability: str, results: list[Result]) -> list[str]:
    totals_ = totals([result.verdicts for result in results])
    cuts = [cut for result in results for cut in result.cuts]
    aimed = "/".join(str(sum(c.aimed for c in cuts if c.kind == kind)) for kind in KINDS)
    losses = [loss for result in results for loss in result.verdicts.losses]
    per_cut = [loss.events for loss in losses] + [0] * (len(cuts) - len(losses))
    ms = [loss.ms for loss in losses] + [0.0] * (len(cuts) - len(losses))
    counts = totals_.counts()
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
    parser.add_argument("--net", action="store_true", help="the network fault schedules")
    parser.add_argument("--kinds", nargs="+", choices=netfaults.KINDS, default=netfaults.KINDS)
    parser.add_argument("--faults-per-run", type=int, default=20)
    args = parser.parse_args(argv)
    if args.net:
        return await net_main(args)
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
    print_table(COLUMNS, table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
