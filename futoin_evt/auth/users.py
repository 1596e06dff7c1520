"""FTN8 basic authentication as the official FutoIn client does it: ``sec = "user:password"``.

Passwords are stored as salted scrypt hashes. Checking one costs tens of milliseconds by
design, and every FTN3 request carries the password, so a successful check is remembered for a
short time under a keyed digest of the credentials; the most recent ``sec`` is also kept as
given, so a connection repeating it skips even the digest. Nothing of it is logged or stored.
A removed user or a changed password is therefore refused at most ``cache_seconds`` later.

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
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..domain.management import AUTH_FAILED
from ..domain.principal import Principal
from ..domain.stream import UserId
from ..ftn3.errors import SECURITY_ERROR, FTN3Error
from ..stats import BAD_CREDENTIALS, TOO_MANY_CHECKS, Refusals, current_door

if TYPE_CHECKING:
    from ..domain.management import ManagementBus

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


class _PeerChecks:
    """The password checks of one peer address: one runs, a few wait."""

    __slots__ = ("lock", "queued")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.queued = 0


class UserSource(Protocol):
    async def get_user(self, name: str) -> Any: ...


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

        Raises FTN3Error(SecurityError) for wrong credentials and for a peer with too many
        checks at once.
        """
        try:
            name, password = _split_credentials(sec)
        except FTN3Error:
            self.refusals.note(current_door(), BAD_CREDENTIALS)
            raise
        digest = self._digest(name, password)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            self._cache.move_to_end(digest)
            return cached[0]
        pending = self._pending.get(digest)
        if pending is None:
            # Calls that arrive together with the same credentials share one slow check.
            pending = asyncio.ensure_future(self._verify_for(peer, name, password))
            self._pending[digest] = pending
            pending.add_done_callback(lambda done: self._settled(digest, done))
        try:
            principal = await asyncio.shield(pending)
        except FTN3Error as exc:
            reason = TOO_MANY_CHECKS if exc.desc == TOO_MANY_CHECKS_TEXT else BAD_CREDENTIALS
            self.refusals.note(current_door(), reason)
            if self.notices is not None:
                self.notices.publish(AUTH_FAILED, peer=peer, user=name[:64], reason=exc.desc)
            raise
        self._cache[digest] = (principal, time.monotonic() + self._cache_seconds)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return principal

    def _settled(self, digest: bytes, done: asyncio.Future[Principal]) -> None:
        self._pending.pop(digest, None)
        if not done.cancelled():
            # Looked at: every caller may have gone (a connection closed during the check), and
            # asyncio would log a failure nobody retrieved as an error.
            done.exception()

    async def _verify_for(self, peer: str, name: str, password: str) -> Principal:
        checks = self._checks_by_peer.get(peer)
        if checks is None:
            checks = self._checks_by_peer[peer] = _PeerChecks()
        elif checks.queued > MAX_WAITING_CHECKS:
            raise FTN3Error(SECURITY_ERROR, TOO_MANY_CHECKS_TEXT)
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
            raise FTN3Error(SECURITY_ERROR, "Invalid credentials")
        if not await asyncio.to_thread(verify_password, password, user.password_hash):
            raise FTN3Error(SECURITY_ERROR, "Invalid credentials")
        return Principal(user.id, user.name, user.is_admin)


def _split_credentials(sec: str | dict[str, Any]) -> tuple[str, str]:
    if isinstance(sec, dict):
        name, password = sec.get("user"), sec.get("secret")
        if not isinstance(name, str) or not isinstance(password, str):
            raise FTN3Error(SECURITY_ERROR, "Invalid credentials")
    else:
        if sec.startswith("-"):
            raise FTN3Error(SECURITY_ERROR, "Only basic user:password authentication is supported")
        name, sep, password = sec.partition(":")
        if not sep:
            raise FTN3Error(SECURITY_ERROR, "Invalid credentials")
    if not name or len(name) > USER_NAME_MAX or not _is_unicode(name + password):
        raise FTN3Error(SECURITY_ERROR, "Invalid credentials")
    return name, password


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
