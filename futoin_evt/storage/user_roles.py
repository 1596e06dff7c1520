"""The store roles of users, their credentials and their rights: what a login, the rights
in use and an admin's changes read and write (part of the contract of :mod:`.base`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..domain.stream import UserId


@dataclass(frozen=True, slots=True)
class User:
    id: UserId
    name: str
    password_hash: str
    is_admin: bool


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's SCRAM credential for one mechanism (RFC 5802): what checks a client's proof
    and signs the server's answer, never the salted password."""

    #: ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``.
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class UserSource(Protocol):
    """Who a name is: what checks a password or a SAS token reads."""

    async def get_user(self, name: str) -> User | None: ...


class ScramSource(Protocol):
    """Users' SCRAM credentials: what a SCRAM login reads."""

    async def scram_credential(self, user_id: UserId, mechanism: str) -> ScramCredential | None:
        """None when the user has none for ``mechanism`` (their password was set before the
        server kept SCRAM credentials, or they have no password)."""


class Users(UserSource, Protocol):
    """Users and their password hashes (hashed by the caller), with the SCRAM credentials
    of the same password (derived by the caller) stored in the same transaction."""

    async def add_user(
        self,
        name: str,
        password_hash: str,
        *,
        is_admin: bool = False,
        scram: Sequence[ScramCredential] = (),
    ) -> UserId:
        """Raises KeyError when the name is taken."""

    async def set_password(
        self, name: str, password_hash: str, scram: Sequence[ScramCredential] = ()
    ) -> bool:
        """The user's SCRAM credentials become ``scram`` (the old ones go)."""

    async def remove_user(self, name: str) -> bool:
        """Remove a user and their consumers."""

    async def list_users(self) -> list[User]: ...


class GrantRow(NamedTuple):
    """Rights (a :class:`~futoin_evt.domain.rights.Right` mask) of a user on a pattern."""

    user_id: UserId
    pattern: str
    rights: int


class GrantSource(Protocol):
    """What the rights in use are built from."""

    async def list_grants(self) -> list[GrantRow]:
        """Every grant that holds a right, by user id and pattern."""


class GrantStore(GrantSource, UserSource, Protocol):
    """Rights per user and stream pattern (checked by the caller), changed by user name."""

    async def grant(self, user_id: UserId, pattern: str, rights: int) -> None:
        """Add ``rights`` to what the user holds on ``pattern``."""

    async def revoke(self, user_id: UserId, pattern: str, rights: int) -> bool:
        """Take ``rights`` away from what the user holds on ``pattern``; False when they
        held none of them there."""


class UserStore(GrantStore, Users, Protocol):
    """Users, SAS policies and their rights, as an admin manages them."""


class AccessChanges(Protocol):
    """What tells that users, grants, SAS policies or schemas changed, in any process on
    the database."""

    async def access_version(self) -> int:
        """A number every change of users, grants and schema versions moves on, in any
        process (:mod:`.changes_sql`): cheap to read."""

    def peek_access_version(self) -> int | None:
        """:meth:`access_version` read at once, without waiting (SQLite: on the event loop);
        None when it cannot be now."""

    def listen_access(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when this store hears of such a change (PostgreSQL: any
        process's; SQLite: none, the version is read); returns how to stop."""

    @property
    def hears_all_access_changes(self) -> bool:
        """True when :meth:`listen_access` hears every process's changes."""


class Grants(GrantStore, AccessChanges, Protocol):
    """Rights per user and stream pattern, and the version their changes move on."""


class ChangeSource(AccessChanges, Protocol):
    """What the rights in use follow: the changes, and the users as they are now (a user
    whose credentials changed loses what they did)."""

    async def list_users(self) -> list[User]: ...
