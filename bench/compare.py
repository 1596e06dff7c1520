"""``python -m bench.compare --before DIR [--installed] [--rounds N] [--durability full normal]
[--workers N] [--reads EVENTS] [--pg URL] [--keys]``

The write workloads (with ``--reads``: the read workloads instead) against two futoin-evt
servers side by side: one run from the source tree
``DIR`` (say, ``git archive main | tar -x -C DIR``) and one from this tree (with
``--installed``: from the installed package, so ``--before .`` against a compiled build gives
what compiling pays). Each round runs
every workload on one and then the other, so both meet the same load from the rest of the
machine; the table gives the medians of calls/s and of the server's CPU time per call
(``/proc/PID/stat``), and their ratios after/before; then the push latency at 1,000 events/s
(p50 and p99, medians of the rounds). With ``--reads``, both servers start with that many
events stored, and each round measures the raw read limit too (:func:`.others.read_groups`):
each server's ratio to it is printed below the table. With ``--pg``, each server runs on a
new database of its own on that PostgreSQL server (the write workloads only). With ``--keys``,
the write workloads also run with a producer's key on each event (1 at a time and 32 in
flight), and each tree's ratio of keyed to unkeyed calls/s is printed below the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from . import others, systems, workloads

THIS_TREE: Final = Path(__file__).resolve().parent.parent

WORKLOADS: Final[dict[str, tuple[Callable[[systems.System, int], Awaitable[float]], int]]] = {
    "addEvent, 1 at a time": (workloads.add_serial, 2_000),
    "addEvent, 32 in flight": (workloads.add_in_flight, 20_000),
    "addEvent, 8 connections x 4": (workloads.add_from_connections, 20_000),
}
#: The write workloads with a producer's key on each event (``--keys``), and the workload
#: without keys each is compared with.
KEYED: Final[dict[str, tuple[Callable[[systems.System, int], Awaitable[float]], int]]] = {
    "addEvent with keys, 1 at a time": (functools.partial(workloads.add_serial, keyed=True), 2_000),
    "addEvent with keys, 32 in flight": (
        functools.partial(workloads.add_in_flight, keyed=True),
        20_000,
    ),
}
UNKEYED: Final = {
    "addEvent with keys, 1 at a time": "addEvent, 1 at a time",
    "addEvent with keys, 32 in flight": "addEvent, 32 in flight",
}
#: The read workloads (``--reads``), and how the raw limit reads for each (page size).
READS: Final = {
    "poll drain": (workloads.poll_drain, others.POLL_PAGE_BYTES, others.POLL_WINDOW),
    "push catch-up": (workloads.push_catch_up, others.PUSH_GROUP_BYTES, others.PUSH_WINDOW),
}
#: Events per push latency measurement (5 s at 1,000/s).
LATENCY_EVENTS: Final = 5_000


async def measure(system: systems.System, workload: str, reads: int) -> tuple[float, float]:
    """Calls/s (events/s) and the server's CPU µs per call (event)."""
    run, calls = (READS[workload][0], reads) if reads else {**WORKLOADS, **KEYED}[workload]
    before = system.cpu_seconds()
    rate = await run(system, calls)
    return rate, (system.cpu_seconds() - before) / calls * 1e6


async def start(
    stack: contextlib.AsyncExitStack,
    place: Path,
    tree: Path | None,
    args: argparse.Namespace,
    durability: str,
) -> systems.System:
    """One tree's server (None: the installed package): on a SQLite file in ``place``, or a
    new database on ``--pg``."""
    if args.pg is None:
        return await systems.start_futoin_evt(
            place, "--workers", str(args.workers), durability=durability, source=tree,
            prefill=args.reads,
        )  # fmt: skip
    from . import postgres  # psycopg only when asked for

    url = await stack.enter_async_context(postgres.database(args.pg))
    await prepare_pg(url, tree)
    return await systems.serve(
        url, "--workers", str(args.workers), "--durability", durability, source=tree
    )


#: Makes a PostgreSQL database ready for the benchmarks with the code of the tree it runs in.
_PREPARE_PG: Final = (
    "import asyncio, sys; from bench.postgres import prepare; asyncio.run(prepare(sys.argv[1], 0))"
)


async def prepare_pg(url: str, tree: Path | None) -> None:
    """The users of the benchmarks in the new database ``url``, by ``tree``'s code (None:
    this one's), so the schema is that tree's own (an older tree refuses a newer one)."""
    if tree is None:
        from . import postgres

        await postgres.prepare(url, 0)
        return
    made = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PREPARE_PG,
        url,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if await made.wait():
        raise RuntimeError(f"could not make the database of {tree}")


async def compare(args: argparse.Namespace, durability: str) -> None:
    before, rounds, workers, reads = args.before.resolve(), args.rounds, args.workers, args.reads
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    latencies: dict[str, list[dict[str, float]]] = {}
    limits: dict[str, list[float]] = {}
    names = list(READS if reads else WORKLOADS) + (list(KEYED) if args.keys and not reads else [])
    raw_db = Path(tempfile.mkdtemp(prefix="bench-raw-")) / "raw.sqlite"
    raw_reads = None
    if reads:
        systems.prepare_futoin_evt_db(raw_db, reads)
        raw_reads = await others.start_raw_reads()
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))
        trees = {"before": before, "after": None if args.installed else THIS_TREE}
        servers = {}
        for name, tree in trees.items():
            (Path(tmp) / name).mkdir()
            servers[name] = await start(stack, Path(tmp) / name, tree, args, durability)
        try:
            for _ in range(rounds):
                for workload in names:
                    for name, system in servers.items():
                        figures.setdefault((workload, name), []).append(
                            await measure(system, workload, reads)
                        )
                    if raw_reads is not None:
                        _run, max_bytes, window = READS[workload]
                        limit = await others.read_groups(
                            raw_reads, raw_db, reads, max_bytes, window
                        )
                        limits.setdefault(workload, []).append(limit)
                if reads:
                    continue
                for name, system in servers.items():
                    latencies.setdefault(name, []).append(
                        await workloads.push_latency(system, LATENCY_EVENTS)
                    )
        finally:
            for system in (*servers.values(), *([raw_reads] if raw_reads else [])):
                await system.stop()
            raw_db.unlink(missing_ok=True)
            raw_db.parent.rmdir()
    print(
        f"--durability {durability}, --workers {workers}, {rounds} rounds, medians"
        f"{', on PostgreSQL' if args.pg else ''}"
    )
    print(f"{'workload':<28} {'before/s':>9} {'after/s':>9} {'ratio':>6}"
          f" {'before µs':>10} {'after µs':>9} {'ratio':>6}")  # fmt: skip
    for workload in names:
        rate = {n: statistics.median(r for r, _ in figures[workload, n]) for n in trees}
        cpu = {n: statistics.median(c for _, c in figures[workload, n]) for n in trees}
        print(
            f"{workload:<28} {rate['before']:>9,.0f} {rate['after']:>9,.0f}"
            f" {rate['after'] / rate['before']:>5.2f}x {cpu['before']:>10.1f}"
            f" {cpu['after']:>9.1f} {cpu['after'] / cpu['before']:>5.2f}x",
            flush=True,
        )
    for workload in names:
        if workload not in KEYED:
            continue
        plain = UNKEYED[workload]
        rates = {
            n: statistics.median(r for r, _ in figures[workload, n])
            / statistics.median(r for r, _ in figures[plain, n])
            for n in trees
        }
        print(
            f"{workload}: keyed/unkeyed calls/s before {rates['before']:.2f}x,"
            f" after {rates['after']:.2f}x",
            flush=True,
        )
    for workload, seen in limits.items():
        limit = statistics.median(seen)
        ratios = {n: statistics.median(r for r, _ in figures[workload, n]) / limit for n in trees}
        print(
            f"{workload}: raw limit {limit:,.0f}/s (each round: "
            + " / ".join(f"{v:,.0f}" for v in seen)
            + f"); before {ratios['before']:.2f}x, after {ratios['after']:.2f}x of it",
            flush=True,
        )
    for quantile in ("p50", "p99") if latencies else ():
        ms = {n: statistics.median(r[quantile] for r in latencies[n]) for n in trees}
        print(
            f"{'push latency ' + quantile + ' (ms)':<28} {ms['before']:>9.2f} {ms['after']:>9.2f}"
            f" {ms['after'] / ms['before']:>5.2f}x  each round: "
            + " / ".join(f"{r[quantile]:.2f}" for r in latencies["before"])
            + " -> "
            + " / ".join(f"{r[quantile]:.2f}" for r in latencies["after"]),
            flush=True,
        )


async def main_async(args: argparse.Namespace) -> None:
    if args.pg and args.reads:
        raise SystemExit("bench.compare: --reads runs on SQLite only")
    for durability in args.durability:
        await compare(args, durability)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", nargs="+", default=["full", "normal"])
    parser.add_argument("--workers", type=int, default=1, help="server processes of each")
    parser.add_argument(
        "--reads", type=int, default=0, help="the read workloads, on this many stored events"
    )
    parser.add_argument("--pg", metavar="URL", help="run both servers on PostgreSQL there")
    parser.add_argument(
        "--keys", action="store_true", help="the write workloads with a key on each event too"
    )
    parser.add_argument(
        "--installed",
        action="store_true",
        help="after: the installed package (a compiled build, say) instead of this tree",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
