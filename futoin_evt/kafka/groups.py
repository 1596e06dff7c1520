"""Kafka's classic consumer groups: the coordinator of JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups and ListGroups, as Apache Kafka's ``GroupCoordinator`` runs them
(JoinGroup v0-v5, SyncGroup v0-v3, Heartbeat v0-v3, LeaveGroup v0-v3). Plain Python types in
and out: the door decodes a request into a call here and encodes the answer; it checks the
caller's rights on the group before it calls (nothing here knows users).

States of a group::

    Empty --join--> PreparingRebalance --all known members joined, or the rebalance
    timeout (the missing dynamic members removed)--> CompletingRebalance --the leader's
    SyncGroup--> Stable
    Stable / CompletingRebalance --a member joins, leaves, expires, or rejoins with other
    metadata (or the leader rejoins)--> PreparingRebalance
    PreparingRebalance --no member left--> Empty (forgotten unless it has committed state)
    any --close()--> Dead

Any protocol type is served; protocol metadata and assignments pass through as bytes. The
group's protocol is the one most members vote for among those every member supports (each
member votes for the first of its own list that is a candidate; a tie goes to the candidate
the oldest member prefers). Static members (``group.instance.id``) rejoining under a new
member id replace their old id without a rebalance while the group is Stable, and are kept
through a rebalance they miss (their session timeout removes them), as in Kafka.

:class:`Group` holds one group's state and makes every transition, without I/O and without
timers: each method takes the time (``now``, seconds on the coordinator's clock), keeps
deadlines as numbers (:meth:`Group.next_deadline`), and returns the answers it owes to
requests that wait (:class:`JoinReply`, :class:`SyncReply`). :class:`.coordinator.GroupCoordinator`
owns the groups in this process, the requests that wait (futures by member id) and one
asyncio timer per group that calls :meth:`Group.expire` at the next deadline.

:mod:`.shared_groups` keeps the same :class:`Group` in the database instead, so that members
connected to several ``serve`` processes (or workers) on one database form one group.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from collections.abc import Iterable
from typing import Final, NamedTuple

__all__ = [
    "Group",
    "GroupDescription",
    "GroupLimits",
    "GroupState",
    "JoinReply",
    "JoinResult",
    "MemberDescription",
    "Reply",
    "SyncReply",
]

# -- Kafka's error codes of the group APIs ---------------------------------------------------

NONE: Final = 0
COORDINATOR_NOT_AVAILABLE: Final = 15
NOT_COORDINATOR: Final = 16
ILLEGAL_GENERATION: Final = 22
INCONSISTENT_GROUP_PROTOCOL: Final = 23
INVALID_GROUP_ID: Final = 24
UNKNOWN_MEMBER_ID: Final = 25
INVALID_SESSION_TIMEOUT: Final = 26
REBALANCE_IN_PROGRESS: Final = 27
GROUP_AUTHORIZATION_FAILED: Final = 30
MEMBER_ID_REQUIRED: Final = 79
GROUP_MAX_SIZE_REACHED: Final = 81
FENCED_INSTANCE_ID: Final = 82

#: The member id of a member that has none yet (JoinGroup, LeaveGroup v3 by instance id).
UNKNOWN_MEMBER: Final = ""
#: The generation of a group that has none (answers with an error; OffsetCommit of a group
#: that does not use the coordinator).
NO_GENERATION: Final = -1


class GroupState(enum.Enum):
    """The states, with the names DescribeGroups answers."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class JoinResult(NamedTuple):
    """JoinGroup's answer. ``members`` (member id, instance id, metadata of the group's
    protocol) only for the leader; ``member_id`` is the member's own (new) id."""

    error: int
    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str
    member_id: str
    members: list[tuple[str, str | None, bytes]]


class MemberDescription(NamedTuple):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    #: The member's metadata of the group's protocol, and its assignment: empty unless Stable.
    metadata: bytes
    assignment: bytes


class GroupDescription(NamedTuple):
    """DescribeGroups' answer for one group: a group not known is ``Dead`` without members
    (error NONE, as Kafka answers)."""

    error: int
    group_id: str
    state: str
    protocol_type: str
    #: The group's protocol while Stable, else "".
    protocol: str
    members: list[MemberDescription]


class JoinReply(NamedTuple):
    """The answer owed to the JoinGroup of ``member_id`` that waits."""

    member_id: str
    result: JoinResult


class SyncReply(NamedTuple):
    """The answer owed to the SyncGroup of ``member_id`` that waits."""

    member_id: str
    error: int
    assignment: bytes


Reply = JoinReply | SyncReply


def join_error(error: int, member_id: str = UNKNOWN_MEMBER) -> JoinResult:
    return JoinResult(error, NO_GENERATION, None, None, "", member_id, [])


@dataclasses.dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout: float  # seconds
    rebalance_timeout: float  # seconds
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    #: A JoinGroup of this member waits for the rebalance to complete.
    awaiting_join: bool = False
    #: A SyncGroup of this member waits for the leader's assignments.
    awaiting_sync: bool = False
    #: When the session expires without a heartbeat; none while its JoinGroup waits (the
    #: rebalance timeout bounds that wait).
    deadline: float | None = None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        return next((data for name, data in self.protocols if name == protocol), b"")

    def vote(self, candidates: Iterable[str]) -> str:
        allowed = set(candidates)
        return next(name for name in self.protocol_names() if name in allowed)


@dataclasses.dataclass(frozen=True)
class GroupLimits:
    #: How long the first rebalance of an Empty group waits for more members (seconds).
    initial_delay: float = 0.0
    max_members: int = 1000


class Group:
    """One group's state and its transitions (no I/O, no timers): see the module's doc."""

    def __init__(self, group_id: str, limits: GroupLimits) -> None:
        self.group_id = group_id
        self.limits = limits
        self.state = GroupState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        #: The members in the order they joined (the first is the leader, unless it left).
        self.members: dict[str, Member] = {}
        #: Member ids handed out with MEMBER_ID_REQUIRED, not joined yet: their deadlines.
        self.pending: dict[str, float] = {}
        #: The member id of each static member, by its instance id.
        self.instances: dict[str, str] = {}
        #: When the running rebalance completes without the members not joined yet.
        self.rebalance_deadline: float | None = None
        #: The first rebalance of an Empty group waits ``initial_delay`` for more members, then
        #: again while more come, up to the rebalance timeout (``initial_end``).
        self.initial_end: float | None = None
        self.joined_during_delay = False

    # -- queries ---------------------------------------------------------------------------

    @property
    def forgettable(self) -> bool:
        """Empty, and nobody is about to join."""
        return self.state is GroupState.EMPTY and not self.pending

    def next_deadline(self) -> float | None:
        deadlines = [m.deadline for m in self.members.values() if m.deadline is not None]
        deadlines += self.pending.values()
        if self.rebalance_deadline is not None:
            deadlines.append(self.rebalance_deadline)
        return min(deadlines, default=None)

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """The instance id is known under another member id (replaced by a newer join)."""
        if instance_id is None:
            return False
        current = self.instances.get(instance_id)
        return current is not None and current != member_id

    def describe(self) -> GroupDescription:
        stable = self.state is GroupState.STABLE
        protocol = self.protocol or ""
        members = [
            MemberDescription(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata(protocol) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in self.members.values()
        ]
        return GroupDescription(
            NONE,
            self.group_id,
            self.state.value,
            self.protocol_type or "",
            protocol if stable else "",
            members,
        )

    def check_commit(self, member_id: str, generation: int, instance_id: str | None) -> int:
        """The error of an OffsetCommit by ``member_id`` in ``generation`` (Kafka's checks)."""
        if self.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation < 0 and self.state is GroupState.EMPTY:
            return NONE  # the group keeps only its offsets here
        if self.fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        if self.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        return NONE  # Stable, or PreparingRebalance: the generation's last commits

    def select_protocol(self) -> str:
        """The protocol most members vote for among those all support (ties: the oldest
        member's preference)."""
        members = list(self.members.values())
        supported = set(members[0].protocol_names())
        for member in members[1:]:
            supported &= set(member.protocol_names())
        candidates = [name for name in members[0].protocol_names() if name in supported]
        votes = Counter(member.vote(candidates) for member in members)
        return max(candidates, key=lambda name: votes[name])  # max keeps the first of equals

    def _supports(self, member_id: str, protocol_type: str, protocols: list[str]) -> bool:
        """Whether a member (known under ``member_id``, or new) with these protocols fits with
        the other members."""
        others = [m for m in self.members.values() if m.member_id != member_id]
        if not others:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        # each member's names once, as a set: a join costs the sum of their counts, never a
        # product (a member with thousands of protocols must not stall the server)
        common = set(protocols)
        for member in others:
            common.intersection_update(member.protocol_names())
            if not common:
                return False
        return True

    # -- transitions -----------------------------------------------------------------------

    def join(
        self,
        now: float,
        *,
        member_id: str,
        new_member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout: float,
        rebalance_timeout: float,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> list[Reply]:
        """A JoinGroup. The answer to the joining member (under ``member_id``, or
        ``new_member_id`` when that is empty) is among the replies, or comes with a later
        transition."""
        replies: list[Reply] = []
        names = [name for name, _ in protocols]
        own = member_id or new_member_id
        if self.state is GroupState.DEAD:
            return [JoinReply(own, join_error(COORDINATOR_NOT_AVAILABLE, member_id))]
        replaced = self.instances.get(instance_id or "") if member_id == UNKNOWN_MEMBER else None
        if not self._supports(replaced or member_id, protocol_type, names):
            return [JoinReply(own, join_error(INCONSISTENT_GROUP_PROTOCOL, member_id))]
        settings = (client_id, client_host, session_timeout, rebalance_timeout, protocol_type)
        if member_id == UNKNOWN_MEMBER:
            if instance_id is not None and instance_id in self.instances:
                return self._replace_static(now, new_member_id, instance_id, settings, protocols)
            if len(self.members) + len(self.pending) >= self.limits.max_members:
                return [JoinReply(own, join_error(GROUP_MAX_SIZE_REACHED))]
            if instance_id is None and require_known_member_id:
                self.pending[new_member_id] = now + session_timeout
                return [JoinReply(own, join_error(MEMBER_ID_REQUIRED, new_member_id))]
            self._add(
                now, Member(new_member_id, instance_id, *settings, protocols=protocols), replies
            )
            return replies
        if member_id in self.pending:
            if instance_id is not None:  # a static member needs no id from a first round
                return [JoinReply(own, join_error(UNKNOWN_MEMBER_ID, member_id))]
            del self.pending[member_id]
            self._add(now, Member(member_id, None, *settings, protocols=protocols), replies)
            return replies
        if self.fenced(member_id, instance_id):
            return [JoinReply(own, join_error(FENCED_INSTANCE_ID, member_id))]
        member = self.members.get(member_id)
        if member is None or self.state is GroupState.EMPTY:
            return [JoinReply(own, join_error(UNKNOWN_MEMBER_ID, member_id))]
        unchanged = member.protocols == protocols
        self._update(member, settings, protocols)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._await_join(member)
            self._try_complete_join(now, replies)
        elif unchanged and (
            self.state is GroupState.COMPLETING_REBALANCE or member_id != self.leader
        ):
            # it missed the answer of this generation (or a follower asks again): no rebalance
            self._touch(now, member)
            replies.append(JoinReply(member_id, self._join_result(member)))
        else:
            self._await_join(member)
            self._prepare_rebalance(now, replies)
        return replies

    def sync(
        self,
        now: float,
        *,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> list[Reply]:
        """A SyncGroup: the member's answer is among the replies, or comes with the leader's
        SyncGroup (or the next rebalance)."""
        if self.state is GroupState.DEAD:
            return [SyncReply(member_id, COORDINATOR_NOT_AVAILABLE, b"")]
        error = self._check_member(member_id, generation, instance_id)
        if error == NONE and self.state is GroupState.PREPARING_REBALANCE:
            error = REBALANCE_IN_PROGRESS
        if error != NONE:
            return [SyncReply(member_id, error, b"")]
        member = self.members[member_id]
        self._touch(now, member)
        if self.state is GroupState.STABLE:
            return [SyncReply(member_id, NONE, member.assignment)]
        member.awaiting_sync = True  # CompletingRebalance
        if member_id != self.leader:
            return []
        for each in self.members.values():
            each.assignment = assignments.get(each.member_id, b"")
        self.state = GroupState.STABLE
        replies: list[Reply] = []
        for each in self.members.values():
            if each.awaiting_sync:
                each.awaiting_sync = False
                replies.append(SyncReply(each.member_id, NONE, each.assignment))
        return replies

    def heartbeat(
        self, now: float, *, generation: int, member_id: str, instance_id: str | None
    ) -> int:
        if self.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        error = self._check_member(member_id, generation, instance_id)
        if error != NONE:
            return error
        self._touch(now, self.members[member_id])
        if self.state is GroupState.PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave(
        self, now: float, leaving: list[tuple[str, str | None]]
    ) -> tuple[int, list[int], list[Reply]]:
        """A LeaveGroup of (member id, instance id) pairs: the group's error, each member's,
        and the replies owed to waiting requests."""
        replies: list[Reply] = []
        if self.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE, [COORDINATOR_NOT_AVAILABLE] * len(leaving), []
        errors: list[int] = []
        for member_id, instance_id in leaving:
            if instance_id is not None:
                current = self.instances.get(instance_id)
                if current is None:
                    errors.append(UNKNOWN_MEMBER_ID)
                elif member_id not in (UNKNOWN_MEMBER, current):
                    errors.append(FENCED_INSTANCE_ID)
                else:
                    self._remove(now, current, replies)
                    errors.append(NONE)
            elif member_id in self.pending:
                del self.pending[member_id]
                self._try_complete_join(now, replies)
                errors.append(NONE)
            elif member_id in self.members:
                self._remove(now, member_id, replies)
                errors.append(NONE)
            else:
                errors.append(UNKNOWN_MEMBER_ID)
        return NONE, errors, replies

    def expire(self, now: float) -> list[Reply]:
        """Act on the deadlines that passed: sessions without heartbeat, members that never
        came back with the id they were given, a rebalance's timeout."""
        replies: list[Reply] = []
        for member_id, deadline in list(self.pending.items()):
            if deadline <= now:
                del self.pending[member_id]
                self._try_complete_join(now, replies)
        for member in list(self.members.values()):
            if member.deadline is not None and member.deadline <= now:
                self._remove(now, member.member_id, replies)
        if self.rebalance_deadline is not None and self.rebalance_deadline <= now:
            if self.initial_end is not None and self.joined_during_delay and now < self.initial_end:
                self.joined_during_delay = False
                self.rebalance_deadline = min(now + self.limits.initial_delay, self.initial_end)
            else:
                self._complete_join(now, replies)
        return replies

    def close(self) -> list[Reply]:
        """The coordinator stops: every waiting request fails, the group is Dead."""
        self.state = GroupState.DEAD
        self.rebalance_deadline = None
        self.pending.clear()
        replies: list[Reply] = []
        for member in self.members.values():
            member.deadline = None
            self._fail_waiting(member, COORDINATOR_NOT_AVAILABLE, replies)
        return replies

    # -- steps -----------------------------------------------------------------------------

    def _check_member(self, member_id: str, generation: int, instance_id: str | None) -> int:
        """The error of a SyncGroup or Heartbeat by ``member_id`` in ``generation``."""
        if self.fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        if member_id not in self.members or self.state is GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        return NONE

    def _touch(self, now: float, member: Member) -> None:
        if not member.awaiting_join:
            member.deadline = now + member.session_timeout

    def _await_join(self, member: Member) -> None:
        member.awaiting_join = True
        member.deadline = None

    def _update(
        self,
        member: Member,
        settings: tuple[str, str, float, float, str],
        protocols: list[tuple[str, bytes]],
    ) -> None:
        (
            member.client_id,
            member.client_host,
            member.session_timeout,
            member.rebalance_timeout,
            member.protocol_type,
        ) = settings
        member.protocols = protocols
        if list(self.members) == [member.member_id]:
            self.protocol_type = member.protocol_type

    def _add(self, now: float, member: Member, replies: list[Reply]) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.instances[member.instance_id] = member.member_id
        if self.leader is None:
            self.leader = member.member_id
        self._await_join(member)
        if self.initial_end is not None:
            self.joined_during_delay = True
        if self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now, replies)
        else:
            self._prepare_rebalance(now, replies)

    def _replace_static(
        self,
        now: float,
        new_member_id: str,
        instance_id: str,
        settings: tuple[str, str, float, float, str],
        protocols: list[tuple[str, bytes]],
    ) -> list[Reply]:
        """A known instance joins under a new member id: the old id is fenced."""
        replies: list[Reply] = []
        old_id = self.instances[instance_id]
        old = self.members[old_id]
        waited = old.awaiting_join
        self._fail_waiting(old, FENCED_INSTANCE_ID, replies)
        leader = self.leader
        member = dataclasses.replace(old, member_id=new_member_id, awaiting_join=waited)
        self.members = {  # in its place: the order of the members elects leaders
            member.member_id if key == old_id else key: member if key == old_id else each
            for key, each in self.members.items()
        }
        self.instances[instance_id] = new_member_id
        self._update(member, settings, protocols)
        if self.leader == old_id:
            self.leader = new_member_id
        if self.state is GroupState.STABLE and self.select_protocol() == self.protocol:
            # the old leader id is answered, so that a replaced leader does not assign again
            # (its assignments would not reach a Stable group's members)
            self._touch(now, member)
            result = self._join_result(member)._replace(leader=leader or "", members=[])
            replies.append(JoinReply(new_member_id, result))
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._await_join(member)
            self._try_complete_join(now, replies)
        else:
            self._await_join(member)
            self._prepare_rebalance(now, replies)
        return replies

    def _remove(self, now: float, member_id: str, replies: list[Reply]) -> None:
        member = self.members.pop(member_id)
        if member.instance_id is not None and self.instances.get(member.instance_id) == member_id:
            del self.instances[member.instance_id]
        self._fail_waiting(member, UNKNOWN_MEMBER_ID, replies)
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now, replies)
        else:
            self._try_complete_join(now, replies)

    def _fail_waiting(self, member: Member, error: int, replies: list[Reply]) -> None:
        if member.awaiting_join:
            member.awaiting_join = False
            replies.append(JoinReply(member.member_id, join_error(error, member.member_id)))
        if member.awaiting_sync:
            member.awaiting_sync = False
            replies.append(SyncReply(member.member_id, error, b""))

    def _prepare_rebalance(self, now: float, replies: list[Reply]) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            for member in self.members.values():
                member.assignment = b""
                if member.awaiting_sync:
                    member.awaiting_sync = False
                    replies.append(SyncReply(member.member_id, REBALANCE_IN_PROGRESS, b""))
        timeout = max((m.rebalance_timeout for m in self.members.values()), default=0.0)
        if self.state is GroupState.EMPTY and self.limits.initial_delay > 0:
            self.initial_end = now + timeout
            self.joined_during_delay = False
            self.rebalance_deadline = now + min(self.limits.initial_delay, timeout)
        else:
            self.rebalance_deadline = now + timeout
        self.state = GroupState.PREPARING_REBALANCE
        self._try_complete_join(now, replies)

    def _try_complete_join(self, now: float, replies: list[Reply]) -> None:
        """Complete the rebalance once every known member joined (the initial delay runs
        its course)."""
        if self.state is not GroupState.PREPARING_REBALANCE or self.initial_end is not None:
            return
        if not self.pending and all(m.awaiting_join for m in self.members.values()):
            self._complete_join(now, replies)

    def _complete_join(self, now: float, replies: list[Reply]) -> None:
        self.initial_end = None
        self.joined_during_delay = False
        for member in list(self.members.values()):
            if not member.awaiting_join and member.instance_id is None:
                del self.members[member.member_id]
        joined = [m.member_id for m in self.members.values() if m.awaiting_join]
        if self.leader not in joined:
            self.leader = joined[0] if joined else next(iter(self.members), None)
        if not self.members:
            self.generation += 1
            self.protocol = None
            self.rebalance_deadline = None
            self.state = GroupState.EMPTY
            return
        if not joined:
            # only static members that did not come back: wait again, until their sessions
            # remove them
            timeout = max(m.rebalance_timeout for m in self.members.values())
            self.rebalance_deadline = now + timeout
            return
        self.generation += 1
        self.protocol = self.select_protocol()
        self.rebalance_deadline = None
        self.state = GroupState.COMPLETING_REBALANCE
        for member in self.members.values():
            if member.awaiting_join:
                member.awaiting_join = False
                replies.append(JoinReply(member.member_id, self._join_result(member)))
            member.deadline = now + member.session_timeout

    def _join_result(self, member: Member) -> JoinResult:
        protocol = self.protocol or ""
        members = (
            [(m.member_id, m.instance_id, m.metadata(protocol)) for m in self.members.values()]
            if member.member_id == self.leader
            else []
        )
        return JoinResult(
            NONE,
            self.generation,
            self.protocol_type,
            self.protocol,
            self.leader or "",
            member.member_id,
            members,
        )
