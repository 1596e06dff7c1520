"""FTN8 basic authentication as the official FutoIn client does it: ``sec = "user:password"``.

Passwords are stored as salted scrypt hashes. Checking one costs tens of milliseconds by
design, and every FTN3 request carries the password, so a successful check is remembered for a
short time under a keyed digest of the credentials; the most recent ``sec`` is also kept as
given, so a connection repeating it skips even the digest. Nothing of it is logged or stored.
When a user's password changes or the user is removed (:meth:`Authenticator.users_changed`,
told by :class:`~futoin_evt.log.access.AccessControl` as soon as the database says so), what
was remembered of them is forgotten, and what logged in as them ends: the connections that
:meth:`Authenticator.watch_user` or :meth:`Authenticator.bind` registered.

Checks are limited per peer address: one hash at a time, and at most
:data:`MAX_WAITING_CHECKS` waiting behind it; more are refused at once. A peer that floods
wrong passwords slows only itself, and holds one thread of the pool at most.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Final

from ..domain.management import AUTH_FAILED
from ..domain.principal import NotAuthenticated, Principal
from ..domain.stream import UserId
from ..stats import BAD_CREDENTIALS, TOO_MANY_CHECKS, Refusals, current_door
from ..storage.user_roles import UserSource
from .login_log import log_failed_login

if TYPE_CHECKING:
    from ..domain.management import ManagementBus
    from ..ftn3.calls import PeerLink

logger = logging.getLogger(__name__)

_SCRYPT_N: Final = 2**14
_SCRYPT_R: Final = 8
_SCRYPT_P: Final = 1
_SALT_BYTES: Final = 16
_HASH_BYTES: Final = 32
USER_NAME_MAX: Final = 64
#: Password checks one peer address may have waiting while one of its checks runs.
MAX_WAITING_CHECKS: Final = 8


def hash_password(password: str) -> str:
    """``scrypt$N$r$p$salt$hash`` with a fresh random salt."""
    salt = os.urandom(_SALT_BYTES)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P)
    return "$".join(
        ("scrypt", str(_SCRYPT_N), str(_SCRYPT_R), str(_SCRYPT_P), _b64(salt), _b64(digest))
    )


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(expected, actual)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=_HASH_BYTES, maxmem=64 * 1024 * 1024
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


TOO_MANY_CHECKS_TEXT: Final = "Too many credential checks at once from this address"
#: Why a connection of a user whose password changed (or who was removed) is closed.
CREDENTIALS_CHANGED: Final = "the user's password changed or the user was removed: log in again"


class _PeerChecks:
    """The password checks of one peer address: one runs, a few wait."""

    __slots__ = ("lock", "queued")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.queued = 0


class Authenticator:
    """Turns a request's ``sec`` into a :class:`Principal`, or raises SecurityError."""

    def __init__(
        self,
        users: UserSource,
        *,
        cache_seconds: float = 30.0,
        cache_size: int = 10_000,
        notices: ManagementBus | None = None,
    ) -> None:
        self._users = users
        #: Refused logins by door and reason (read by the metrics).
        self.refusals = Refusals()
        #: Told of each failed login (``authFailed``), when given.
        self.notices = notices
        self._cache_seconds = cache_seconds
        self._cache_size = cache_size
        self._key = os.urandom(32)
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[Principal]] = {}
        self._checks_by_peer: dict[str, _PeerChecks] = {}
        # The most recent credentials, compared as given: most connections repeat one ``sec``.
        self._last_sec: str | dict[str, Any] | None = None
        self._last: tuple[Principal, float] = (Principal(UserId(0), "", False), 0.0)
        #: What ends when a user's credentials change, by user id (see :meth:`watch_user`).
        self._watches: dict[UserId, dict[object, Callable[[], None]]] = {}
        #: Moves on with every change of users: a check that began before is not remembered.
        self._generation = 0

    # -- what ends when a user's credentials change ------------------------------------------

    def watch_user(self, who: Principal, on_ended: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_ended`` once, when ``who``'s password changes or they are removed;
        returns how to stop watching."""
        key = object()
        self._watches.setdefault(who.user_id, {})[key] = on_ended
        return lambda: self._unwatch(who.user_id, key)

    def bind(self, who: Principal, link: PeerLink) -> None:
        """``link`` (an FTN3 connection) acted as ``who``: it is closed when their
        credentials change. Cheap when already bound (it is called on every call)."""
        watches = self._watches.get(who.user_id)
        if watches is not None and link in watches:
            return
        self._watches.setdefault(who.user_id, {})[link] = lambda: link.close_refused(
            CREDENTIALS_CHANGED
        )
        link.closed.add_done_callback(lambda _done: self._unwatch(who.user_id, link))

    def _unwatch(self, user_id: UserId, key: object) -> None:
        watches = self._watches.get(user_id)
        if watches is not None:
            watches.pop(key, None)
            if not watches:
                del self._watches[user_id]

    def users_changed(self, user_ids: Collection[UserId]) -> None:
        """These users' passwords changed, or they were removed: forget their verified
        credentials and end what logged in as them."""
        self._generation += 1
        self._pending.clear()  # checks under way may have read the user before
        for digest, (principal, _expires) in list(self._cache.items()):
            if principal.user_id in user_ids:
                del self._cache[digest]
        if self._last[0].user_id in user_ids:
            self._last_sec = None
        for user_id in user_ids:
            for on_ended in list(self._watches.pop(user_id, {}).values()):
                try:
                    on_ended()
                except Exception:
                    logger.exception("ending a connection of a changed user failed")

    def cached(self, sec: str | dict[str, Any]) -> Principal | None:
        """The caller, when these credentials were verified less than ``cache_seconds`` ago."""
        if sec is self._last_sec or sec == self._last_sec:
            principal, expires = self._last
            if expires > time.monotonic():
                return principal
        if not isinstance(sec, str):
            return None
        name, _, password = sec.partition(":")
        cached = self._cache.get(self._digest(name, password))
        if cached is None or cached[1] <= time.monotonic():
            return None
        self._last_sec, self._last = sec, cached
        return cached[0]

    def _digest(self, name: str, password: str) -> bytes:
        # surrogatepass: a lookup never fails; _split_credentials refuses such text anyway
        key = f"{name}\0{password}".encode("utf-8", "surrogatepass")
        return hmac.digest(self._key, key, "sha256")

    async def authenticate(self, sec: str | dict[str, Any], peer: str = "") -> Principal:
        """The caller with these credentials; ``peer`` is the address the check counts against.

        Raises :class:`~futoin_evt.domain.principal.NotAuthenticated` for wrong credentials
        and for a peer with too many checks at once.
        """
        try:
            name, password = _split_credentials(sec)
        except NotAuthenticated as exc:
            self.refusals.note(current_door(), BAD_CREDENTIALS)
            log_failed_login(current_door(), _given_name(sec), peer, str(exc))
            raise
        digest = self._digest(name, password)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            self._cache.move_to_end(digest)
            return cached[0]
        generation = self._generation
        pending = self._pending.get(digest)
        if pending is None:
            # Calls that arrive together with the same credentials share one slow check.
            pending = asyncio.ensure_future(self._verify_for(peer, name, password))
            self._pending[digest] = pending
            pending.add_done_callback(lambda done: self._settled(digest, done))
        try:
            principal = await asyncio.shield(pending)
        except NotAuthenticated as exc:
            reason = TOO_MANY_CHECKS if str(exc) == TOO_MANY_CHECKS_TEXT else BAD_CREDENTIALS
            self.refusals.note(current_door(), reason)
            log_failed_login(current_door(), name, peer, str(exc))
            if self.notices is not None:
                self.notices.publish(AUTH_FAILED, peer=peer, user=name[:64], reason=str(exc))
            raise
        if generation != self._generation:
            return principal  # users changed meanwhile: checked again next time
        self._cache[digest] = (principal, time.monotonic() + self._cache_seconds)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return principal

    def _settled(self, digest: bytes, done: asyncio.Future[Principal]) -> None:
        if self._pending.get(digest) is done:
            del self._pending[digest]
        if not done.cancelled():
            # Looked at: every caller may have gone (a connection closed during the check), and
            # asyncio would log a failure nobody retrieved as an error.
            done.exception()

    async def _verify_for(self, peer: str, name: str, password: str) -> Principal:
        checks = self._checks_by_peer.get(peer)
        if checks is None:
            checks = self._checks_by_peer[peer] = _PeerChecks()
        elif checks.queued > MAX_WAITING_CHECKS:
            raise NotAuthenticated(TOO_MANY_CHECKS_TEXT)
        checks.queued += 1
        try:
            async with checks.lock:
                return await self._verify(name, password)
        finally:
            checks.queued -= 1
            if not checks.queued:
                del self._checks_by_peer[peer]

    async def _verify(self, name: str, password: str) -> Principal:
        user = await self._users.get_user(name)
        if user is None:
            # Spend the same time as for a known user: no probing for user names.
            await asyncio.to_thread(verify_password, password, _dummy_hash())
            raise NotAuthenticated("Invalid credentials")
        if not await asyncio.to_thread(verify_password, password, user.password_hash):
            raise NotAuthenticated("Invalid credentials")
        return Principal(user.id, user.name, user.is_admin)


def _split_credentials(sec: str | dict[str, Any]) -> tuple[str, str]:
    if isinstance(sec, dict):
        name, password = sec.get("user"), sec.get("secret")
        if not isinstance(name, str) or not isinstance(password, str):
            raise NotAuthenticated("Invalid credentials")
    else:
        if sec.startswith("-"):
            raise NotAuthenticated("Only basic user:password authentication is supported")
        name, sep, password = sec.partition(":")
        if not sep:
            raise NotAuthenticated("Invalid credentials")
    if not name or len(name) > USER_NAME_MAX or not _is_unicode(name + password):
        raise NotAuthenticated("Invalid credentials")
    return name, password


def _given_name(sec: str | dict[str, Any]) -> str:
    """The user name credentials that cannot be checked name, for the log ("" for none)."""
    name = sec.get("user") if isinstance(sec, dict) else sec.partition(":")[0]
    return name if isinstance(name, str) and _is_unicode(name) else ""


def _is_unicode(text: str) -> bool:
    """False for text with lone surrogates, which has no UTF-8 form to hash."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@functools.cache
def _dummy_hash() -> str:
    return hash_password("futoin-evt: no such user")
