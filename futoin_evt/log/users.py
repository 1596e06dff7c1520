"""Users, SAS policies and rights changed by an admin at a door (the web console, the ops
iface's grant calls), as the command line changes them with ``--db``: the store's users and
grants (:mod:`.access`'s :func:`~.access.grant` and :func:`~.access.revoke`), then the rights
reloaded here and in the other workers before the answer (a removed user's sessions and
connections end with it, as :class:`~.access.AccessControl` ends those of a user that is
gone)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..auth.sas import claims_text, is_policy, parse_claims, policy_hash, sas_key
from ..domain.principal import Principal
from ..domain.rights import Grant, Right, check_pattern
from ..storage.user_roles import ScramCredential, User, UserStore
from . import access
from .access import AccessControl, Refused

#: How long a user name may be (as ``futoin-evt user add`` says).
MAX_USER_NAME: Final = 64
#: What the console tells a user who is no admin.
MANAGE_USERS: Final = "only admin users manage users and their rights"
#: What the ops iface's grant calls tell a user who is no admin.
GRANT_RIGHTS: Final = "only admin users grant, revoke and show rights"


class AdminsOnly(Refused):
    def __init__(self, text: str = MANAGE_USERS) -> None:
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class UserAdmin:
    """Every call needs ``who`` to be an admin (:class:`AdminsOnly` otherwise)."""

    store: UserStore
    control: AccessControl
    #: The server's SAS secret, which a policy's key derives from (None: it takes no SAS).
    sas_secret: bytes | None = None
    #: What a user who is no admin is told (each door says it its own way).
    refusal: str = MANAGE_USERS

    async def users(self, who: Principal) -> list[User]:
        self._admin(who)
        return sorted(await self.store.list_users(), key=lambda user: user.name)

    async def describe(self, who: Principal, name: str) -> dict[str, Any]:
        """As ``futoin-evt user show``: name, admin, grants; :class:`~.access.UnknownUser`."""
        self._admin(who)
        return await access.describe_user(self.store, name)

    async def principal(self, who: Principal, name: str) -> Principal:
        """The user ``name`` as the rights see them (to tell what they may do)."""
        self._admin(who)
        user = await self.store.get_user(name)
        if user is None:
            raise access.UnknownUser(name)
        return Principal(user.id, user.name, is_admin=user.is_admin)

    async def add(
        self,
        who: Principal,
        name: str,
        password_hash: str,
        *,
        is_admin: bool,
        scram: Sequence[ScramCredential] = (),
    ) -> None:
        """ValueError for a name the command line would refuse; KeyError when it is taken.
        ``scram``: the SCRAM credentials of the same password, stored with its hash."""
        self._admin(who)
        _check_name(name, "user")
        await self.store.add_user(name, password_hash, is_admin=is_admin, scram=scram)
        await self.control.changed_here()

    async def remove(self, who: Principal, name: str) -> bool:
        """False when there is no such user. An admin cannot remove themselves (the last
        admin would be gone, and with them the way back in)."""
        self._admin(who)
        if name == who.name:
            raise ValueError("you cannot remove yourself: another admin can")
        removed = await self.store.remove_user(name)
        if removed:
            await self.control.changed_here()
        return removed

    async def grant(self, who: Principal, name: str, rights: str, pattern: str) -> Grant:
        """:class:`~futoin_evt.domain.rights.BadGrant`, :class:`~.access.UnknownUser`."""
        self._admin(who)
        granted = await access.grant(self.store, name, rights, pattern)
        await self.control.changed_here()
        return granted

    async def revoke(self, who: Principal, name: str, rights: str, pattern: str) -> bool:
        self._admin(who)
        taken = await access.revoke(self.store, name, rights, pattern)
        await self.control.changed_here()
        return taken

    async def policies(self, who: Principal) -> list[tuple[str, str]]:
        """SAS policies as ``futoin-evt sas policy list`` shows them: (name, claims on
        patterns), by name."""
        self._admin(who)
        grants = await self.store.list_grants()
        return [
            (
                user.name,
                "; ".join(
                    f"{claims_text(Right(g.rights))} on {g.pattern}"
                    for g in grants
                    if g.user_id == user.id
                )
                or "no claims",
            )
            for user in await self.users(who)
            if is_policy(user)
        ]

    async def add_policy(self, who: Principal, name: str, pattern: str, claims: str) -> str:
        """A new SAS policy with ``claims`` (``Send,Listen,Manage``) on ``pattern``, as
        ``futoin-evt sas policy add``; its key. :class:`~futoin_evt.domain.rights.BadGrant`,
        ValueError for a bad name or a server without a SAS secret, KeyError when taken."""
        self._admin(who)
        if self.sas_secret is None:
            raise ValueError("this server has no SAS secret: it takes no SAS tokens")
        checked, rights = check_pattern(pattern), parse_claims(claims)
        _check_name(name, "policy")
        user_id = await self.store.add_user(name, policy_hash())
        await self.store.grant(user_id, checked, int(rights))
        await self.control.changed_here()
        user = await self.store.get_user(name)
        assert user is not None
        return sas_key(self.sas_secret, user)

    async def remove_policy(self, who: Principal, name: str) -> bool:
        """False when there is no such policy (a user is not one); its key stops working."""
        self._admin(who)
        user = await self.store.get_user(name)
        if user is None or not is_policy(user):
            return False
        return await self.remove(who, name)

    def _admin(self, who: Principal) -> None:
        if not who.is_admin:
            raise AdminsOnly(self.refusal)


def _check_name(name: str, kind: str) -> None:
    if not name or len(name) > MAX_USER_NAME or ":" in name or not name.isprintable():
        raise ValueError(f"a {kind} name is 1 to {MAX_USER_NAME} characters without ':'")
