"""The streams a server serves, kept up to date across processes.

Every process reads the registry from the store when it starts and again whenever the
store's registry version moves: it is woken at once by a change the store reports (this
process's own; on PostgreSQL any process's, through its notification channel), and polls
the version (one cheap read) every ``poll_seconds`` where the store does not hear other
processes (SQLite), else every :data:`FALLBACK_POLL_SECONDS` (a read on PostgreSQL's small
pool each second would compete with the calls). So a stream added or grown by the command
line or another server is served within ``poll_seconds`` on SQLite, at once on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Final

from ..domain.partition import (
    DEFAULT_PARTITION,
    Partition,
    StreamInfo,
    check_partition_count,
    check_stream_name,
)
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import UserId
from ..storage.base import Streams
from .access import OPEN_ACCESS, Access, AccessDenied, StreamGuard
from .consumers import ConsumerLifecycle
from .eventlog import EventLog, SchemaOf

logger = logging.getLogger(__name__)

#: Seconds between two reads of the registry's version (a stream is served within this).
DEFAULT_POLL_SECONDS: Final = 1.0
#: Seconds between two reads of it where every change is notified: only a fallback.
FALLBACK_POLL_SECONDS: Final = 30.0


#: The read right as a plain int (the checks of every read).
_READ: Final = int(Right.READ)


class SourceDenied(AccessDenied):
    """A caller may read an aggregated stream but not every stream it copies. The sentence
    does not name the source: the caller may hold no right on it."""

    def __init__(self, aggregate: str) -> None:
        super().__init__(Right.READ, aggregate)
        self.args = (
            f"the read right on stream {aggregate} and on the stream it aggregates is needed",
        )


class SourcedAccess:
    """The rights as every door meets them (``server.streams.access``): those of ``grants``,
    where reading an aggregated stream needs read on it and on its source, and on the
    source's source when that is an aggregate too. Every door's reads, listings and
    watches go through this one rule: a revoke on the source ends a reader's view of the
    aggregate as a revoke on the aggregate does. Admins hold every right."""

    __slots__ = ("grants", "sources")

    def __init__(self, grants: Access) -> None:
        self.grants = grants
        #: The sources of each aggregated stream, nearest first (set by the registry).
        self.sources: dict[str, tuple[str, ...]] = {}

    def allows(self, caller: Principal, right: Right | int, stream: str) -> bool:
        grants = self.grants
        if not grants.allows(caller, right, stream):
            return False
        sources = self.sources.get(stream)
        if sources is not None and right & _READ:
            for source in sources:
                if not grants.allows(caller, _READ, source):
                    return False
        return True

    def check(self, caller: Principal, right: Right | int, stream: str) -> None:
        """:class:`~futoin_evt.log.access.AccessDenied` without ``right`` on ``stream``;
        :class:`SourceDenied` for a read of an aggregate whose sources are not all readable."""
        grants = self.grants
        grants.check(caller, right, stream)
        sources = self.sources.get(stream)  # None for most: one lookup on every read
        if sources is not None and right & _READ:
            for source in sources:
                if not grants.allows(caller, _READ, source):
                    raise SourceDenied(stream)

    async def catch_up(self) -> None:
        await self.grants.catch_up()

    def watch(
        self, caller: Principal, right: Right, stream: str, on_revoked: Callable[[], None]
    ) -> Callable[[], None]:
        """As :meth:`~futoin_evt.log.access.AccessControl.watch`; for a read of an aggregate,
        ``on_revoked`` is called once the right on it or on any of its sources goes."""
        sources = self.sources.get(stream) if right & _READ else None
        if not sources or caller.is_admin:
            return self.grants.watch(caller, right, stream, on_revoked)
        stops: list[Callable[[], None]] = []
        ended = False

        def stop() -> None:
            nonlocal ended
            ended = True
            for each in stops:
                each()

        def revoked() -> None:
            if not ended:  # once, whichever right goes first
                stop()
                on_revoked()

        stops.append(self.grants.watch(caller, right, stream, revoked))
        stops.extend(self.grants.watch(caller, Right.READ, name, revoked) for name in sources)
        return stop


def aggregate_sources(infos: dict[str, StreamInfo]) -> dict[str, tuple[str, ...]]:
    """For each aggregated stream, the names of the streams whose events it holds: its
    source, and that source's source while it is an aggregate (a source no longer there
    still counts by its name)."""
    found: dict[str, tuple[str, ...]] = {}
    for name, info in infos.items():
        chain: list[str] = []
        source = info.aggregate_of
        while source is not None and source != name and source not in chain:
            chain.append(source)
            known = infos.get(source)
            source = known.aggregate_of if known is not None else None
        if chain:
            found[name] = tuple(chain)
    return found


class StreamRegistry:
    """``server.streams``: the streams and partitions this process knows, by name."""

    def __init__(
        self,
        store: Streams,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        access: Access = OPEN_ACCESS,
    ) -> None:
        self._store = store
        #: Adding, growing and dropping a stream need manage on its name; describing it,
        #: read; a listing shows the streams the caller holds some right on. Reading an
        #: aggregate needs read on its sources too (:class:`SourcedAccess`).
        self._sourced = SourcedAccess(access)
        self.access: Access = self._sourced
        self._poll_seconds = (
            max(poll_seconds, FALLBACK_POLL_SECONDS)
            if store.hears_all_stream_changes
            else poll_seconds
        )
        self._streams: dict[str, StreamInfo] = {}
        self.version = -1
        self._changed = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._stop_listening = store.listen_streams(lambda _version: self._changed.set())
        self._listeners: set[Callable[[], None]] = set()

    @classmethod
    async def open(
        cls,
        store: Streams,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        access: Access = OPEN_ACCESS,
    ) -> StreamRegistry:
        registry = cls(store, poll_seconds, access)
        await registry.refresh()
        registry._task = asyncio.create_task(registry._follow(), name="futoin-evt-streams")
        return registry

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after each read of a changed registry; returns how to stop."""
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    def get(self, name: str) -> StreamInfo | None:
        return self._streams.get(name)

    def partition(self, name: str, number: int) -> Partition | None:
        info = self._streams.get(name)
        if info is None or not 0 <= number < len(info.partitions):
            return None
        return info.partitions[number]

    def __iter__(self) -> Iterator[StreamInfo]:
        return iter(list(self._streams.values()))

    def visible_to(self, who: Principal) -> list[StreamInfo]:
        """The streams ``who`` holds some right on (every one, for an admin). An aggregate's
        source is named only to a caller who holds some right on that name (else its
        ``aggregate_of`` is None: the name of a stream they hold no right on is not told)."""
        return [
            info
            if info.aggregate_of is None or self.holds_any(who, info.aggregate_of)
            else replace(info, aggregate_of=None)
            for info in self._streams.values()
            if self.holds_any(who, info.name)
        ]

    def holds_any(self, who: Principal, name: str) -> bool:
        """Whether ``who`` holds some right on the name ``name`` (then they may be told
        whether such a stream exists)."""
        access = self.access
        return (
            access.allows(who, Right.READ, name)
            or access.allows(who, Right.WRITE, name)
            or access.allows(who, Right.MANAGE, name)
        )

    def reachable(self, who: Principal, name: str, right: Right) -> StreamInfo | None:
        """The stream ``name`` for a call that needs ``right`` on it, or None when there is
        no such stream. :class:`~futoin_evt.log.access.AccessDenied` when ``who`` holds no
        right on the name, whether the stream exists or not (names cannot be probed), or
        lacks ``right`` on a stream that exists."""
        if not self.holds_any(who, name):
            raise AccessDenied(right, name)
        info = self._streams.get(name)
        if info is not None:
            self.access.check(who, right, name)
        return info

    async def refresh(self) -> None:
        """Read the registry again (the version first: a change after it is read again)."""
        version = await self._store.streams_version()
        infos = {info.name: info for info in await self._store.streams()}
        # What is there at start is no news (and a command's one-line error stays one line).
        level = logging.INFO if self.version >= 0 else logging.DEBUG
        for name, info in infos.items():
            known = self._streams.get(name)
            if known is None or len(known.partitions) != len(info.partitions):
                logger.log(level, "stream %s: %d partitions", name, len(info.partitions))
        for name in self._streams.keys() - infos.keys():
            logger.info("stream %s dropped", name)
        self._streams = infos
        self._sourced.sources = aggregate_sources(infos)
        self.version = version
        for callback in list(self._listeners):
            callback()

    # -- the streams' administration (a change is served here at once) ---------------------

    async def add(
        self, who: Principal, name: str, partitions: int, *, aggregate_of: str | None = None
    ) -> StreamInfo:
        """Add a stream (see :meth:`~futoin_evt.storage.base.Streams.add_stream`):
        :class:`~futoin_evt.log.access.AccessDenied` without manage on the name (and, for an
        aggregate, read on its source), ValueError for a bad name or count (one sentence),
        KeyError when the name is taken."""
        check_stream_name(name)
        self.access.check(who, Right.MANAGE, name)
        if aggregate_of is not None:
            self.access.check(who, Right.READ, aggregate_of)
        if aggregate_of == name:
            raise ValueError(f"the stream {name} cannot aggregate itself")
        info = await self._store.add_stream(
            name, check_partition_count(partitions), aggregate_of=aggregate_of
        )
        await self.refresh()
        return info

    async def grow(self, who: Principal, name: str, partitions: int) -> StreamInfo:
        """Grow a stream (see :meth:`~futoin_evt.storage.base.Streams.grow_stream`)."""
        self.access.check(who, Right.MANAGE, name)
        info = await self._store.grow_stream(name, partitions)
        await self.refresh()
        return info

    async def drop(self, who: Principal, name: str) -> bool:
        """Drop a stream (see :meth:`~futoin_evt.storage.base.Streams.drop_stream`)."""
        self.access.check(who, Right.MANAGE, name)
        dropped = await self._store.drop_stream(name)
        if dropped:
            await self.refresh()
        return dropped

    async def describe(self, who: Principal, name: str) -> dict[str, Any] | None:
        """:func:`describe_stream` of the stream in the database (None: no such stream),
        with the consumers ``who`` is shown (everyone's with manage on it). Needs read (on an
        aggregate's sources too)."""
        guard = StreamGuard(self.access, name)
        guard.read(who)
        info = await self._store.stream(name)
        if info is None:
            return None
        return await describe_stream(self._store, info, guard.shown_to(who))

    async def _follow(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_seconds):
                    await self._changed.wait()
            self._changed.clear()
            try:
                if await self._store.streams_version() != self.version:
                    await self.refresh()
            except Exception as exc:  # the database is away for a moment: the next turn
                logger.warning("reading the streams failed: %s", exc)

    async def close(self) -> None:
        # The flag ends the loop even when the cancel is lost (a read it interrupts may end
        # in an error of the driver's, which the loop survives): a command that had just
        # changed the registry waited for ever to exit.
        self._closed = True
        self._changed.set()
        self._stop_listening()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def stream_summary(info: StreamInfo) -> dict[str, Any]:
    """A stream as ``stream list --json`` and the ops iface's ``listStreams`` show it."""
    summary: dict[str, Any] = {
        "name": info.name,
        "partitions": len(info.partitions),
        "created_at": info.created_at,
    }
    if info.aggregate_of is not None:
        summary["aggregate_of"] = info.aggregate_of
    return summary


async def describe_stream(
    store: Streams, info: StreamInfo, user_id: UserId | None = None
) -> dict[str, Any]:
    """Each partition's head, oldest id, events kept and consumers with their lag (only
    ``user_id``'s consumers when given): ``stream info`` and the ops iface's
    ``describeStream``. A few reads per partition."""
    partitions = []
    for partition in info.partitions:
        log = store.partition_log(partition)
        bounds = await log.stream_bounds()
        state: dict[str, Any] = {
            "number": partition.number,
            "head": await log.last_given_id(),
            "events": bounds.events,
            "consumers": [
                {"user": c.user, "component": c.component, "position": c.position,
                 "behind": c.behind}
                for c in await log.consumers(user_id)
            ],
        }  # fmt: skip
        if bounds.first_id is not None:
            state["oldest_id"] = bounds.first_id
        partitions.append(state)
    described = stream_summary(info)
    described["partitions"] = partitions
    return described


class StreamLogs:
    """The event log of every partition of every stream, one per partition (made as first
    asked for): what every door reaches a partition through. ``events``/0 is
    :attr:`default`. Appends through them meet the schemas of ``schema_of``
    (``server.schemas.schema_of``)."""

    def __init__(
        self,
        registry: StreamRegistry,
        store: Streams,
        lifecycle: ConsumerLifecycle,
        schema_of: SchemaOf | None = None,
    ) -> None:
        self._registry = registry
        self._store = store
        self._lifecycle = lifecycle
        self._schema_of = schema_of
        self._guards: dict[str, StreamGuard] = {}
        self._logs: dict[int, EventLog] = {}
        self.default = self.partition(DEFAULT_PARTITION)
        #: The lists handed out, while the registry stays at ``_version``.
        self._lists: dict[str, list[EventLog]] = {}
        self._version = registry.version

    def partition(self, partition: Partition) -> EventLog:
        """The log of ``partition``."""
        found = self._logs.get(partition.key)
        if found is None:
            guard = self._guards.get(partition.stream)
            if guard is None:
                guard = self._guards[partition.stream] = self.guard(partition.stream)
            store_log = self._store.partition_log(partition)
            found = EventLog(store_log, self._lifecycle, guard, self._schema_of)
            self._logs[partition.key] = found
        return found

    def guard(self, stream: str) -> StreamGuard:
        """The rights checks of the stream named ``stream`` (it need not exist)."""
        return StreamGuard(self._registry.access, stream)

    def partitions(self, name: str) -> list[EventLog] | None:
        """The logs of the stream's partitions, partition ``n`` at index ``n``; None when
        there is no such stream."""
        if self._version != self._registry.version:
            self._lists.clear()
            self._version = self._registry.version
        logs = self._lists.get(name)
        if logs is not None:
            return logs
        info = self._registry.get(name)
        if info is None:
            return None
        logs = self._lists[name] = [self.partition(partition) for partition in info.partitions]
        return logs

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after each change of the registry (a stream grown, say)."""
        return self._registry.listen(callback)

    async def consumer_counts(self, who: Principal) -> dict[int, int]:
        """The consumers ``who`` is shown, counted by partition key: on each stream they may
        read, everyone's where they manage it (every stream, for an admin), else their own
        (one read, two when they manage a stream)."""
        if who.is_admin:
            return await self._store.consumer_counts(None)
        access = self._registry.access
        readable = [info for info in self._registry if access.allows(who, Right.READ, info.name)]
        managed = {info.name for info in readable if access.allows(who, Right.MANAGE, info.name)}
        own = await self._store.consumer_counts(who.user_id)
        everyone = await self._store.consumer_counts(None) if managed else {}
        counts: dict[int, int] = {}
        for info in readable:
            shown = everyone if info.name in managed else own
            for partition in info.partitions:
                count = shown.get(partition.key)
                if count:
                    counts[partition.key] = count
        return counts
