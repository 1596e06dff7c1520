"""Kafka's classic consumer groups: joins, rebalances, assignments, expiry, static members,
limits, as Kafka's own clients rely on them. Small timeouts, and every wait is on an answer
or on the coordinator's change notification (never a pause)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from futoin_evt.kafka import groups as g
from futoin_evt.kafka.coordinator import GroupCoordinator
from futoin_evt.kafka.groups import (
    Group,
    GroupLimits,
    JoinReply,
    JoinResult,
    SyncReply,
)

GROUP = "billing"
PROTOCOLS = [("range", b"range-metadata"), ("roundrobin", b"rr-metadata")]
#: Long enough not to expire during a test (the tests that expire a member give it less).
SESSION_MS = 30_000
#: Bound of every wait on something the coordinator signals.
WITHIN_SECONDS = 10.0


def coordinator(**limits: Any) -> GroupCoordinator:
    return GroupCoordinator(**({"min_session_ms": 1} | limits))


async def join(
    coordinator: GroupCoordinator,
    member_id: str = "",
    *,
    group: str = GROUP,
    instance_id: str | None = None,
    client_id: str = "consumer",
    protocols: list[tuple[str, bytes]] = PROTOCOLS,
    protocol_type: str = "consumer",
    session_ms: int = SESSION_MS,
    rebalance_ms: int = SESSION_MS,
    v4: bool = False,
) -> JoinResult:
    return await coordinator.join(
        group,
        member_id,
        instance_id,
        client_id,
        "/127.0.0.1",
        session_ms,
        rebalance_ms,
        protocol_type,
        protocols,
        require_known_member_id=v4,
    )


async def until(coordinator: GroupCoordinator, condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds, checked after each change of a group."""
    async with asyncio.timeout(WITHIN_SECONDS):
        while not condition():
            await coordinator.changed()


T = TypeVar("T")


async def taken(coordinator: GroupCoordinator, call: Awaitable[T]) -> asyncio.Task[T]:
    """The task of a JoinGroup or SyncGroup ``call``, once the coordinator took it."""
    change = coordinator.changed()
    task = asyncio.ensure_future(call)
    async with asyncio.timeout(WITHIN_SECONDS):
        await change
    return task


def state(coordinator: GroupCoordinator, group: str = GROUP) -> str:
    return coordinator.describe(group).state


async def stable_pair(
    coordinator: GroupCoordinator, **second: Any
) -> tuple[JoinResult, JoinResult]:
    """Two members in a Stable group, the leader first; each has its assignment."""
    first = await join(coordinator, client_id="first")
    joining = asyncio.create_task(join(coordinator, client_id="second", **second))
    await until(coordinator, lambda: state(coordinator) == "PreparingRebalance")
    assert coordinator.heartbeat(GROUP, first.generation, first.member_id, None) == (
        g.REBALANCE_IN_PROGRESS
    )
    leader, other = await asyncio.gather(join(coordinator, first.member_id), joining)
    follower_sync = await taken(
        coordinator, coordinator.sync(GROUP, other.generation, other.member_id, None, {})
    )
    assignments = {leader.member_id: b"partitions 0-3", other.member_id: b"partitions 4-7"}
    assert await coordinator.sync(
        GROUP, leader.generation, leader.member_id, None, assignments
    ) == (g.NONE, b"partitions 0-3")
    assert await follower_sync == (g.NONE, b"partitions 4-7")
    return leader, other


async def test_members_starting_together_share_one_generation() -> None:
    groups = coordinator(initial_delay_ms=20)
    first, second = await asyncio.gather(
        join(groups, client_id="one"), join(groups, client_id="two")
    )
    assert first.error == second.error == g.NONE
    assert first.generation == second.generation == 1
    assert first.leader == second.leader == first.member_id
    assert first.member_id.startswith("one-")
    assert second.member_id.startswith("two-")
    assert (first.protocol_type, first.protocol) == ("consumer", "range")
    assert first.members == [
        (first.member_id, None, b"range-metadata"),
        (second.member_id, None, b"range-metadata"),
    ]
    assert second.members == []  # only the leader assigns
    await groups.close()


async def test_sync_hands_each_member_its_own_assignment() -> None:
    groups = coordinator(initial_delay_ms=20)
    leader, follower = await asyncio.gather(join(groups), join(groups))
    waiting = await taken(
        groups, groups.sync(GROUP, follower.generation, follower.member_id, None, {})
    )
    assert not waiting.done()  # until the leader sends the assignments
    # the leader leaves the follower out: it gets an empty assignment
    own = await groups.sync(
        GROUP, leader.generation, leader.member_id, None, {leader.member_id: b"all"}
    )
    assert own == (g.NONE, b"all")
    assert await waiting == (g.NONE, b"")
    # a member that syncs again in the Stable group gets its assignment at once
    assert await groups.sync(GROUP, leader.generation, leader.member_id, None, {}) == (
        g.NONE,
        b"all",
    )
    description = groups.describe(GROUP)
    assert (description.state, description.protocol_type, description.protocol) == (
        "Stable",
        "consumer",
        "range",
    )
    assert [(m.member_id, m.client_id, m.client_host, m.metadata, m.assignment) for m in
            description.members] == [
        (leader.member_id, "consumer", "/127.0.0.1", b"range-metadata", b"all"),
        (follower.member_id, "consumer", "/127.0.0.1", b"range-metadata", b""),
    ]  # fmt: skip
    assert groups.list_groups() == [(GROUP, "consumer")]
    await groups.close()


async def test_a_new_member_makes_the_others_rejoin_in_a_new_generation() -> None:
    groups = coordinator()
    leader, follower = await stable_pair(groups)
    assert groups.heartbeat(GROUP, leader.generation, leader.member_id, None) == g.NONE
    third = asyncio.create_task(join(groups, client_id="third"))
    await until(groups, lambda: state(groups) == "PreparingRebalance")
    for member in (leader, follower):
        assert groups.heartbeat(GROUP, member.generation, member.member_id, None) == (
            g.REBALANCE_IN_PROGRESS
        )
    # a SyncGroup of the old generation is told to rejoin too
    assert await groups.sync(GROUP, leader.generation, leader.member_id, None, {}) == (
        g.REBALANCE_IN_PROGRESS,
        b"",
    )
    results = await asyncio.gather(
        join(groups, leader.member_id), join(groups, follower.member_id), third
    )
    assert {r.generation for r in results} == {leader.generation + 1}
    assert {r.leader for r in results} == {leader.member_id}
    assert [len(r.members) for r in results] == [3, 0, 0]
    await groups.close()


async def test_a_member_that_leaves_makes_the_others_rejoin() -> None:
    groups = coordinator()
    leader, follower = await stable_pair(groups)
    assert groups.leave(GROUP, [(leader.member_id, None)]) == (g.NONE, [g.NONE])
    assert state(groups) == "PreparingRebalance"
    assert groups.heartbeat(GROUP, follower.generation, follower.member_id, None) == (
        g.REBALANCE_IN_PROGRESS
    )
    alone = await join(groups, follower.member_id)
    assert (alone.generation, alone.leader) == (follower.generation + 1, follower.member_id)
    assert [m[0] for m in alone.members] == [follower.member_id]  # the new leader assigns
    assert groups.heartbeat(GROUP, alone.generation, leader.member_id, None) == (
        g.UNKNOWN_MEMBER_ID
    )
    assert groups.leave(GROUP, [(leader.member_id, None)]) == (g.NONE, [g.UNKNOWN_MEMBER_ID])
    await groups.close()


async def test_the_last_member_leaving_forgets_the_group() -> None:
    groups = coordinator(max_groups=1)
    member = await join(groups)
    assert groups.leave(GROUP, [(member.member_id, None)]) == (g.NONE, [g.NONE])
    assert groups.list_groups() == []
    assert groups.describe(GROUP).state == "Dead"
    assert (await join(groups, group="another")).error == g.NONE  # its place is free
    await groups.close()


async def test_a_member_silent_past_its_session_timeout_is_removed() -> None:
    groups = coordinator()
    leader, silent = await stable_pair(groups, session_ms=30)
    await until(groups, lambda: len(groups.describe(GROUP).members) == 1)
    assert groups.heartbeat(GROUP, leader.generation, leader.member_id, None) == (
        g.REBALANCE_IN_PROGRESS
    )
    alone = await join(groups, leader.member_id)
    assert (alone.generation, [m[0] for m in alone.members]) == (
        leader.generation + 1,
        [leader.member_id],
    )
    assert groups.heartbeat(GROUP, silent.generation, silent.member_id, None) == (
        g.UNKNOWN_MEMBER_ID
    )
    await groups.close()


async def test_a_rebalance_completes_without_a_member_that_does_not_rejoin() -> None:
    groups = coordinator()
    leader, _absent = await stable_pair(groups, rebalance_ms=20)
    # the rebalance waits at most the longest rebalance timeout of the members
    leader = await join(groups, leader.member_id, rebalance_ms=30)
    assert (leader.generation, [m[0] for m in leader.members]) == (3, [leader.member_id])
    await groups.close()


async def test_v4_join_without_member_id_is_given_one_to_rejoin_with() -> None:
    groups = coordinator()
    first = await join(groups, client_id="rdkafka", v4=True)
    assert first.error == g.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("rdkafka-")
    assert state(groups) == "Empty"
    second = await join(groups, first.member_id, v4=True)
    assert (second.error, second.member_id, second.generation) == (g.NONE, first.member_id, 1)
    unused = await join(groups, v4=True)
    assert groups.leave(GROUP, [(unused.member_id, None)]) == (g.NONE, [g.NONE])
    assert (await join(groups, unused.member_id, v4=True)).error == g.UNKNOWN_MEMBER_ID
    # an id this group never gave is refused; v0-v3 are given an id at once
    assert (await join(groups, "made-up", v4=True)).error == g.UNKNOWN_MEMBER_ID
    assert (await join(groups, group="old-client")).error == g.NONE
    await groups.close()


async def test_a_member_id_never_used_expires() -> None:
    groups = coordinator()
    given = await join(groups, v4=True, session_ms=20)
    assert given.error == g.MEMBER_ID_REQUIRED
    await until(groups, lambda: groups.list_groups() == [])
    assert (await join(groups, given.member_id, v4=True)).error == g.UNKNOWN_MEMBER_ID
    await groups.close()


async def test_a_static_member_restarting_replaces_itself_without_a_rebalance() -> None:
    groups = coordinator()
    leader, old = await stable_pair(groups, instance_id="host-2")
    restarted = await join(groups, instance_id="host-2", client_id="second")
    assert restarted.error == g.NONE
    assert restarted.member_id not in (old.member_id, "")
    assert (restarted.generation, restarted.leader) == (old.generation, leader.member_id)
    assert state(groups) == "Stable"
    assert groups.heartbeat(GROUP, leader.generation, leader.member_id, None) == g.NONE
    # the old member id is fenced; the new one has the old one's assignment
    assert groups.heartbeat(GROUP, old.generation, old.member_id, "host-2") == (
        g.FENCED_INSTANCE_ID
    )
    assert await groups.sync(GROUP, old.generation, old.member_id, "host-2", {}) == (
        g.FENCED_INSTANCE_ID,
        b"",
    )
    assert await groups.sync(GROUP, old.generation, restarted.member_id, "host-2", {}) == (
        g.NONE,
        b"partitions 4-7",
    )
    assert (await join(groups, old.member_id, instance_id="host-2")).error == (g.FENCED_INSTANCE_ID)
    assert groups.leave(GROUP, [(old.member_id, "host-2")]) == (g.NONE, [g.FENCED_INSTANCE_ID])
    assert groups.leave(GROUP, [("", "host-2"), ("", "host-9")]) == (
        g.NONE,
        [g.NONE, g.UNKNOWN_MEMBER_ID],
    )
    assert state(groups) == "PreparingRebalance"
    await groups.close()


async def test_a_static_member_restarting_during_a_rebalance_joins_it() -> None:
    groups = coordinator()
    leader, old = await stable_pair(groups, instance_id="host-2")
    third = await taken(groups, join(groups, client_id="third"))
    restarted = await taken(groups, join(groups, instance_id="host-2"))
    assert groups.heartbeat(GROUP, old.generation, old.member_id, "host-2") == (
        g.FENCED_INSTANCE_ID
    )
    assert not restarted.done()  # it waits for the rebalance like the others
    results = await asyncio.gather(join(groups, leader.member_id), restarted, third)
    assert {r.generation for r in results} == {old.generation + 1}
    assert [m[:2] for m in results[0].members] == [
        (leader.member_id, None),
        (results[1].member_id, "host-2"),
        (results[2].member_id, None),
    ]
    await groups.close()


async def test_a_static_member_missing_a_rebalance_keeps_its_place() -> None:
    groups = coordinator()
    static = await join(groups, instance_id="host-1", rebalance_ms=20)
    await groups.sync(GROUP, static.generation, static.member_id, "host-1", {})
    dynamic = await join(groups, rebalance_ms=20)
    # host-1 does not rejoin: the rebalance times out and keeps it; the new leader assigns it
    assert (dynamic.generation, dynamic.leader) == (2, dynamic.member_id)
    assert [m[:2] for m in dynamic.members] == [
        (static.member_id, "host-1"),
        (dynamic.member_id, None),
    ]
    await groups.close()


def test_static_members_that_never_return_leave_with_their_sessions() -> None:
    group = Group(GROUP, GroupLimits())
    for instance in ("host-1", "host-2"):
        group.join(
            0.0,
            member_id="",
            new_member_id=instance + "-id",
            instance_id=instance,
            client_id="c",
            client_host="h",
            session_timeout=10.0,
            rebalance_timeout=1.0,
            protocol_type="consumer",
            protocols=PROTOCOLS,
            require_known_member_id=False,
        )
    # host-1 had generation 1 alone, and does not rejoin for generation 2 in time: it is
    # kept, as a static member, and its session runs from then
    group.expire(1.0)
    assert (group.state, group.generation, list(group.members)) == (
        g.GroupState.COMPLETING_REBALANCE,
        2,
        ["host-1-id", "host-2-id"],
    )
    group.leave(2.0, [("", "host-2")])
    group.expire(3.0)  # nobody rejoined: the rebalance waits on
    assert (group.state, list(group.members)) == (
        g.GroupState.PREPARING_REBALANCE,
        ["host-1-id"],
    )
    assert group.next_deadline() == 4.0
    group.expire(11.0)  # the session of host-1 ends (10 s after generation 2 began)
    assert (group.state, group.members, group.generation) == (g.GroupState.EMPTY, {}, 3)
    assert group.forgettable


async def test_a_group_with_committed_offsets_is_kept_empty_until_its_place_is_needed() -> None:
    groups = coordinator(max_groups=1, has_committed_state=lambda group: True)
    member = await join(groups)
    assert groups.leave(GROUP, [(member.member_id, None)]) == (g.NONE, [g.NONE])
    assert groups.list_groups() == [(GROUP, "consumer")]
    assert state(groups) == "Empty"
    assert groups.generation_of(GROUP, "", -1) == g.NONE
    assert groups.generation_of(GROUP, member.member_id, 1) == g.UNKNOWN_MEMBER_ID
    assert (await join(groups, group="another")).error == g.NONE
    assert groups.list_groups() == [("another", "consumer")]
    await groups.close()


async def test_a_join_or_sync_sent_again_answers_the_first_one() -> None:
    groups = coordinator(initial_delay_ms=20)
    leader, follower = await asyncio.gather(join(groups), join(groups))
    first = await taken(groups, groups.sync(GROUP, 1, follower.member_id, None, {}))
    second = await taken(groups, groups.sync(GROUP, 1, follower.member_id, None, {}))
    assert await first == (g.REBALANCE_IN_PROGRESS, b"")
    await groups.sync(GROUP, 1, leader.member_id, None, {follower.member_id: b"f"})
    assert await second == (g.NONE, b"f")
    first_join = await taken(groups, join(groups, leader.member_id))  # the leader rejoins
    second_join = await taken(groups, join(groups, leader.member_id))
    assert (await first_join).error == g.REBALANCE_IN_PROGRESS
    rejoined = await asyncio.gather(second_join, join(groups, follower.member_id))
    assert {r.generation for r in rejoined} == {2}
    await groups.close()


async def test_a_replaced_static_leader_is_not_told_it_leads() -> None:
    groups = coordinator()
    first = await join(groups, instance_id="host-1")
    assert await groups.sync(GROUP, 1, first.member_id, "host-1", {first.member_id: b"a"}) == (
        g.NONE,
        b"a",
    )
    again = await join(groups, instance_id="host-1")
    assert (again.generation, again.leader, again.members) == (1, first.member_id, [])
    assert groups.describe(GROUP).members[0].member_id == again.member_id
    await groups.close()


async def test_a_stale_generation_or_an_unknown_member_is_refused() -> None:
    groups = coordinator()
    leader, follower = await stable_pair(groups)
    stale = leader.generation - 1
    assert groups.heartbeat(GROUP, stale, leader.member_id, None) == g.ILLEGAL_GENERATION
    assert await groups.sync(GROUP, stale, follower.member_id, None, {}) == (
        g.ILLEGAL_GENERATION,
        b"",
    )
    assert groups.heartbeat(GROUP, leader.generation, "stranger", None) == g.UNKNOWN_MEMBER_ID
    assert await groups.sync(GROUP, leader.generation, "stranger", None, {}) == (
        g.UNKNOWN_MEMBER_ID,
        b"",
    )
    assert groups.heartbeat("no-such-group", 1, leader.member_id, None) == g.UNKNOWN_MEMBER_ID
    await groups.close()


async def test_offset_commits_are_checked_against_the_members_generation() -> None:
    groups = coordinator()
    leader, follower = await stable_pair(groups)
    assert groups.generation_of(GROUP, leader.member_id, leader.generation) == g.NONE
    assert groups.generation_of(GROUP, leader.member_id, 1) == g.ILLEGAL_GENERATION
    assert groups.generation_of(GROUP, "stranger", leader.generation) == g.UNKNOWN_MEMBER_ID
    # a group that keeps only offsets here commits without a generation
    assert groups.generation_of("offsets-only", "", -1) == g.NONE
    rejoining = asyncio.create_task(join(groups, leader.member_id))
    await until(groups, lambda: state(groups) == "PreparingRebalance")
    # the generation that is ending may still commit what it consumed
    assert groups.generation_of(GROUP, follower.member_id, follower.generation) == g.NONE
    await asyncio.gather(rejoining, join(groups, follower.member_id))
    assert groups.generation_of(GROUP, follower.member_id, follower.generation + 1) == (
        g.REBALANCE_IN_PROGRESS
    )
    await groups.close()


async def test_a_member_with_an_inconsistent_protocol_is_refused() -> None:
    groups = coordinator()
    member = await join(groups, protocols=[("range", b"")])
    other_type = await join(groups, protocol_type="connect", protocols=[("range", b"")])
    no_common = await join(groups, protocols=[("sticky", b""), ("roundrobin", b"")])
    assert other_type.error == no_common.error == g.INCONSISTENT_GROUP_PROTOCOL
    assert (await join(groups, group="new", protocols=[])).error == (g.INCONSISTENT_GROUP_PROTOCOL)
    assert state(groups) == "CompletingRebalance"
    assert groups.describe(GROUP).members[0].member_id == member.member_id
    # any protocol type is served
    assert (await join(groups, group="connect", protocol_type="connect")).protocol_type == (
        "connect"
    )
    await groups.close()


async def test_the_protocol_is_the_one_most_members_vote_for() -> None:
    limits = GroupLimits()
    group = Group(GROUP, limits)
    for number, protocols in enumerate(
        [
            [("roundrobin", b"rr"), ("range", b"r"), ("sticky", b"s")],
            [("range", b"r"), ("roundrobin", b"rr")],
            [("range", b"r"), ("roundrobin", b"rr"), ("cooperative", b"c")],
        ]
    ):
        group.join(
            0.0,
            member_id="",
            new_member_id=f"m{number}",
            instance_id=None,
            client_id="c",
            client_host="h",
            session_timeout=1.0,
            rebalance_timeout=1.0,
            protocol_type="consumer",
            protocols=protocols,
            require_known_member_id=False,
        )
    assert group.select_protocol() == "range"  # two votes to one ("sticky" is no candidate)
    group.leave(0.0, [("m2", None)])
    assert group.select_protocol() == "roundrobin"  # a tie: the oldest member's preference


async def test_limits_and_bad_requests_are_refused() -> None:
    groups = coordinator(max_groups=1, max_members=1, min_session_ms=100, max_session_ms=1000)
    assert (await join(groups, group="")).error == g.INVALID_GROUP_ID
    assert groups.heartbeat("", 1, "m", None) == g.INVALID_GROUP_ID
    assert (await join(groups, session_ms=99)).error == g.INVALID_SESSION_TIMEOUT
    assert (await join(groups, session_ms=1001)).error == g.INVALID_SESSION_TIMEOUT
    assert (await join(groups, session_ms=1000)).error == g.NONE
    assert (await join(groups, session_ms=1000)).error == g.GROUP_MAX_SIZE_REACHED
    assert (await join(groups, group="second", session_ms=1000)).error == (g.GROUP_MAX_SIZE_REACHED)
    await groups.close()


async def test_close_fails_the_waiting_requests() -> None:
    groups = coordinator()
    leader, follower = await stable_pair(groups)
    joining = asyncio.create_task(join(groups, client_id="third"))
    await until(groups, lambda: state(groups) == "PreparingRebalance")
    await groups.close()
    result = await joining
    assert result.error == g.COORDINATOR_NOT_AVAILABLE
    assert groups.heartbeat(GROUP, 2, leader.member_id, None) == g.COORDINATOR_NOT_AVAILABLE
    assert (await join(groups)).error == g.COORDINATOR_NOT_AVAILABLE

    groups = coordinator(initial_delay_ms=20)
    leader, follower = await asyncio.gather(join(groups), join(groups))
    syncing = await taken(
        groups, groups.sync(GROUP, follower.generation, follower.member_id, None, {})
    )
    assert not syncing.done()
    await groups.close()
    assert await syncing == (g.COORDINATOR_NOT_AVAILABLE, b"")


# -- random joins, leaves, heartbeats, syncs and time: the group's invariants ---------------


class GroupMachine(RuleBasedStateMachine):
    """Drives one :class:`Group` (no timers: a clock the test moves) as clients would:
    dynamic members (some joining as v4 clients do), and static ones restarting."""

    def __init__(self) -> None:
        super().__init__()
        self.group = Group(GROUP, GroupLimits(initial_delay=0.0, max_members=4))
        self.now = 0.0
        self.created = 0
        #: The generation each member was last told, and who was told it leads each one.
        self.told: dict[str, int] = {}
        self.told_to_lead: dict[int, set[str]] = {}
        #: Member ids given with MEMBER_ID_REQUIRED.
        self.given: list[str] = []
        self.waiting_joins: set[str] = set()
        self.waiting_syncs: set[str] = set()

    def answer(self, replies: list[g.Reply]) -> None:
        for reply in replies:
            if isinstance(reply, JoinReply):
                assert reply.member_id in self.waiting_joins, "one answer to each request"
                self.waiting_joins.discard(reply.member_id)
                result = reply.result
                if result.error == g.MEMBER_ID_REQUIRED:
                    self.given.append(result.member_id)
                if result.error == g.NONE:
                    self.told[reply.member_id] = result.generation
                    if result.leader == reply.member_id:
                        self.told_to_lead.setdefault(result.generation, set()).add(result.leader)
            else:
                assert isinstance(reply, SyncReply)
                assert reply.member_id in self.waiting_syncs, "one answer to each request"
                self.waiting_syncs.discard(reply.member_id)

    def send_join(
        self,
        member_id: str,
        protocols: list[str],
        *,
        instance_id: str | None = None,
        v4: bool = False,
    ) -> None:
        new_member_id = ""
        if not member_id:
            self.created += 1
            new_member_id = f"m{self.created}"
        self.waiting_joins.add(member_id or new_member_id)
        self.answer(
            self.group.join(
                self.now,
                member_id=member_id,
                new_member_id=new_member_id,
                instance_id=instance_id,
                client_id="c",
                client_host="h",
                session_timeout=3.0,
                rebalance_timeout=2.0,
                protocol_type="consumer",
                protocols=[(name, name.encode()) for name in protocols],
                require_known_member_id=v4,
            )
        )

    def member(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.group.members)))

    @rule(
        protocols=st.lists(st.sampled_from(["range", "roundrobin"]), min_size=1, unique=True),
        v4=st.booleans(),
    )
    def a_member_joins(self, protocols: list[str], v4: bool) -> None:
        self.send_join("", protocols, v4=v4)

    @precondition(lambda self: self.given)
    @rule()
    def a_member_comes_back_with_the_id_it_was_given(self) -> None:
        self.send_join(self.given.pop(0), ["range"], v4=True)

    @rule(instance=st.sampled_from(["host-1", "host-2"]))
    def a_static_member_starts(self, instance: str) -> None:
        self.send_join("", ["range", "roundrobin"], instance_id=instance)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data(), protocols=st.sampled_from([["range"], ["range", "roundrobin"]]))
    def a_member_rejoins(self, data: st.DataObject, protocols: list[str]) -> None:
        member_id = self.member(data)
        if member_id not in self.waiting_joins:
            instance_id = self.group.members[member_id].instance_id
            self.send_join(member_id, protocols, instance_id=instance_id)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def a_member_leaves(self, data: st.DataObject) -> None:
        member_id = self.member(data)
        instance_id = self.group.members[member_id].instance_id
        error, errors, replies = self.group.leave(self.now, [(member_id, instance_id)])
        assert (error, errors) == (g.NONE, [g.NONE])
        self.answer(replies)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def a_member_heartbeats(self, data: st.DataObject) -> None:
        member_id = self.member(data)
        error = self.group.heartbeat(
            self.now,
            generation=self.told.get(member_id, -1),
            member_id=member_id,
            instance_id=self.group.members[member_id].instance_id,
        )
        assert error in (g.NONE, g.REBALANCE_IN_PROGRESS, g.ILLEGAL_GENERATION)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def a_member_syncs(self, data: st.DataObject) -> None:
        member_id = self.member(data)
        if member_id in self.waiting_syncs:
            return
        self.waiting_syncs.add(member_id)
        assignments = {m: m.encode() for m in self.group.members}
        self.answer(
            self.group.sync(
                self.now,
                generation=self.told.get(member_id, -1),
                member_id=member_id,
                instance_id=self.group.members[member_id].instance_id,
                assignments=assignments,
            )
        )

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 4.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.answer(self.group.expire(self.now))

    @invariant()
    def a_settled_group_has_one_generation_and_one_leader(self) -> None:
        group = self.group
        if group.state in (g.GroupState.STABLE, g.GroupState.COMPLETING_REBALANCE):
            assert group.members
            # static members may have missed the rebalance (kept until their session ends)
            dynamic = [m.member_id for m in group.members.values() if m.instance_id is None]
            assert all(self.told.get(m) == group.generation for m in dynamic)
            assert all(m.deadline is not None for m in group.members.values())
        assert all(len(leaders) == 1 for leaders in self.told_to_lead.values())
        if group.members:
            assert group.leader in group.members
        if group.state is g.GroupState.PREPARING_REBALANCE:
            assert group.rebalance_deadline is not None
        if group.state is g.GroupState.EMPTY:
            assert not group.members
            assert group.protocol is None
        assert group.instances == {
            m.instance_id: m.member_id for m in group.members.values() if m.instance_id
        }
        assert len(group.members) + len(group.pending) <= group.limits.max_members

    @invariant()
    def every_waiting_request_is_known_to_the_group(self) -> None:
        awaiting = {m.member_id for m in self.group.members.values() if m.awaiting_join}
        assert awaiting == self.waiting_joins
        syncing = {m.member_id for m in self.group.members.values() if m.awaiting_sync}
        assert syncing == self.waiting_syncs


GroupMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
test_group_invariants = GroupMachine.TestCase


async def test_four_members_settle_in_one_generation_after_one_leaves() -> None:
    """Members that rejoin when their heartbeat says so settle in the next generation."""
    groups = coordinator(initial_delay_ms=20)
    joined = await asyncio.gather(*(join(groups, client_id=f"c{n}") for n in range(4)))
    leader = joined[0]
    assignments = {r.member_id: str(n).encode() for n, r in enumerate(joined)}
    syncs = [groups.sync(GROUP, r.generation, r.member_id, None, assignments) for r in joined]
    assert [a for _, a in await asyncio.gather(*syncs)] == [b"0", b"1", b"2", b"3"]
    assert leader.leader == leader.member_id
    assert groups.leave(GROUP, [(joined[1].member_id, None)]) == (g.NONE, [g.NONE])
    staying = [r for r in joined if r is not joined[1]]
    assert {groups.heartbeat(GROUP, r.generation, r.member_id, None) for r in staying} == {
        g.REBALANCE_IN_PROGRESS
    }
    rejoined = await asyncio.gather(*(join(groups, r.member_id) for r in staying))
    assert {r.generation for r in rejoined} == {2}
    assert len(rejoined[0].members) == 3
    await groups.close()
