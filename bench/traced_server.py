"""``python -m bench.traced_server DIR FUTOIN-EVT-ARGS...``: ``futoin-evt`` with tracemalloc
on (10 frames). Each SIGUSR1 collects garbage, then writes a snapshot to
``DIR/snapshot-N.tracemalloc`` (N from 1) for :func:`growth` to compare; ``python -m
bench.soak --tracemalloc DIR`` uses it."""

from __future__ import annotations

import gc
import itertools
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def main() -> None:
    out = Path(sys.argv[1])
    numbers = itertools.count(1)

    def dump(_signum: int, _frame: FrameType | None) -> None:
        path = out / f"snapshot-{next(numbers)}.tracemalloc"
        gc.collect()  # what is still referenced, not garbage that waits for a full collection
        tracemalloc.take_snapshot().dump(f"{path}.part")
        Path(f"{path}.part").rename(path)  # whole once it has its name

    tracemalloc.start(10)
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["futoin-evt", *sys.argv[2:]]
    runpy.run_module("futoin_evt", run_name="__main__")


def growth(before: Path, after: Path, top: int = 15) -> list[str]:
    """The ``top`` tracebacks whose memory grew most from ``before`` to ``after``."""
    ignored = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(ignored)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(ignored)
    total = [sum(stat.size for stat in snap.statistics("filename")) for snap in (old, new)]
    lines = [f"traced in all: {total[0] / 1024:.1f} KiB -> {total[1] / 1024:.1f} KiB"]
    grown = sorted(new.compare_to(old, "traceback"), key=lambda s: s.size_diff, reverse=True)
    for stat in grown[:top]:
        lines.append(
            f"{stat.size_diff / 1024:+.1f} KiB ({stat.count_diff:+d} blocks),"
            f" now {stat.size / 1024:.1f} KiB"
        )
        lines.extend(f"    {frame}" for frame in reversed(list(stat.traceback)[-6:]))
    return lines


if __name__ == "__main__":
    main()
