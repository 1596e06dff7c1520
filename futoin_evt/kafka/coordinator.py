"""The consumer groups of this process (:class:`GroupCoordinator`): the :class:`~.groups.Group`
state machines, the JoinGroup and SyncGroup requests that wait for a rebalance (futures by
member id) and one asyncio timer per group that expires members at its next deadline."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from .groups import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER,
    UNKNOWN_MEMBER_ID,
    Group,
    GroupDescription,
    GroupLimits,
    GroupState,
    JoinReply,
    JoinResult,
    Reply,
    join_error,
)

__all__ = ["GroupCoordinator"]


class GroupCoordinator:
    """The groups of this process: waiting JoinGroup and SyncGroup requests, and the timers.

    ``clock``: the time in seconds on which deadlines are kept (the running loop's ``time``
    when not given; timers wait the difference to it). Session timeouts outside
    ``min_session_ms``..``max_session_ms`` are refused. At most ``max_groups`` groups and
    ``max_members`` members (joined or about to) a group: GROUP_MAX_SIZE_REACHED beyond.
    ``has_committed_state(group)`` (when given) keeps a group that became Empty, as Kafka
    keeps a group with offsets; an Empty group still gives way to a new group when the
    limit is reached. Otherwise an Empty group is forgotten."""

    def __init__(
        self,
        *,
        initial_delay_ms: int = 0,
        min_session_ms: int = 1000,
        max_session_ms: int = 3_600_000,
        max_groups: int = 10_000,
        max_members: int = 1000,
        clock: Callable[[], float] | None = None,
        has_committed_state: Callable[[str], bool] | None = None,
    ) -> None:
        self._limits = GroupLimits(initial_delay_ms / 1000, max_members)
        self._min_session_ms = min_session_ms
        self._max_session_ms = max_session_ms
        self._max_groups = max_groups
        self._clock = clock
        self._has_committed_state = has_committed_state
        self._groups: dict[str, Group] = {}
        self._joins: dict[tuple[str, str], asyncio.Future[JoinResult]] = {}
        self._syncs: dict[tuple[str, str], asyncio.Future[tuple[int, bytes]]] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._changed: asyncio.Event | None = None
        self._closed = False

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    # -- the group APIs --------------------------------------------------------------------

    async def join(
        self,
        group: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        *,
        require_known_member_id: bool,
    ) -> JoinResult:
        """JoinGroup: returns once the rebalance completes (or at once with an error, with
        MEMBER_ID_REQUIRED and a new member id, or for a member that rejoins unchanged).
        ``require_known_member_id``: JoinGroup v4 or later. v0 has no rebalance timeout:
        pass the session timeout (a negative one is taken as that)."""
        if self._closed:
            return join_error(COORDINATOR_NOT_AVAILABLE, member_id)
        if not group:
            return join_error(INVALID_GROUP_ID, member_id)
        if not self._min_session_ms <= session_timeout_ms <= self._max_session_ms:
            return join_error(INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        state = self._groups.get(group)
        if state is None:
            if member_id != UNKNOWN_MEMBER:
                return join_error(UNKNOWN_MEMBER_ID, member_id)
            if not self._make_room():
                return join_error(GROUP_MAX_SIZE_REACHED)
            state = self._groups[group] = Group(group, self._limits)
        new_member_id = f"{instance_id or client_id}-{uuid.uuid4()}" if not member_id else ""
        key = (group, member_id or new_member_id)
        superseded = self._joins.pop(key, None)
        if superseded is not None and not superseded.done():
            superseded.set_result(join_error(REBALANCE_IN_PROGRESS, member_id))
        waiting: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        self._joins[key] = waiting
        replies = state.join(
            self._now(),
            member_id=member_id,
            new_member_id=new_member_id,
            instance_id=instance_id,
            client_id=client_id,
            client_host=client_host,
            session_timeout=session_timeout_ms / 1000,
            rebalance_timeout=rebalance_timeout_ms / 1000,
            protocol_type=protocol_type,
            protocols=list(protocols),
            require_known_member_id=require_known_member_id,
        )
        self._settle(state, replies)
        try:
            return await waiting
        finally:
            if self._joins.get(key) is waiting:
                del self._joins[key]

    async def sync(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[int, bytes]:
        """SyncGroup: the error and the member's assignment, once the leader sent the
        assignments (the leader's ``assignments`` by member id; the others send none)."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE, b""
        if not group:
            return INVALID_GROUP_ID, b""
        state = self._groups.get(group)
        if state is None:
            return UNKNOWN_MEMBER_ID, b""
        key = (group, member_id)
        superseded = self._syncs.pop(key, None)
        if superseded is not None and not superseded.done():
            superseded.set_result((REBALANCE_IN_PROGRESS, b""))
        waiting: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._syncs[key] = waiting
        replies = state.sync(
            self._now(),
            generation=generation,
            member_id=member_id,
            instance_id=instance_id,
            assignments=assignments,
        )
        self._settle(state, replies)
        try:
            return await waiting
        finally:
            if self._syncs.get(key) is waiting:
                del self._syncs[key]

    def heartbeat(
        self, group: str, generation: int, member_id: str, instance_id: str | None
    ) -> int:
        """Heartbeat: NONE, or REBALANCE_IN_PROGRESS (rejoin), or the member's error."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if not group:
            return INVALID_GROUP_ID
        state = self._groups.get(group)
        if state is None:
            return UNKNOWN_MEMBER_ID
        error = state.heartbeat(
            self._now(), generation=generation, member_id=member_id, instance_id=instance_id
        )
        self._arm(state)
        return error

    def leave(self, group: str, members: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """LeaveGroup of (member id, instance id) pairs (v0-v2: one pair, instance id None;
        answer the group's error, else the member's). The group's error and each member's."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE, [COORDINATOR_NOT_AVAILABLE] * len(members)
        if not group:
            return INVALID_GROUP_ID, [INVALID_GROUP_ID] * len(members)
        state = self._groups.get(group)
        if state is None:
            return NONE, [UNKNOWN_MEMBER_ID] * len(members)
        error, errors, replies = state.leave(self._now(), members)
        self._settle(state, replies)
        return error, errors

    def describe(self, group: str) -> GroupDescription:
        state = self._groups.get(group)
        if state is None:
            return GroupDescription(NONE, group, GroupState.DEAD.value, "", "", [])
        return state.describe()

    def list_groups(self) -> list[tuple[str, str]]:
        """ListGroups: (group id, protocol type) of each group known."""
        return [(g.group_id, g.protocol_type or "") for g in self._groups.values()]

    def generation_of(
        self, group: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> int:
        """The error of an OffsetCommit by ``member_id`` in ``generation``: NONE (also for a
        group unknown here with no generation: offsets kept without the coordinator),
        ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        state = self._groups.get(group)
        if state is None:
            return NONE if generation < 0 else ILLEGAL_GENERATION
        return state.check_commit(member_id, generation, instance_id)

    def changed(self) -> Awaitable[bool]:
        """Done at the next change after this call: a group's transition, a member that
        joined, left or expired, a JoinGroup or SyncGroup taken. For observers that wait on
        a group's state (await it: an unawaited coroutine warns)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed.wait()

    async def close(self) -> None:
        """Cancel the timers; fail the waiting JoinGroup and SyncGroup requests with
        COORDINATOR_NOT_AVAILABLE, and answer so every later request."""
        self._closed = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for state in self._groups.values():
            self._deliver(state.group_id, state.close())
        for join in self._joins.values():  # none should be left: failed rather than hung
            if not join.done():
                join.set_result(join_error(COORDINATOR_NOT_AVAILABLE))
        for sync in self._syncs.values():
            if not sync.done():
                sync.set_result((COORDINATOR_NOT_AVAILABLE, b""))
        self._groups.clear()
        self._notify()

    # -- the machinery ---------------------------------------------------------------------

    def _make_room(self) -> bool:
        """Whether a new group fits, after an Empty group kept for its committed state
        gave way."""
        if len(self._groups) < self._max_groups:
            return True
        empty = next((g for g in self._groups.values() if g.forgettable), None)
        if empty is None:
            return False
        self._forget(empty.group_id)
        return True

    def _settle(self, state: Group, replies: list[Reply]) -> None:
        self._deliver(state.group_id, replies)
        if state.forgettable and not (
            self._has_committed_state and self._has_committed_state(state.group_id)
        ):
            self._forget(state.group_id)
        else:
            self._arm(state)
        self._notify()

    def _deliver(self, group: str, replies: list[Reply]) -> None:
        for reply in replies:
            if isinstance(reply, JoinReply):
                join = self._joins.pop((group, reply.member_id), None)
                if join is not None and not join.done():
                    join.set_result(reply.result)
            else:
                sync = self._syncs.pop((group, reply.member_id), None)
                if sync is not None and not sync.done():
                    sync.set_result((reply.error, reply.assignment))

    def _forget(self, group: str) -> None:
        del self._groups[group]
        armed = self._timers.pop(group, None)
        if armed is not None:
            armed[1].cancel()

    def _arm(self, state: Group) -> None:
        """A timer at the group's next deadline (one that fires earlier stays: it arms the
        next when it fires)."""
        deadline = state.next_deadline()
        armed = self._timers.get(state.group_id)
        if armed is not None:
            if deadline is not None and armed[0] <= deadline:
                return
            armed[1].cancel()
            del self._timers[state.group_id]
        if deadline is None:
            return
        delay = max(0.0, deadline - self._now())
        timer = asyncio.get_running_loop().call_later(delay, self._expire, state.group_id)
        self._timers[state.group_id] = (deadline, timer)

    def _expire(self, group: str) -> None:
        del self._timers[group]
        state = self._groups.get(group)
        if state is not None:
            self._settle(state, state.expire(self._now()))

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
