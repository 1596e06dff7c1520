"""Who may do what: the rules every door's calls into ``log/`` meet, in one place.

Every call a door makes into ``log/`` on a user's behalf (appends, reads, the consumer
lifecycle, the streams' administration) takes that user first, as ``who``; the rules are kept
here, and a door only maps :class:`Refused` (or the "no such" answer a call gives) to its
wire. A user sees, drops and seeks their own consumers (a user with ``manage`` on the stream,
and an admin, anyone's); adding streams takes ``manage`` on the name, as growing and dropping
one does.

:class:`AccessControl` keeps every user's :class:`~futoin_evt.domain.rights.Rights`, built
from the database's grants. A check is one dictionary lookup and a bit test. Grants are
reloaded when this process changes them, when a worker of the same server says it did
(:meth:`AccessControl.changed`), and when the store's access version moves (any process on
the database, ``futoin-evt grant --db`` too, changed users, grants, SAS policies or schemas):
on PostgreSQL a notification says so at once, on SQLite the version is read every
``follow_seconds`` (a few microseconds on the event loop). A reload that takes a right away
ends what depended on it: each long-lived reader (a push stream, a subscription, an AMQP
link, a console tail) registers with :meth:`AccessControl.watch` and is called back. A user
whose password changed, who was removed or whose admin flag changed loses everything at
once: every watch of theirs is called back, and :attr:`AccessControl.users_changed`'s
callbacks end their connections and forget their verified credentials.

A refusal names the right and the stream and nothing else: a caller without any right on a
name is refused the same way whether the stream exists or not, so names cannot be probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ..domain.principal import Principal
from ..domain.rights import (
    ADMIN_RIGHTS,
    NO_RIGHTS,
    Grant,
    Right,
    Rights,
    check_pattern,
    parse_rights,
    rights_text,
)
from ..domain.stream import UserId
from ..storage.user_roles import ChangeSource, GrantRow, GrantSource, GrantStore, User

logger = logging.getLogger(__name__)

#: How often grants are reloaded when nothing said they changed: without a change source,
#: or as the fallback of one that notifies every change (PostgreSQL).
DEFAULT_REFRESH_SECONDS: Final = 5.0
#: How often the access version is read where changes are not notified (SQLite).
DEFAULT_FOLLOW_SECONDS: Final = 0.05


class Refused(Exception):
    """The acting user may not make this call; one sentence for the user."""


class AccessDenied(Refused):
    """A caller lacks ``right`` on ``stream``; the message is one sentence for the caller."""

    def __init__(self, right: Right, stream: str) -> None:
        self.right = right
        self.stream = stream
        super().__init__(f"the {rights_text(right)} right on stream {stream} is needed")


@dataclass(eq=False)
class _Watch:
    user_id: UserId
    right: Right
    stream: str
    on_revoked: Callable[[], None]
    cancelled: bool = field(default=False)


class AccessControl:
    """Every user's rights on streams, and what to end when a right goes."""

    def __init__(
        self,
        source: GrantSource,
        *,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        changes: ChangeSource | None = None,
        follow_seconds: float = DEFAULT_FOLLOW_SECONDS,
    ) -> None:
        self._source = source
        self._refresh_seconds = refresh_seconds
        self._changes = changes
        self._follow_seconds = follow_seconds
        #: The access version the rights in use were read at (-1: not yet).
        self._version = -1
        #: Each user's credentials as last read (name, password hash, admin), by id.
        self._users: dict[UserId, tuple[str, str, bool]] | None = None
        #: Called with the ids of the users whose password or admin flag changed, or who
        #: were removed (after their watches were called back).
        self.users_changed: list[Callable[[set[UserId]], None]] = []
        #: Awaited after a change heard from the database is in use (schemas follow it).
        self.followers: list[Callable[[], Awaitable[None]]] = []
        self._rows: list[GrantRow] = []
        self._by_user: dict[UserId, Rights] = {}
        self._watches: dict[UserId, set[_Watch]] = {}
        self._task: asyncio.Task[None] | None = None
        self._reloading: asyncio.Task[None] | None = None
        self._again = False
        #: The last reload failed (the database was away).
        self._failed = False
        #: The read of the access version that refusals of this moment wait for.
        self._freshening: asyncio.Future[bool] | None = None
        #: Tells the other workers of this server that grants changed (set when it has some);
        #: what it returns is done once they have the grants in use.
        self.tell_others: Callable[[], Awaitable[None]] | None = None

    async def start(self) -> None:
        """Load the grants, then keep reloading them in the background."""
        if self._changes is not None:
            self._version = await self._changes.access_version()
        await self.reload()
        if self._changes is not None:
            self._task = asyncio.get_running_loop().create_task(self._follow(self._changes))
        elif self._refresh_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._keep_fresh())

    async def close(self) -> None:
        for task in (self._task, self._reloading, self._freshening):
            if task is not None:
                task.cancel()
                # a read that failed was answered already (its refusal stood)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- checks --------------------------------------------------------------------------------

    def rights(self, caller: Principal) -> Rights:
        """What ``caller`` may do."""
        if caller.is_admin:
            return ADMIN_RIGHTS
        return self._by_user.get(caller.user_id, NO_RIGHTS)

    def allows(self, caller: Principal, right: Right | int, stream: str) -> bool:
        if caller.is_admin:
            return True
        rights = self._by_user.get(caller.user_id)
        wanted = int(right)
        return rights is not None and rights.mask(stream) & wanted == wanted

    def check(self, caller: Principal, right: Right | int, stream: str) -> None:
        """Raises :class:`AccessDenied` unless ``caller`` holds ``right`` on ``stream``."""
        if not caller.is_admin:
            rights = self._by_user.get(caller.user_id)
            wanted = int(right)
            if rights is None or rights.mask(stream) & wanted != wanted:
                raise AccessDenied(Right(right), stream)

    def watch(
        self, caller: Principal, right: Right, stream: str, on_revoked: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_revoked`` once, when ``caller`` no longer holds ``right`` on ``stream``;
        returns how to stop watching. Admins are not watched (their rights are whole)."""
        if caller.is_admin:
            return _nothing
        watch = _Watch(caller.user_id, right, stream, on_revoked)
        self._watches.setdefault(caller.user_id, set()).add(watch)

        def cancel() -> None:
            watch.cancelled = True
            watches = self._watches.get(watch.user_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[watch.user_id]

        return cancel

    # -- reloading -----------------------------------------------------------------------------

    def changed(self) -> None:
        """Grants changed (here or in a worker of this server): reload them soon."""
        if self._reloading is not None and not self._reloading.done():
            self._again = True
            return
        self._reloading = asyncio.get_running_loop().create_task(self._reload_soon())

    async def changed_here(self) -> None:
        """Grants changed in this process: returns once they are in use here and in the
        other workers of this server (so the next call of anyone, on any worker, is checked
        against them)."""
        told = self.tell_others() if self.tell_others is not None else None
        await self.catch_up()
        if told is not None:
            await told

    async def catch_up(self) -> None:
        """Grants changed (here, or a worker of this server says so): returns once they
        are in use."""
        self.changed()
        reloading = self._reloading
        if reloading is not None:
            await asyncio.shield(reloading)

    async def _reload_soon(self) -> None:
        while True:
            self._again = False
            try:
                await self.reload()
                self._failed = False
            except Exception:
                logger.exception("the grants could not be reloaded")
                self._failed = True
            if not self._again:
                return

    async def reload(self) -> None:
        """Read the grants (and the users, with a change source); when they changed, use
        them and end what lost its right, and everything of a user whose credentials
        changed."""
        rows = await self._source.list_grants()
        users = await self._changes.list_users() if self._changes is not None else None
        gone = self._users_gone(users) if users is not None else set()
        if rows != self._rows:
            self._rows = rows
            by_user: dict[UserId, list[Grant]] = {}
            for row in rows:
                by_user.setdefault(row.user_id, []).append(Grant(row.pattern, Right(row.rights)))
            self._by_user = {user: Rights(grants) for user, grants in by_user.items()}
            self._end_revoked()
        if gone:
            self._end_users(gone)

    def _users_gone(self, users: list[User]) -> set[UserId]:
        """The ids of the users known before whose credentials changed, or who went."""
        known = self._users
        now = {user.id: (user.name, user.password_hash, user.is_admin) for user in users}
        self._users = now
        if known is None:
            return set()
        return {user_id for user_id, was in known.items() if now.get(user_id) != was}

    def _end_users(self, gone: set[UserId]) -> None:
        """End everything of these users: first their connections (told to
        :attr:`users_changed`, so they are closed saying why), then every watch left."""
        for callback in list(self.users_changed):
            try:
                callback(gone)
            except Exception:
                logger.exception("ending what a changed user did failed")
        for user_id in gone:
            logger.info("user %s changed or was removed: ending their work", user_id)
            for watch in list(self._watches.pop(user_id, ())):
                if not watch.cancelled:
                    watch.cancelled = True
                    try:
                        watch.on_revoked()
                    except Exception:
                        logger.exception("ending what a changed user did failed")

    async def fresh(self) -> bool:
        """Read the access version now; when it moved, returns once the change is in use
        (True). For a refusal that may stem from a change not yet heard of: the refusals
        of one moment share one read."""
        if self._changes is None:
            return False
        if self._freshening is None or self._freshening.done():
            self._freshening = asyncio.ensure_future(self._read_fresh(self._changes))
        return await asyncio.shield(self._freshening)

    async def _read_fresh(self, changes: ChangeSource) -> bool:
        if await changes.access_version() == self._version:
            return False
        await self._heard()
        return True

    def _end_revoked(self) -> None:
        for user_id, watches in list(self._watches.items()):
            rights = self._by_user.get(user_id, NO_RIGHTS)
            for watch in list(watches):
                if not watch.cancelled and not rights.allows(watch.right, watch.stream):
                    watch.cancelled = True
                    watches.discard(watch)
                    try:
                        watch.on_revoked()
                    except Exception:
                        logger.exception("ending what a revoked right allowed failed")
            if not watches:
                self._watches.pop(user_id, None)

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_seconds)
            try:
                await self.reload()
            except Exception as exc:  # the database is away: keep the rights known
                logger.warning("the grants could not be reloaded: %s", exc)

    async def _follow(self, changes: ChangeSource) -> None:
        """Reload whenever the access version moves: woken by the store where it hears
        every change, else by a timer that peeks at the version every ``follow_seconds``
        (a plain callback, no task woken while it stays: measured, the wake-up is most of
        the cost, about 0.2 % of a core for 20 a second, the read 3 µs); the version is
        also read every ``refresh_seconds`` as a fallback."""
        woken = asyncio.Event()
        stop = changes.listen_access(woken.set)
        ticker: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()

        def peek() -> None:
            nonlocal ticker
            ticker = loop.call_later(self._follow_seconds, peek)
            if changes.peek_access_version() != self._version:
                woken.set()  # moved, or not known now: read it properly

        if not changes.hears_all_access_changes and self._follow_seconds > 0:
            ticker = loop.call_later(self._follow_seconds, peek)
        failed = False
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._refresh_seconds):
                        await woken.wait()
                woken.clear()
                try:
                    if await changes.access_version() != self._version:
                        await self._heard()
                    failed = False
                except Exception as exc:  # the database is away: keep the rights known
                    if not failed:
                        logger.warning("the access version could not be read: %s", exc)
                    failed = True
        finally:
            stop()
            if ticker is not None:
                ticker.cancel()

    async def _heard(self) -> None:
        """The access version moved: the grants and users, then the followers, are
        read again (the version first, so a change after it is heard again)."""
        assert self._changes is not None
        version = await self._changes.access_version()
        await self.catch_up()
        # a failed reload is tried again at the next turn
        self._version = -1 if self._failed else version
        for follower in list(self.followers):
            await follower()


def _nothing() -> None:
    pass


# -- the rules about consumers and streams -------------------------------------------------------


class Access(Protocol):
    """What checks rights: :class:`AccessControl`, or :data:`OPEN_ACCESS`."""

    def allows(self, caller: Principal, right: Right | int, stream: str) -> bool: ...

    def check(self, caller: Principal, right: Right | int, stream: str) -> None: ...

    def watch(
        self, caller: Principal, right: Right, stream: str, on_revoked: Callable[[], None]
    ) -> Callable[[], None]: ...

    async def catch_up(self) -> None:
        """Returns once the grants in the database are in use."""


class OpenAccess:
    """Everyone may do everything: for a log used by the server itself, or embedded in a
    program that has no users of its own (never behind a door)."""

    def allows(self, caller: Principal, right: Right | int, stream: str) -> bool:
        return True

    def check(self, caller: Principal, right: Right | int, stream: str) -> None:
        pass

    def watch(
        self, caller: Principal, right: Right, stream: str, on_revoked: Callable[[], None]
    ) -> Callable[[], None]:
        return _nothing

    async def catch_up(self) -> None:
        pass


OPEN_ACCESS: Final = OpenAccess()
#: The rights as plain ints, for the checks on every call (IntFlag arithmetic is slow).
_READ: Final = int(Right.READ)
_WRITE: Final = int(Right.WRITE)
_MANAGE: Final = int(Right.MANAGE)


class StreamGuard:
    """The checks of one stream's calls, shared by its partitions' logs and consumers."""

    __slots__ = ("access", "stream")

    def __init__(self, access: Access, stream: str) -> None:
        self.access = access
        self.stream = stream

    def read(self, who: Principal) -> None:
        """:class:`AccessDenied` unless ``who`` may read the stream."""
        self.access.check(who, _READ, self.stream)

    def write(self, who: Principal) -> None:
        self.access.check(who, _WRITE, self.stream)

    def manage(self, who: Principal) -> None:
        self.access.check(who, _MANAGE, self.stream)

    def some_right(self, who: Principal, needed: Right) -> None:
        """:class:`AccessDenied` naming ``needed`` unless ``who`` holds some right on the
        stream: only then may an answer tell whether the stream exists."""
        access, stream = self.access, self.stream
        if not (
            access.allows(who, Right.READ, stream)
            or access.allows(who, Right.WRITE, stream)
            or access.allows(who, Right.MANAGE, stream)
        ):
            raise AccessDenied(needed, stream)

    def watch(
        self, who: Principal, right: Right, on_revoked: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_revoked`` once ``who`` no longer holds ``right`` on the stream; returns
        how to stop watching (see :meth:`AccessControl.watch`)."""
        return self.access.watch(who, right, self.stream, on_revoked)

    def acts_for(self, who: Principal, owner: UserId | str) -> bool:
        """Whether ``who`` may see, drop and seek the consumers of ``owner`` (a user's id or
        name): their own (with read), or anyone's with manage on the stream (admins too)."""
        if owner in (who.user_id, who.name):
            return self.access.allows(who, Right.READ, self.stream)
        return self.access.allows(who, Right.MANAGE, self.stream)

    def shown_to(self, who: Principal) -> UserId | None:
        """Whose consumers a listing shows ``who``: None for everyone's (manage on the
        stream), else their own user id."""
        return None if self.access.allows(who, Right.MANAGE, self.stream) else who.user_id


# -- changing grants (the command line with --db, and the ops iface for admins) ----------------


class UnknownUser(KeyError):
    """No user of that name."""

    def __str__(self) -> str:
        return f"no user {self.args[0]}"


async def _user(store: GrantStore, name: str) -> User:
    user = await store.get_user(name) if isinstance(name, str) else None
    if user is None:
        raise UnknownUser(name)
    return user


async def grant(store: GrantStore, user_name: str, rights: str, pattern: str) -> Grant:
    """Give ``user_name`` the ``rights`` (a comma list) on ``pattern``; raises
    :class:`~futoin_evt.domain.rights.BadGrant` or :class:`UnknownUser`."""
    granted = Grant(check_pattern(pattern), parse_rights(rights))
    user = await _user(store, user_name)
    await store.grant(user.id, granted.pattern, int(granted.rights))
    return granted


async def revoke(store: GrantStore, user_name: str, rights: str, pattern: str) -> bool:
    """Take ``rights`` on ``pattern`` from ``user_name``; False when they held none of them
    there (a grant on another pattern is not touched)."""
    taken = Grant(check_pattern(pattern), parse_rights(rights))
    user = await _user(store, user_name)
    return await store.revoke(user.id, taken.pattern, int(taken.rights))


async def describe_user(store: GrantStore, user_name: str) -> dict[str, Any]:
    """A user as ``user show`` prints it: name, admin, and grants (pattern, rights list)."""
    user = await _user(store, user_name)
    rows = [row for row in await store.list_grants() if row.user_id == user.id]
    return {
        "name": user.name,
        "admin": user.is_admin,
        "grants": [
            {"pattern": row.pattern, "rights": rights_text(Right(row.rights)).split(",")}
            for row in rows
        ],
    }
