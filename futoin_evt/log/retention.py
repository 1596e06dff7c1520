"""Retention: discard events every registered reliable consumer has read, expire dead consumers.

FTN18 keeps an event in the active store until the last registered reliable consumer has
read it (2.3.1). The discarder deletes events at or below the lowest consumer position, in
chunks that each hold the write lock only briefly, and pauses between chunks (``duty``), so
producers keep going at most of their speed while a large backlog is deleted. Without any
registered consumer nothing is discarded, unless a retention policy is set: then events
are deleted once they are outside the policy. A policy also always keeps the newest
``keep_events`` events and those younger than ``keep_seconds``, whatever was read. Events
an aggregated stream has not copied yet stay, whatever the rest allows.

A consumer not seen for ``expire_consumers_after`` seconds (no poll, no acknowledgement, no
connected push stream) is dropped, logged, and listed in the stream information, so a dead
consumer cannot pin the store forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from ..domain.stream import UserId, utc_timestamp
from ..notify.management import CONSUMER_EXPIRED, EVENTS_DISCARDED, ManagementBus
from ..storage.base import Consumers, DiscardLimits, Retention

log = logging.getLogger(__name__)


class RetentionStore(Retention, Consumers, Protocol):
    """Discarding and expiring consumers."""


#: Expired consumers remembered for the stream information.
_EXPIRED_SHOWN: Final = 100


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    #: Seconds between discard passes.
    interval: float = 1.0
    #: Events deleted per transaction.
    chunk: int = 1000
    #: Share of the time a discard pass may keep the writer busy; it pauses between chunks
    #: for the rest, so producers keep most of their throughput during a big discard.
    duty: float = 0.3
    keep_events: int | None = None
    keep_seconds: float | None = None
    expire_consumers_after: float | None = None
    #: Events appended through DCB are the system of record: discarded only when set.
    discard_dcb_events: bool = False

    @property
    def has_policy(self) -> bool:
        return self.keep_events is not None or self.keep_seconds is not None


def discard_bound(limits: DiscardLimits, config: RetentionConfig) -> int:
    """The newest id that may be deleted now (0: none)."""
    if limits.lowest_position is not None:
        bound = limits.lowest_position
    elif config.has_policy:
        bound = limits.newest_id
    else:
        return 0
    if config.keep_events is not None:
        bound = min(bound, limits.newest_id - config.keep_events)
    if config.keep_seconds is not None:
        bound = min(bound, limits.older_than_kept or 0)
    if limits.copied_up_to is not None:  # an aggregate has yet to copy the rest
        bound = min(bound, limits.copied_up_to)
    return max(bound, 0)


class ConnectedStream(Protocol):
    """A push stream that is connected now."""

    @property
    def user_id(self) -> UserId: ...
    @property
    def component(self) -> str: ...
    @property
    def reliable(self) -> bool: ...


class PushStreams(Protocol):
    """The push door, as retention sees it: a connected reliable stream keeps its consumer."""

    @property
    def streams(self) -> Sequence[ConnectedStream]: ...


class Discarder:
    def __init__(
        self,
        store: RetentionStore,
        push: PushStreams,
        config: RetentionConfig,
        notices: ManagementBus | None = None,
    ) -> None:
        self._store = store
        self._notices = notices
        self._push = push
        self.config = config
        self.discarded_total = 0
        self.expired: deque[tuple[str, str]] = deque(maxlen=_EXPIRED_SHOWN)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="futoin-evt-discarder")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.expire_consumers()
                await self.discard()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("discard pass failed")
            await asyncio.sleep(self.config.interval)

    async def bound(self) -> int:
        keep_since = None
        if self.config.keep_seconds is not None:
            keep_since = utc_timestamp(time.time() - self.config.keep_seconds)
        return discard_bound(await self._store.discard_limits(keep_since), self.config)

    async def discard(self) -> int:
        """One pass: delete everything that may go now, chunk by chunk."""
        bound = await self.bound()
        deleted = 0
        pause_per_busy = (1 - self.config.duty) / self.config.duty
        while bound:
            started = time.monotonic()
            count = await self._store.delete_events(
                bound, self.config.chunk, dcb_events=self.config.discard_dcb_events
            )
            deleted += count
            if count < self.config.chunk:
                break
            await asyncio.sleep((time.monotonic() - started) * pause_per_busy)
        if deleted:
            self.discarded_total += deleted
            log.debug("discarded %d events up to id %d", deleted, bound)
            if self._notices is not None:
                self._notices.publish(
                    EVENTS_DISCARDED, count=deleted, upToId=bound, reason="retention policy"
                )
        return deleted

    async def expire_consumers(self) -> None:
        if self.config.expire_consumers_after is None:
            return
        connected = [(s.user_id, s.component) for s in self._push.streams if s.reliable]
        await self._store.touch_consumers(connected)  # a connected stream is a live consumer
        seen_before = utc_timestamp(time.time() - self.config.expire_consumers_after)
        for user, component in await self._store.expire_consumers(seen_before):
            log.warning("consumer %s of user %s expired: not seen since %s", component, user,
                        seen_before)  # fmt: skip
            self.expired.append((user, component))
            if self._notices is not None:
                reason = f"not seen since {seen_before}"
                self._notices.publish(
                    CONSUMER_EXPIRED, user=user, component=component, reason=reason
                )
