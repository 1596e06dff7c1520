"""Network faults and pauses with PostgreSQL: two ``futoin-evt serve`` processes, each in a
test host of its own (tests/nethosts), on a PostgreSQL server of the test's own reached over
the hosts' links, under load (producers on both, a registered poll consumer, a registered
push consumer with a connection to each server, an aggregated stream). A server is cut off
from the database and healed; its link is slowed (200 ms, 5% loss); it is stopped
(SIGSTOP) for longer than its aggregate lease while the push consumer moves to the other
server. The history is judged by bench/faults/checker.py: nothing acknowledged lost, nothing
reordered or made up, nothing a cut-off or paused process did after losing its claim or
lease reached a receiver, a stored position or the aggregate. ``python -m bench.faults
--net`` runs the same schedules for longer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.faults.load import CREDENTIALS
from bench.faults.netfaults import Result, Schedule, Server, prepare, run
from futoin_evt.client.aio import EventStreamClient, RemoteError
from tests.nethosts import NetHosts, Postgres
from tests.support.waiting import until

pytestmark = pytest.mark.usefixtures("needs_nethosts")


def assert_clean(outcome: Result, faults: int) -> None:
    assert outcome.failed is None, outcome.failed
    verdicts = outcome.verdicts
    assert verdicts.valid, verdicts.describe()
    assert len(outcome.faults) == faults
    assert verdicts.acknowledged > 20 * faults
    assert outcome.copies == outcome.events  # the aggregate holds every event


async def test_a_server_cut_off_from_the_database_loses_nothing_and_its_consumer_moves(
    tmp_path: Path,
) -> None:
    outcome = await run(Schedule("cut", faults=3, seed=20261127), tmp_path, print)
    assert_clean(outcome, 3)
    # the cut server's calls failed (unknown outcomes) instead of waiting for the cable
    assert outcome.verdicts.unknown > 0
    push_sessions = {claim.session for claim in outcome.history.claims}
    assert len(push_sessions) == 4  # the first connection, and one takeover per cut


async def test_a_slow_lossy_link_to_the_database_loses_nothing(tmp_path: Path) -> None:
    outcome = await run(Schedule("slow", faults=2, seed=20261128), tmp_path, print)
    assert_clean(outcome, 2)


async def test_a_paused_server_delivers_nothing_after_its_consumer_or_lease_moved(
    tmp_path: Path,
) -> None:
    outcome = await run(Schedule("pause", faults=4, seed=20261129), tmp_path, print)
    assert_clean(outcome, 4)
    assert {fault.held for fault in outcome.faults} == {"push", "lease"}
    # a pause that strikes between a push group's claim check and its write lets that one
    # group out after the takeover; its server says so, and it is never more than one
    push_pauses = sum(fault.held == "push" for fault in outcome.faults)
    assert outcome.verdicts.late_write <= push_pauses


async def test_a_cut_off_server_answers_with_an_error_then_serves_again_after_heal(
    tmp_path: Path,
) -> None:
    """Without a bound on the link (keepalives, TCP user timeout), the add waits for the
    kernel's retransmissions: 15 minutes."""
    schedule = Schedule(link_timeout=2.0)
    with NetHosts(1) as net, Postgres([net.hosts[0].gateway]) as pg:
        host = net.hosts[0]
        await prepare(pg.url(host.gateway))
        with (tmp_path / "server.log").open("w+") as log:
            server = Server(host, pg.url(host.gateway), schedule, log)
            await server.start()
            try:
                async with await EventStreamClient.connect(
                    server.url, credentials=CREDENTIALS
                ) as client:
                    assert await client.add_event("FAULT", {"t": "before"}) > 0
                    net.cut(host, pg.port)
                    async with asyncio.timeout(60):  # a bound on the test, not a measure
                        with pytest.raises(RemoteError, match="InternalError"):
                            await client.add_event("FAULT", {"t": "cut"})
                    net.heal(host)

                    async def added() -> bool:
                        try:
                            return await client.add_event("FAULT", {"t": "after"}) > 0
                        except RemoteError:
                            return False

                    await until(added, "an add through the healed server")
            finally:
                await server.stop()
