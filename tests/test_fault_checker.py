"""The fault checker (bench/faults/checker.py) on hand-made histories: each verdict is
provoked once, and a clean history has none."""

from __future__ import annotations

import logging
import time
import types

import pytest

from bench.faults.checker import Ack, Add, Claim, History, Read, check
from bench.faults.netfaults import late_writes
from futoin_evt.ftn18.push import PushStream, _Group


def acked(
    token: str, event_id: int, invoked: float, completed: float, key: str | None = None
) -> Add:
    return Add(token, invoked, completed, "ok", event_id, key=key)


def clean() -> History:
    """Three acknowledged adds, one unknown that was stored and one that was not, one
    refused; a reliable consumer that read them all with its position confirmed."""
    return History(
        adds=[
            acked("a", 1, 0.0, 0.1),
            acked("b", 2, 0.2, 0.3),
            Add("u1", 0.25, None, "unknown"),
            acked("c", 4, 0.4, 0.5),
            Add("u2", 0.6, None, "unknown"),
            Add("r", 0.7, 0.8, "refused"),
        ],
        reads=[
            Read("C", 1, 1.0, ((1, "a"), (2, "b"))),
            Read("C", 1, 2.0, ((3, "u1"), (4, "c"))),
        ],
        acks=[Ack("C", 2.0, 2)],
        final={"events/0": [(1, "a"), (2, "b"), (3, "u1"), (4, "c")]},
        reliable={"C"},
        cuts=[5.0],
    )


def test_a_clean_history_has_no_anomaly() -> None:
    verdicts = check(clean())
    assert verdicts.valid, verdicts.describe()
    assert verdicts.counts() == {
        "adds": 6, "acknowledged": 3, "refused": 1, "unknown": 2, "discarded": 0,
        "lost": 0, "wrong_id": 0, "duplicated": 0, "reordered": 0, "phantom": 0,
        "skipped": 0, "delivered_twice": 0, "moved_back": 0, "after_takeover": 0,
        "copied_twice": 0, "not_copied": 0,
    }  # fmt: skip


def test_lost_is_acknowledged_and_not_in_the_final_read_with_the_history_it_spans() -> None:
    history = clean()
    history.adds.append(acked("d", 5, 3.0, 3.1))
    history.adds.append(acked("e", 6, 3.2, 3.4))
    verdicts = check(history)
    assert (verdicts.lost, verdicts.skipped) == (2, 0)
    assert [(loss.cut, loss.events, round(loss.ms)) for loss in verdicts.losses] == [(0, 2, 1900)]


def test_events_retention_discarded_after_every_reliable_consumer_read_them_are_not_lost() -> None:
    history = clean()
    history.final["events/0"] = history.final["events/0"][2:]
    history.floors["events/0"] = 2
    verdicts = check(history)
    assert (verdicts.lost, verdicts.discarded) == (0, 2)
    history.reads[0] = Read("C", 1, 1.0, ((1, "a"),))  # "b" discarded before C read it
    assert check(history).lost == 1


def test_wrong_id() -> None:
    history = clean()
    history.adds[0] = acked("a", 7, 0.0, 0.1)
    assert check(history).wrong_id == 1


@pytest.mark.parametrize("keyed", [False, True])
def test_duplicated_payload_or_key(keyed: bool) -> None:
    history = clean()
    if keyed:  # a retry of "c" under its key, as a new payload
        history.adds[3] = acked("c", 4, 0.4, 0.5, key="k")
        history.adds.append(acked("c-retry", 5, 0.9, 1.0, key="k"))
        history.final["events/0"].append((5, "c-retry"))
    else:
        history.final["events/0"].append((5, "c"))
    verdicts = check(history)
    assert verdicts.duplicated == 1, verdicts.describe()


def test_reordered_in_real_time() -> None:
    history = clean()
    history.adds[1] = acked("b", 0, 0.2, 0.3)  # acknowledged after "a" was, with a lower id
    history.final["events/0"] = [(0, "b"), (1, "a"), (3, "u1"), (4, "c")]
    history.reads[0] = Read("C", 1, 1.0, ((0, "b"), (1, "a")))
    verdicts = check(history)
    assert (verdicts.reordered, verdicts.lost) == (1, 0), verdicts.describe()


def test_reordered_within_a_consumer_session_but_not_across_sessions() -> None:
    history = clean()
    history.reads.append(Read("C", 2, 3.0, ((3, "u1"), (4, "c"))))  # a new session: allowed
    assert check(history).reordered == 0
    history.reads.append(Read("L", 1, 3.0, ((4, "c"), (3, "u1"))))
    assert check(history).reordered == 1


def test_phantom_never_added_or_refused() -> None:
    history = clean()
    history.reads.append(Read("L", 1, 3.0, ((9, "made-up"),)))
    history.final["events/0"].append((10, "r"))
    verdicts = check(history)
    assert verdicts.phantom == 2, verdicts.describe()


def test_skipped_by_a_reliable_consumer() -> None:
    history = clean()
    history.reads[1] = Read("C", 1, 2.0, ((4, "c"),))  # past 3 without it
    assert check(history).skipped == 1
    history.reliable = set()  # a LIVE consumer may miss events
    assert check(history).skipped == 0


def test_delivered_twice_past_a_confirmed_position() -> None:
    history = clean()
    history.reads.append(Read("C", 2, 3.0, ((2, "b"), (3, "u1"))))  # position 2 was confirmed
    verdicts = check(history)
    assert verdicts.delivered_twice == 1, verdicts.describe()
    history.acks = []  # nothing confirmed: a redelivery is allowed
    assert check(history).delivered_twice == 0


def test_a_confirmed_position_that_moves_back() -> None:
    history = clean()
    history.acks.append(Ack("C", 2.5, 4))
    assert check(history).moved_back == 0
    history.acks.append(Ack("C", 3.0, 3))  # a fenced-out process stored an older one
    verdicts = check(history)
    assert verdicts.moved_back == 1, verdicts.describe()


def test_a_push_connection_that_gets_events_after_it_was_taken_over() -> None:
    """Connection 1 held the consumer until connection 2's readyToReceive answered at 1.5:
    a group reaching 1 after that is an anomaly, except while 1's server was stopped (the
    kernels' buffers deliver what the process wrote before it stopped)."""
    history = clean()
    history.claims = [Claim("C", 1, 0.5), Claim("C", 2, 1.5)]
    assert check(history).after_takeover == 1  # the read at 2.0 (the one at 1.0 was before)
    history.paused[("C", 1)] = [(1.2, 2.5)]
    verdicts = check(history)
    assert (verdicts.after_takeover, verdicts.in_flight_at_pause) == (0, 1), verdicts.describe()
    history.reads.append(Read("C", 1, 2.6, ((5, "late"),)))  # after SIGCONT
    assert check(history).after_takeover == 1


def test_a_group_its_server_reported_written_late_is_counted_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pause between a push stream's check of its claim and its write lets that group out
    after the takeover: the server logs it, and the checker counts those reads apart (and
    only those: another late read of the same connection stays an anomaly)."""
    history = clean()
    history.adds += [acked("d", 5, 2.0, 2.05), acked("e", 6, 2.0, 2.05)]
    history.final["events/0"] += [(5, "d"), (6, "e")]
    history.claims = [Claim("C", 1, 0.5), Claim("C", 2, 2.06)]
    history.reads.append(Read("C", 2, 2.1, ((5, "d"), (6, "e"))))  # the new owner's
    history.acks.append(Ack("C", 2.2, 6))
    history.reads.append(Read("C", 1, 2.6, ((5, "d"),)))  # the old connection, after SIGCONT
    verdicts = check(history)
    assert (verdicts.after_takeover, verdicts.delivered_twice) == (1, 1), verdicts.describe()
    stream = types.SimpleNamespace(confirmed_at=time.monotonic() - 2.6, user_id=7, component="C")
    with caplog.at_level(logging.WARNING, logger="futoin_evt.ftn18.push"):
        PushStream._written_late(stream, _Group.of(5, 5, "[]"))  # type: ignore[arg-type]
    history.late_writes["C"] = set(late_writes(caplog.text, "C"))
    assert history.late_writes == {"C": {5}}
    verdicts = check(history)
    assert verdicts.valid, verdicts.describe()
    assert verdicts.late_write == 1
    history.reads.append(Read("C", 1, 2.7, ((6, "e"),)))  # not reported: an anomaly
    verdicts = check(history)
    assert (verdicts.after_takeover, verdicts.delivered_twice) == (1, 1), verdicts.describe()


def test_an_aggregate_holds_each_source_event_once_in_order() -> None:
    history = clean()
    copied = [(10, "a"), (11, "b"), (12, "u1"), (13, "c")]
    history.copies["all"] = (["events/0"], copied)
    assert check(history).valid
    history.copies["all"] = (["events/0"], [*copied, (14, "b")])
    assert check(history).copied_twice == 1
    history.copies["all"] = (["events/0"], [(10, "a"), (11, "u1"), (12, "b"), (13, "c")])
    assert check(history).reordered == 1
    history.copies["all"] = (["events/0"], copied[:3])
    assert check(history).not_copied == 1


def test_ids_given_out_again_after_a_cut_are_not_reordered_where_cuts_may_take_them() -> None:
    """At ``normal`` a cut takes an acknowledged event that was read (it looks discarded:
    below retention's floor, read by every consumer) and gives its id out again: the later
    add's lower id is the loss's doing, not a reorder; where ids survive cuts it is one."""
    history = clean()
    history.adds += [acked("x", 10, 1.0, 1.1), acked("y", 5, 2.0, 2.1)]
    history.reads.append(Read("C", 2, 1.2, ((10, "x"),)))
    history.cuts = [1.5]
    history.floors["events/0"] = 10
    history.final["events/0"] = [*history.final["events/0"], (5, "y")]
    assert check(history).reordered == 1
    history.ids_survive_cuts = False
    verdicts = check(history)
    assert verdicts.reordered == 0, verdicts.describe()
