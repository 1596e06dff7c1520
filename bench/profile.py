"""``python -m bench.profile [--durability D ...] [--workload NAME ...] [--out DIR] [--source DIR]
[--native]``

Profiles the futoin-evt server (from this tree, or the source tree ``--source``) with py-spy
(in the ``bench`` extra) while one workload runs (the writes, a drain or catch-up of a
prefilled store, the notification fan-out of ``bench.notify``: 10,000 events/s to 100
selector subscribers, or the DCB API of ``bench.dcb`` over a log of 100,000 tagged events:
conditional appends from 32 clients, reads by tag), and saves per workload and durability,
in ``bench/profiles/``:

- ``<workload>-<durability>.folded``: py-spy's collapsed stacks (one line per stack and its
  sample count) of the thread holding the GIL, that is the Python work; SQLite and fsync
  run without the GIL and show in the CPU line of the ``.txt`` only. Open it in any flame
  graph viewer;
- ``<workload>-<durability>.txt``: the server's CPU time per call (user and system, from
  ``/proc/PID/stat``), and the functions with the most samples, on their own and with all
  they call.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from . import dcb, notify, systems, workloads

OUT: Final = Path(__file__).resolve().parent / "profiles"


async def fan_out(system: systems.System, events: int) -> float:
    """Notification fan-out through the server: ``events`` at 10,000/s to the 100 selector
    subscribers of ``bench.notify``; the rate the stream was offered at."""
    rate = 10_000
    figures = await notify.fan_out_through(system, 1, events / rate, rate)
    return float(figures[notify.FAN_OUT_OFFERED])


#: Events in the log the DCB workloads run on (each tag on 10 of them).
DCB_LOG: Final = 100_000


async def dcb_append(system: systems.System, appends: int) -> float:
    """Conditional appends of ``bench.dcb``'s 32 clients, each on a tag of its own."""
    clients = dcb.CLIENTS
    return await dcb.futoin_evt_appends(
        system.url, dcb.Ftn3Caller.connect, 0, clients, appends // clients
    )


async def dcb_read(system: systems.System, reads: int) -> float:
    """Reads of one tag each (10 matching events), one after the other."""
    caller = await dcb.Ftn3Caller.connect(system.url)
    try:
        sizes = dcb.Sizes(DCB_LOG, reads - dcb.WARM_UP_READS, 0, 0, 1)
        latencies = await dcb.futoin_evt_reads(caller, dcb.read_tags(sizes))
    finally:
        await caller.close()
    return 1e6 / statistics.mean(latencies)


WORKLOADS: Final[dict[str, Callable[[systems.System, int], Awaitable[float]]]] = {
    "add_serial": workloads.add_serial,
    "add_in_flight": workloads.add_in_flight,
    "add_serial_keyed": functools.partial(workloads.add_serial, keyed=True),
    "add_in_flight_keyed": functools.partial(workloads.add_in_flight, keyed=True),
    "add_from_connections": workloads.add_from_connections,
    "poll_drain": workloads.poll_drain,
    "push_catch_up": workloads.push_catch_up,
    "fan_out": fan_out,
    "dcb_append": dcb_append,
    "dcb_read": dcb_read,
}
CALLS: Final = {
    "add_serial": 3_000,
    "add_in_flight": 30_000,
    "add_serial_keyed": 3_000,
    "add_in_flight_keyed": 30_000,
    "add_from_connections": 30_000,
    "poll_drain": 100_000,  # events read from a store prefilled with as many
    "push_catch_up": 100_000,
    "fan_out": 50_000,  # events added, each notified to about 15 of the subscribers
    "dcb_append": 32 * 300,
    "dcb_read": 2_000,
}
#: The read workloads read a store prefilled with their events.
READS: Final = ("poll_drain", "push_catch_up")
#: The DCB workloads run on ``bench.dcb``'s server and log (at ``full``, as there).
DCB: Final = ("dcb_append", "dcb_read")
_TICKS: Final = os.sysconf("SC_CLK_TCK")
_LINE: Final = re.compile(r":[0-9]+\)$")


def _user_system_seconds(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


async def profile(
    workload: str, durability: str, out: Path, source: Path | None, native: bool = False
) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    name = f"{workload}-{durability}"
    folded = out / f"{name}.folded"
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        system = await _start(workload, durability, Path(tmp), source)
        async with systems.running(system):
            client = await workloads.connect(system)  # credentials checked before sampling
            await client.close()
            spy = await asyncio.create_subprocess_exec(
                py_spy, "record", "--pid", str(system.process.pid), "--rate", "1000",
                "--gil", "--threads", "--format", "raw", "--output", str(folded),
                # native frames need the server paused at each sample
                *(["--native"] if native else ["--nonblocking"]),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.0)  # py-spy attaches (not synchronisation of the server)
            user0, sys0 = _user_system_seconds(system.process.pid)
            started = time.perf_counter()
            rate = await WORKLOADS[workload](system, CALLS[workload])
            elapsed = time.perf_counter() - started
            user1, sys1 = _user_system_seconds(system.process.pid)
            spy.send_signal(signal.SIGINT)
            await spy.wait()
    user, system_time = ((b - a) / CALLS[workload] * 1e6 for a, b in ((user0, user1), (sys0, sys1)))
    lines = [
        f"{name}: {rate:,.0f} calls/s over {elapsed:.1f} s; server CPU per call "
        f"{user:.1f} µs user + {system_time:.1f} µs system",
        "",
        *summary(folded),
    ]
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:1]), flush=True)


async def _start(workload: str, durability: str, tmp: Path, source: Path | None) -> systems.System:
    if workload in DCB:
        db = tmp / "futoin-evt.sqlite"
        await asyncio.to_thread(dcb.prepare_futoin_evt_log, db, DCB_LOG)
        return await dcb.start_futoin_evt_server(db, source)
    prefill = CALLS[workload] if workload in READS else 0
    return await systems.start_futoin_evt(
        tmp, durability=durability, source=source, prefill=prefill
    )


def summary(folded: Path, top: int = 40) -> list[str]:
    """The functions with the most samples: on their own (self) and with their callees."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        # the first frame is the thread; a frame is "function (file:line)": per function
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")[1:]]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return ["no samples"]
    out = [f"{total} samples (the thread holding the GIL)", "", "self %  function"]
    out += [f"{n / total * 100:6.1f}  {f}" for f, n in own.most_common(top)]
    out += ["", "total %  function (with what it calls)"]
    out += [f"{n / total * 100:6.1f}  {f}" for f, n in inclusive.most_common(top)]
    return out


async def main_async(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    for durability in args.durability:
        for workload in args.workload:
            if workload in DCB and durability != "full":
                continue  # bench.dcb's server runs at full only
            await profile(workload, durability, args.out, args.source, args.native)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--durability", nargs="+", default=["full", "normal"])
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--source", type=Path, help="the source tree of the server to profile")
    parser.add_argument(
        "--native",
        action="store_true",
        help="native frames too: the compiled build's functions (mypyc) are C functions, "
        "which py-spy shows only so (it pauses the server at each sample: slower)",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
