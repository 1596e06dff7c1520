"""Power loss under load: ``futoin-evt serve`` on SQLite on the power-loss filesystem
(tests/faultfs), producers at full speed and two registered consumers, the power cut again
and again (at random, inside WAL checkpoints, while retention deletes), the history judged by
bench/faults/checker.py. At ``--durability full`` nothing acknowledged is lost; at ``normal``
what is lost is measured (``python -m bench.faults`` prints it), and the rest still holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults.load import POLL
from bench.faults.powerloss import Result, Schedule, run


def kinds_aimed(outcome: Result) -> dict[str, int]:
    aimed: dict[str, int] = {}
    for cut in outcome.cuts:
        aimed[cut.kind] = aimed.get(cut.kind, 0) + cut.aimed
    return aimed


@pytest.mark.usefixtures("needs_fuse")
async def test_power_loss_at_full_durability_loses_nothing_acknowledged(tmp_path: Path) -> None:
    outcome = await run(Schedule("full", cuts=51, seed=20261127), tmp_path / "run", print)
    assert outcome.failed_start is None  # the server started after every cut
    verdicts = outcome.verdicts
    assert verdicts.valid, verdicts.describe()
    assert len(outcome.cuts) == 51
    aimed = kinds_aimed(outcome)
    assert aimed["checkpoint"] >= 1, aimed
    assert aimed["retention"] >= 1, aimed
    assert verdicts.acknowledged > 51 * 20
    assert verdicts.discarded > 0  # retention ran
    # the reliable poll consumer came back after the cuts from the position it was confirmed
    sessions = {read.session for read in outcome.history.reads if read.consumer == POLL}
    assert len(sessions) > 10


@pytest.mark.usefixtures("needs_fuse")
async def test_power_loss_at_normal_durability_keeps_order_and_invents_nothing(
    tmp_path: Path,
) -> None:
    """Acknowledged events may be lost (no fsync at commit): the run measures how many and
    how much history; none is duplicated, reordered, renumbered or made up, and the server
    starts after every cut."""
    outcome = await run(Schedule("normal", cuts=6, seed=20261128), tmp_path / "run", print)
    assert outcome.failed_start is None
    verdicts = outcome.verdicts
    counts = verdicts.counts()
    assert [counts[name] for name in ("wrong_id", "duplicated", "reordered", "phantom")] == [
        0, 0, 0, 0,
    ], verdicts.describe()  # fmt: skip
    print("lost per cut (events, ms):", [(loss.events, round(loss.ms)) for loss in verdicts.losses])
