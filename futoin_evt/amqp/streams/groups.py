"""Consumer groups: one active receive link per group (of a user) and partition in the whole
cluster, claimed in the database, held while its process renews the hold, and taken over by a
link with a higher epoch (seed 4.5)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...domain.groups import GroupClaim
from ...domain.principal import Principal
from ...domain.stream import UserId, is_registrable
from ...log.eventlog import EventLog
from ...quoting import quote_input
from ..engine.conditions import DETACH_FORCED, INVALID_FIELD, LINK_STOLEN, RESOURCE_LOCKED
from ..engine.session import Link
from ..resume import Termini
from ..table import ConnectionView, LinkHandler, LinkRefused
from .addressing import (
    EPOCH_PROPERTY,
    FTN18_GROUP_PREFIX,
    GROUP_PROPERTY,
    MAX_GROUP_CHARS,
    Address,
    start_position,
)
from .consumer import Attaching, ConsumerLink
from .recovery import Recovery, durability, recover, restore_kept

logger = logging.getLogger(__name__)

#: How long a consumer group's hold lasts unless its process renews it: the groups of a
#: process that died stay held this long at most (a higher epoch, or an equal Event Hubs
#: owner level, takes one over at once).
GROUP_HOLD_SECONDS: Final = 30.0
#: How often a process renews the holds of its groups' links.
GROUP_RENEW_SECONDS: Final = GROUP_HOLD_SECONDS / 3
#: How long closing waits for the groups of ended links to be released.
GROUP_RELEASE_SECONDS: Final = 5.0


#: A consumer group of a user on a partition: (partition key, user, group).
_GroupKey = tuple[int, UserId, str]


@dataclass(slots=True)
class _Owner:
    """The active receive link of a consumer group on a partition in this process, with
    its epoch and its claim number."""

    epoch: int
    claim: int
    conn: ConnectionView
    link: Link
    events: EventLog
    #: The link's user.
    who: Principal


class ConsumerGroups:
    """This process's side of the consumer groups: the links of the groups it holds, their
    claims (:meth:`attach`), the renewal of their holds, and the release of an ended link's
    group. The database says which link holds a group (:meth:`EventLog.claim_group`); a claim
    heard of detaches the older link here."""

    def __init__(self, termini: Termini) -> None:
        #: This process's active group links.
        self._groups: dict[_GroupKey, _Owner] = {}
        #: Claims on their way, and the newest claim heard of the group meanwhile.
        self._claiming: dict[_GroupKey, int] = {}
        self._heard: dict[_GroupKey, int] = {}
        #: Groups of ended links until their release is stored.
        self._releasing: dict[_GroupKey, asyncio.Future[None]] = {}
        #: Partition key -> how to stop hearing its group claims.
        self._listening: dict[int, Callable[[], None]] = {}
        #: Renews the holds while there are group links here.
        self._renewing: asyncio.Future[None] | None = None
        #: Where the termini of suspended links are kept (a group link's is taken with it).
        self.termini = termini

    def attach(
        self,
        conn: ConnectionView,
        link: Link,
        parsed: Address,
        partition: int | None,
        group: Any,
        epoch: Any,
        event_hubs: bool,
        equal_takes_over: bool = False,
    ) -> LinkHandler:
        """One active link per group (of this user) and partition in the whole cluster; a
        higher epoch takes over (seed 4.5.2), also an equal one for an Event Hubs owner
        level. A link naming no partition is given a free one (4.5.1). The link is answered
        once its claim is back from the database (:class:`Attaching`)."""
        if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
            raise LinkRefused(
                INVALID_FIELD,
                f"event-streams-consumer-group must be a string of 1-{MAX_GROUP_CHARS} characters",
            )
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
            raise LinkRefused(INVALID_FIELD, "event-streams-epoch must be a long")
        assert conn.principal is not None
        user_id = conn.principal.user_id
        binding = None
        if group.startswith(FTN18_GROUP_PREFIX):
            component = group[len(FTN18_GROUP_PREFIX) :]
            if not is_registrable(component):
                raise LinkRefused(
                    INVALID_FIELD,
                    f"not a consumer name (A-Z, a-z, 0-9, _; 1-16): {quote_input(group, 80)}",
                )
            binding = (user_id, component)
        # Refused before the claim, which may take the group from a live link.
        start_position(link, parsed.logs[partition or 0].head)
        recovery = durability(self.termini, conn, link, group)
        request = _GroupRequest(
            conn.principal,
            parsed.hub,
            parsed.logs,
            partition,
            group,
            None if epoch is None else int(epoch),
            equal_takes_over,
            event_hubs,
            binding,
            recovery,
        )
        return Attaching(
            conn,
            link,
            lambda attaching: self._claim(attaching, request),
            "the consumer group could not be claimed",
        )

    async def _claim(self, attach: Attaching, request: _GroupRequest) -> None:
        """Claim the group for ``attach``'s link, then answer the attach. A link naming no
        partition tries the partitions in turn (those without a link of the group here),
        taking only a free one."""
        conn, link = attach.conn, attach.link
        assert conn.principal is not None
        user_id = conn.principal.user_id
        group = request.group
        logs = request.logs
        if request.partition is not None:
            numbers = [request.partition]
        else:
            numbers = [
                n
                for n in range(len(logs))
                if (logs[n].partition.key, user_id, group) not in self._groups
            ]
        held_epoch = 0
        for number in numbers:
            events = logs[number]
            key = (events.partition.key, user_id, group)
            claimed, heard, recovery = await self._claim_one(events, key, request)
            held_epoch = claimed.epoch
            if claimed.taken:
                self._heard_claim(*key, claimed.claim, claimed.epoch)  # the older link here
            if attach.closed:  # the peer detached, or its connection went, meanwhile
                if claimed.taken and heard <= claimed.claim:
                    self._release_later(request.who, key, events, claimed.claim, None)
                restore_kept(recovery)
                return
            if claimed.taken:
                self._install(attach, request, number, key, claimed, heard, recovery)
                return
        if request.partition is None:
            conn.detach(
                link,
                DETACH_FORCED,
                f"every partition of {request.hub} has an active link of consumer group"
                f" {quote_input(group, 80)}",
            )
        else:
            conn.detach(
                link,
                RESOURCE_LOCKED,
                f"consumer group {quote_input(group, 80)} has an active link on partition"
                f" {request.partition} with epoch {held_epoch};"
                " attach with a higher event-streams-epoch to take over",
            )

    async def _claim_one(
        self, events: EventLog, key: _GroupKey, request: _GroupRequest
    ) -> tuple[GroupClaim, int, Recovery | None]:
        """The claim of the group on one partition, the newest claim heard of it while this
        one (and the take of the terminus the link resumes, once the group is taken) was on
        its way (a newer one has taken it from this one already), and the recovery."""
        if events.partition.key not in self._listening:
            self._listening[events.partition.key] = events.listen_group_claims(
                functools.partial(self._heard_claim, events.partition.key)
            )
        releasing = self._releasing.get(key)
        if releasing is not None:  # a link of the group here that just ended frees it first
            await asyncio.wait([releasing])
        self._claiming[key] = self._claiming.get(key, 0) + 1
        try:
            claimed = await events.claim_group(
                request.who,
                key[2],
                request.epoch,
                hold_seconds=GROUP_HOLD_SECONDS,
                equal_takes_over=request.equal_takes_over,
                free_only=request.partition is None,
            )
            recovery = None
            if claimed.taken:
                recovery = await recover(self.termini, request.recovery, key[0])
        finally:
            heard = self._heard.get(key, 0)
            self._claiming[key] -= 1
            if not self._claiming[key]:
                del self._claiming[key]
                self._heard.pop(key, None)
        return claimed, heard, recovery

    def _install(
        self,
        attach: Attaching,
        request: _GroupRequest,
        number: int,
        key: _GroupKey,
        claimed: GroupClaim,
        heard: int,
        recovery: Recovery | None,
    ) -> None:
        """The group is the link's (the older link of the group here is detached already):
        serve it, unless a newer claim took the group while this one was on its way."""
        conn, link = attach.conn, attach.link
        if heard > claimed.claim or key in self._groups:
            restore_kept(recovery)
            conn.detach(link, LINK_STOLEN, "taken over by a newer link while attaching")
            return
        events = request.logs[number]
        group, binding = request.group, request.binding
        try:
            start = start_position(link, events.head)
        except LinkRefused as exc:  # checked before the claim: not expected
            restore_kept(recovery)
            self._release_later(request.who, key, events, claimed.claim, None)
            conn.detach(link, exc.condition, str(exc))
            return

        def release(acking: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
            owner = self._groups.get(key)
            if owner is None or owner.link is not link:  # taken over: nothing to release
                return acking
            del self._groups[key]
            return self._release_later(request.who, key, events, claimed.claim, acking)

        self._groups[key] = _Owner(claimed.epoch, claimed.claim, conn, link, events, request.who)
        attach.inner = ConsumerLink(
            conn,
            link,
            events,
            start,
            recovery=recovery,
            properties={GROUP_PROPERTY: group, EPOCH_PROPERTY: claimed.epoch},
            binding=binding,
            fence=(group, claimed.claim),
            on_closed=release,
            event_hubs=request.event_hubs,
            partition=number,
        )
        conn.wake()
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew())

    def _steal(self, key: _GroupKey, owner: _Owner, why: str) -> None:
        """Detach the group's link here: another claim holds the group now."""
        if self._groups.get(key) is owner:
            del self._groups[key]
        owner.conn.detach(owner.link, LINK_STOLEN, why)

    def _heard_claim(
        self, partition_key: int, user_id: UserId, group: str, claim: int, epoch: int
    ) -> None:
        """A group was taken (by another process, or by this one on PostgreSQL): its link
        here with an older claim is detached."""
        key = (partition_key, user_id, group)
        if key in self._claiming:
            self._heard[key] = max(self._heard.get(key, 0), claim)
        owner = self._groups.get(key)
        if owner is not None and owner.claim < claim:
            self._steal(key, owner, f"taken over with epoch {epoch}")

    def _release_later(
        self,
        who: Principal,
        key: _GroupKey,
        events: EventLog,
        claim: int,
        acking: asyncio.Future[None] | None,
    ) -> asyncio.Future[None]:
        """Free the group once what its link accepted is stored; a link of the group that
        attaches here meanwhile waits for it."""

        async def release() -> None:
            if acking is not None:
                await asyncio.wait([acking])
            try:
                await events.release_group(who, key[2], claim)
            except Exception as exc:  # its hold runs out instead
                logger.warning(
                    "releasing consumer group %s failed: %s", quote_input(key[2], 80), exc
                )
            finally:
                if self._releasing.get(key) is task:
                    del self._releasing[key]

        task = asyncio.ensure_future(release())
        self._releasing[key] = task
        return task

    async def _renew(self) -> None:
        """Renew the holds of the groups' links here while there are any; a link whose
        group another claim took (a takeover this process did not hear of) is detached."""
        while self._groups:
            await asyncio.sleep(GROUP_RENEW_SECONDS)
            by_partition: dict[int, tuple[EventLog, list[tuple[Principal, str, int]]]] = {}
            for (partition_key, _user_id, group), held in self._groups.items():
                holds = by_partition.setdefault(partition_key, (held.events, []))[1]
                holds.append((held.who, group, held.claim))
            for partition_key, (events, holds) in by_partition.items():
                try:
                    lost = await events.hold_groups(holds, GROUP_HOLD_SECONDS)
                except Exception as exc:  # the next round tries again
                    logger.warning("renewing the holds of consumer groups failed: %s", exc)
                    continue
                for user_id, group, claim in lost:
                    key = (partition_key, user_id, group)
                    owner = self._groups.get(key)
                    if owner is not None and owner.claim == claim:
                        self._steal(key, owner, "taken over elsewhere")

    async def close(self) -> None:
        """Stop renewing, and let the groups of the links that ended be released."""
        if self._renewing is not None:
            self._renewing.cancel()
        for stop in self._listening.values():
            stop()
        self._listening.clear()
        releasing = list(self._releasing.values())
        if releasing:
            await asyncio.wait(releasing, timeout=GROUP_RELEASE_SECONDS)


@dataclass(frozen=True, slots=True)
class _GroupRequest:
    """What a consumer group's attach asks for, checked."""

    #: The link's user (the group is theirs).
    who: Principal
    hub: str
    logs: Sequence[EventLog]
    #: None: any partition free of the group's links.
    partition: int | None
    group: str
    epoch: int | None
    equal_takes_over: bool
    event_hubs: bool
    binding: tuple[UserId, str] | None
    #: The durability the link asks for (the terminus it resumes is taken with the group).
    recovery: Recovery | None
