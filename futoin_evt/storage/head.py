"""Who is waiting for new events, and waking them when the newest event id moves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..domain.stream import UserId

#: Told of a claim: (user, component, the epoch it claimed).
ClaimListener = Callable[[UserId, str, int], None]
#: Told of a claim of an AMQP consumer group: (user, group, its claim number, its epoch).
GroupClaimListener = Callable[[UserId, str, int, int], None]


class HeadWatch:
    """A growing id (the newest committed event, a durable position) and its waiters.

    The store's writer advances it after each commit, so waiters wake without polling the
    database; a watcher advances it for events other processes commit to the same file.
    """

    def __init__(self, head: int = 0) -> None:
        self.head = head
        self._waiters: set[asyncio.Future[None]] = set()
        self._listeners: set[Callable[[], None]] = set()

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` whenever the head moves; returns the function that stops it."""
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    @property
    def waiting(self) -> int:
        return len(self._waiters) + len(self._listeners)

    def advance(self, head: int) -> None:
        if head <= self.head:
            return
        self.head = head
        for listener in list(self._listeners):
            listener()
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_beyond(self, event_id: int) -> None:
        """Return once the head is above ``event_id``."""
        while self.head <= event_id:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)


class ClaimWatch:
    """Claims of reliable consumers (a new epoch), for the push streams that held them, and
    of AMQP consumer groups (a new claim number), for the links that held them."""

    def __init__(self) -> None:
        self._listeners: set[ClaimListener] = set()
        self._group_listeners: set[GroupClaimListener] = set()

    def listen(self, callback: ClaimListener) -> Callable[[], None]:
        """Call ``callback`` on each claim; returns the function that stops it."""
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    def claimed(self, user_id: UserId, component: str, epoch: int) -> None:
        for listener in list(self._listeners):
            listener(user_id, component, epoch)

    def listen_groups(self, callback: GroupClaimListener) -> Callable[[], None]:
        """Call ``callback`` on each claim of a consumer group; returns how to stop."""
        self._group_listeners.add(callback)
        return lambda: self._group_listeners.discard(callback)

    def group_claimed(self, user_id: UserId, group: str, claim: int, epoch: int) -> None:
        for listener in list(self._group_listeners):
            listener(user_id, group, claim, epoch)


class SharedLook:
    """One read of a value (the newest committed id) shared by those who ask for it at once,
    as a group commit shares a commit: each gets the result of a read that started after it
    asked. Those who ask while a read runs wait for the next one, which starts when it ends:
    at most one read runs, and one waits to."""

    def __init__(self, read: Callable[[], Awaitable[int]]) -> None:
        self._read = read
        self._running: asyncio.Future[int] | None = None
        self._next: asyncio.Future[int] | None = None

    async def get(self) -> int:
        if self._running is None:
            look = self._running = self._start()
        else:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
                self._next.add_done_callback(_retrieve)
            look = self._next
        return await asyncio.shield(look)  # a caller that gives up leaves it to the others

    def _start(self) -> asyncio.Future[int]:
        running = asyncio.ensure_future(self._read())
        running.add_done_callback(self._ended)
        return running

    def _ended(self, ended: asyncio.Future[int]) -> None:
        _retrieve(ended)
        self._running = None
        waiting, self._next = self._next, None
        if waiting is not None:
            self._running = self._start()
            self._running.add_done_callback(lambda done: _pass_on(done, waiting))


def _pass_on(done: asyncio.Future[int], to: asyncio.Future[int]) -> None:
    if done.cancelled():
        to.cancel()
    elif (exc := done.exception()) is not None:
        to.set_exception(exc)
    else:
        to.set_result(done.result())


def _retrieve(done: asyncio.Future[int]) -> None:
    """Nobody may be left to take a failure: it is not logged as never retrieved."""
    if not done.cancelled():
        done.exception()
