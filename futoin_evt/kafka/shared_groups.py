"""Consumer groups whose members may be connected to any process on one database: each
group's :class:`~.groups.Group` is kept as JSON in the database's ``kafka_groups`` row, and
every transition reads it, changes it and writes it back if nobody changed it meanwhile
(compare-and-set of the row's version; else it starts over).

Deadlines are wall-clock seconds kept in the state, acted on by whichever request looks
first: each transition, and each poll of a waiting request, expires the deadlines that passed
(:meth:`~.groups.Group.expire` acts only on those). The answers owed to JoinGroup and
SyncGroup requests that wait are kept in the row too, under the member id with the token of
the request that waits; the request takes its answer out when it finds it. A waiting request
reads the row every :data:`POLL_SECONDS` (sooner when this process changed the group): a short
poll, without the database's notifications. A newer request of the same member makes the
older one answer REBALANCE_IN_PROGRESS, as Kafka's coordinator does.

Not kept here, unlike :class:`~.coordinator.GroupCoordinator`: the bound on the number of groups
(rows stay, a few hundred bytes each, and Empty groups are listed as Kafka lists those with
offsets).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from ..log.kafka import KafkaShared
from .coordinator import GroupCoordinator
from .groups import (
    COORDINATOR_NOT_AVAILABLE,
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
    Member,
    Reply,
    join_error,
)

logger = logging.getLogger(__name__)

#: Seconds between reads of a group's row by a request that waits.
POLL_SECONDS: Final = 0.1
#: Transitions retried at most when other processes keep changing the group first.
_TRIES: Final = 50

_T = TypeVar("_T")


class Coordinator(Protocol):
    """What the group calls ask of a coordinator (:class:`LocalGroups`, :class:`SharedGroups`)."""

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
    ) -> JoinResult: ...

    async def sync(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[int, bytes]: ...

    async def heartbeat(
        self, group: str, generation: int, member_id: str, instance_id: str | None
    ) -> int: ...

    async def leave(
        self, group: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[int]]: ...

    async def describe(self, group: str) -> GroupDescription: ...

    async def list_groups(self) -> list[tuple[str, str]]: ...

    async def generation_of(
        self, group: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> int: ...

    async def close(self) -> None: ...


class LocalGroups:
    """The groups of this process alone (:class:`~.coordinator.GroupCoordinator`), as a
    :class:`Coordinator`."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

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
        return await self.coordinator.join(
            group,
            member_id,
            instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            require_known_member_id=require_known_member_id,
        )

    async def sync(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[int, bytes]:
        return await self.coordinator.sync(group, generation, member_id, instance_id, assignments)

    async def close(self) -> None:
        await self.coordinator.close()

    async def heartbeat(
        self, group: str, generation: int, member_id: str, instance_id: str | None
    ) -> int:
        return self.coordinator.heartbeat(group, generation, member_id, instance_id)

    async def leave(
        self, group: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[int]]:
        return self.coordinator.leave(group, members)

    async def describe(self, group: str) -> GroupDescription:
        return self.coordinator.describe(group)

    async def list_groups(self) -> list[tuple[str, str]]:
        return self.coordinator.list_groups()

    async def generation_of(
        self, group: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> int:
        return self.coordinator.generation_of(group, member_id, generation, instance_id)


class _Kept:
    """A group as its row keeps it: the state, and the answers owed to waiting requests
    (by member id: the token of the request that waits, and its answer once there is one)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.joins: dict[str, tuple[str, JoinResult | None]] = {}
        self.syncs: dict[str, tuple[str, tuple[int, bytes] | None]] = {}

    def owe(self, replies: list[Reply]) -> None:
        for reply in replies:
            if isinstance(reply, JoinReply):
                waiting = self.joins.get(reply.member_id)
                if waiting is not None:
                    self.joins[reply.member_id] = (waiting[0], reply.result)
            else:
                waiting_sync = self.syncs.get(reply.member_id)
                if waiting_sync is not None:
                    answer = (reply.error, reply.assignment)
                    self.syncs[reply.member_id] = (waiting_sync[0], answer)


class SharedGroups:
    """The groups of every process on the database (see the module). Session timeouts
    outside ``min_session_ms``..``max_session_ms`` are refused; at most ``max_members``
    members (joined or about to) a group."""

    def __init__(
        self,
        shared: KafkaShared,
        *,
        initial_delay_ms: int = 0,
        min_session_ms: int = 1000,
        max_session_ms: int = 3_600_000,
        max_members: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._shared = shared
        self._limits = GroupLimits(initial_delay_ms / 1000, max_members)
        self._min_session_ms = min_session_ms
        self._max_session_ms = max_session_ms
        self._clock = clock
        #: Set when this process changed a group (its waiting requests look at once).
        self._changed: dict[str, asyncio.Event] = {}
        self._closed = False

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
        if self._closed:
            return join_error(COORDINATOR_NOT_AVAILABLE, member_id)
        if not group:
            return join_error(INVALID_GROUP_ID, member_id)
        if not self._min_session_ms <= session_timeout_ms <= self._max_session_ms:
            return join_error(INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        new_member_id = f"{instance_id or client_id}-{uuid.uuid4()}" if not member_id else ""
        own = member_id or new_member_id
        token = uuid.uuid4().hex

        def joined(kept: _Kept | None, now: float) -> tuple[_Kept | None, JoinResult | None]:
            if kept is None:
                if member_id != UNKNOWN_MEMBER:
                    return None, join_error(UNKNOWN_MEMBER_ID, member_id)
                kept = _Kept(Group(group, self._limits))
            kept.joins[own] = (token, None)  # an older request of the member gives way
            replies = kept.group.join(
                now,
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
            kept.owe(replies)
            _, result = kept.joins[own]
            if result is not None:
                del kept.joins[own]
            return kept, result

        result = await self._change(group, joined)
        if result is not None:
            return result
        answer = await self._wait(group, lambda kept: _taken(kept.joins, own, token))
        if answer is None:
            return join_error(REBALANCE_IN_PROGRESS, member_id)
        if isinstance(answer, _Failed):
            return join_error(COORDINATOR_NOT_AVAILABLE, member_id)
        return answer

    async def sync(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[int, bytes]:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE, b""
        if not group:
            return INVALID_GROUP_ID, b""
        token = uuid.uuid4().hex

        def synced(kept: _Kept | None, now: float) -> tuple[_Kept | None, tuple[int, bytes] | None]:
            if kept is None:
                return None, (UNKNOWN_MEMBER_ID, b"")
            kept.syncs[member_id] = (token, None)
            kept.owe(
                kept.group.sync(
                    now,
                    generation=generation,
                    member_id=member_id,
                    instance_id=instance_id,
                    assignments=assignments,
                )
            )
            _, answer = kept.syncs[member_id]
            if answer is not None:
                del kept.syncs[member_id]
            return kept, answer

        result = await self._change(group, synced)
        if result is not None:
            return result
        answer = await self._wait(group, lambda kept: _taken(kept.syncs, member_id, token))
        if answer is None:
            return REBALANCE_IN_PROGRESS, b""
        if isinstance(answer, _Failed):
            return COORDINATOR_NOT_AVAILABLE, b""
        return answer

    async def heartbeat(
        self, group: str, generation: int, member_id: str, instance_id: str | None
    ) -> int:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if not group:
            return INVALID_GROUP_ID

        def beat(kept: _Kept | None, now: float) -> tuple[_Kept | None, int]:
            if kept is None:
                return None, UNKNOWN_MEMBER_ID
            error = kept.group.heartbeat(
                now, generation=generation, member_id=member_id, instance_id=instance_id
            )
            return kept, error

        return await self._change(group, beat)

    async def leave(
        self, group: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[int]]:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE, [COORDINATOR_NOT_AVAILABLE] * len(members)
        if not group:
            return INVALID_GROUP_ID, [INVALID_GROUP_ID] * len(members)

        def left(kept: _Kept | None, now: float) -> tuple[_Kept | None, tuple[int, list[int]]]:
            if kept is None:
                return None, (NONE, [UNKNOWN_MEMBER_ID] * len(members))
            error, errors, replies = kept.group.leave(now, members)
            kept.owe(replies)
            return kept, (error, errors)

        return await self._change(group, left)

    async def describe(self, group: str) -> GroupDescription:
        kept = await self._read(group)
        if kept is None:
            return GroupDescription(NONE, group, GroupState.DEAD.value, "", "", [])
        return kept.group.describe()

    async def list_groups(self) -> list[tuple[str, str]]:
        listed = []
        for group in await self._shared.group_ids():
            kept = await self._read(group)
            if kept is not None:
                listed.append((group, kept.group.protocol_type or ""))
        return listed

    async def generation_of(
        self, group: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> int:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        kept = await self._read(group)
        if kept is None:
            return NONE if generation < 0 else ILLEGAL_GENERATION
        return kept.group.check_commit(member_id, generation, instance_id)

    async def close(self) -> None:
        """The requests that wait here answer COORDINATOR_NOT_AVAILABLE, and so every later
        one (the groups stay for the other processes)."""
        self._closed = True
        for changed in self._changed.values():
            changed.set()

    # -- the machinery ---------------------------------------------------------------------

    async def _read(self, group: str) -> _Kept | None:
        """The group as kept, its passed deadlines acted on (not written)."""
        row = await self._shared.group_state(group)
        if row is None:
            return None
        kept = _decode(group, row[1], self._limits)
        kept.owe(kept.group.expire(self._clock()))
        return kept

    async def _change(
        self, group: str, change: Callable[[_Kept | None, float], tuple[_Kept | None, _T]]
    ) -> _T:
        """Read the group, expire what passed, ``change`` it (None: nothing to write) and
        write it back unless another process changed it first (then again); ``change``'s
        answer."""
        for _ in range(_TRIES):
            row = await self._shared.group_state(group)
            now = self._clock()
            version, kept = 0, None
            if row is not None:
                version, kept = row[0], _decode(group, row[1], self._limits)
                kept.owe(kept.group.expire(now))
            kept, answer = change(kept, now)
            if kept is None or await self._shared.put_group_state(group, version, _encode(kept)):
                if kept is not None:
                    self._touched(group)
                return answer
        raise RuntimeError(f"the Kafka group {group!r} kept changing under this process")

    def _touched(self, group: str) -> None:
        changed = self._changed.pop(group, None)
        if changed is not None:
            changed.set()

    async def _wait(
        self, group: str, take: Callable[[_Kept], tuple[bool, _T | None]]
    ) -> _T | _Failed | None:
        """Poll the group until ``take`` finds the answer (taken out of the row) or that the
        request gave way to a newer one (None); :class:`_Failed` once this process closes."""
        while True:
            changed = self._changed.setdefault(group, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), POLL_SECONDS)
            if self._closed:
                return _Failed()

            def look(kept: _Kept | None, now: float) -> tuple[_Kept | None, tuple[bool, _T | None]]:
                if kept is None:
                    return None, (True, None)
                done, answer = take(kept)
                if done:
                    return kept, (True, answer)
                due = kept.group.next_deadline()
                if due is not None and due <= now:
                    return kept, (False, None)  # written: the deadlines acted on
                return None, (False, None)

            try:
                done, answer = await self._change(group, look)
                if done:
                    return answer
            except Exception as exc:  # the database is away: try again at the next poll
                logger.warning("the Kafka group %r could not be read: %s", group, exc)


class _Failed:
    """This process closed while the request waited."""


def _taken(
    owed: dict[str, tuple[str, _T | None]], member_id: str, token: str
) -> tuple[bool, _T | None]:
    """(done, answer): the answer owed to the request ``token`` of ``member_id``, taken out;
    done with None when a newer request of the member waits instead (or none does)."""
    waiting = owed.get(member_id)
    if waiting is None or waiting[0] != token:
        return True, None
    if waiting[1] is None:
        return False, None
    del owed[member_id]
    return True, waiting[1]


# -- the row's JSON --------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def _result_json(result: JoinResult) -> list[Any]:
    members = [[m, i, _b64(d)] for m, i, d in result.members]
    return [*result[:6], members]


def _result(data: list[Any]) -> JoinResult:
    error, generation, protocol_type, protocol, leader, member_id, members = data
    return JoinResult(
        error,
        generation,
        protocol_type,
        protocol,
        leader,
        member_id,
        [(m, i, _bytes(d)) for m, i, d in members],
    )


def _encode(kept: _Kept) -> str:
    """The row's JSON; a request that waits for a member no longer known is not kept (it
    went with its connection, or it finds no answer and answers REBALANCE_IN_PROGRESS)."""
    group = kept.group
    known = group.members.keys() | group.pending.keys()
    members = [
        {
            "id": m.member_id,
            "instance": m.instance_id,
            "client": m.client_id,
            "host": m.client_host,
            "session": m.session_timeout,
            "rebalance": m.rebalance_timeout,
            "type": m.protocol_type,
            "protocols": [[name, _b64(data)] for name, data in m.protocols],
            "assignment": _b64(m.assignment),
            "join": m.awaiting_join,
            "sync": m.awaiting_sync,
            "deadline": m.deadline,
        }
        for m in group.members.values()
    ]
    return json.dumps(
        {
            "state": group.state.value,
            "generation": group.generation,
            "protocol_type": group.protocol_type,
            "protocol": group.protocol,
            "leader": group.leader,
            "members": members,
            "pending": group.pending,
            "instances": group.instances,
            "rebalance_deadline": group.rebalance_deadline,
            "initial_end": group.initial_end,
            "joined_during_delay": group.joined_during_delay,
            "joins": {
                m: [token, None if r is None else _result_json(r)]
                for m, (token, r) in kept.joins.items()
                if r is not None or m in known
            },
            "syncs": {
                m: [token, None if a is None else [a[0], _b64(a[1])]]
                for m, (token, a) in kept.syncs.items()
                if a is not None or m in known
            },
        },
        separators=(",", ":"),
    )


def _decode(group_id: str, text: str, limits: GroupLimits) -> _Kept:
    data = json.loads(text)
    group = Group(group_id, limits)
    group.state = GroupState(data["state"])
    group.generation = data["generation"]
    group.protocol_type = data["protocol_type"]
    group.protocol = data["protocol"]
    group.leader = data["leader"]
    for m in data["members"]:
        group.members[m["id"]] = Member(
            m["id"],
            m["instance"],
            m["client"],
            m["host"],
            m["session"],
            m["rebalance"],
            m["type"],
            [(name, _bytes(b)) for name, b in m["protocols"]],
            _bytes(m["assignment"]),
            m["join"],
            m["sync"],
            m["deadline"],
        )
    group.pending = data["pending"]
    group.instances = data["instances"]
    group.rebalance_deadline = data["rebalance_deadline"]
    group.initial_end = data["initial_end"]
    group.joined_during_delay = data["joined_during_delay"]
    kept = _Kept(group)
    kept.joins = {
        m: (token, None if r is None else _result(r)) for m, (token, r) in data["joins"].items()
    }
    kept.syncs = {
        m: (token, None if a is None else (a[0], _bytes(a[1])))
        for m, (token, a) in data["syncs"].items()
    }
    return kept
