"""Users, their grants and the SAS policies, for admins, through
:class:`~futoin_evt.log.users.UserAdmin` (which refuses anyone else)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final
from urllib.parse import quote

from ..auth.sas import is_policy
from ..auth.scram import scram_credentials
from ..auth.users import hash_password
from ..domain.rights import BadGrant, Right
from ..log.access import UnknownUser
from ..log.users import UserAdmin
from .exchange import Call, ConsoleResponse, PageError, Routes
from .formatting import PAGE_SIZE, said
from .pages import Pages

#: The rights as the users pages name them.
_RIGHT_LABELS: Final = ((Right.READ, "read"), (Right.WRITE, "write"), (Right.MANAGE, "manage"))


class UserPages:
    def __init__(self, pages: Pages) -> None:
        self._pages = pages
        #: Users and their rights (None: no users pages).
        self.admin: UserAdmin | None = None

    def routes(self) -> Routes:
        return {
            ("GET", "/users"): self._users_page,
            ("GET", "/user"): self._user_page,
            ("POST", "/users/add"): self._add_user,
            ("POST", "/users/remove"): self._remove_user,
            ("POST", "/users/grant"): self._change_grant,
            ("POST", "/users/revoke"): self._change_grant,
            ("POST", "/users/policies/add"): self._add_policy,
            ("POST", "/users/policies/remove"): self._remove_policy,
        }

    def _user_admin(self) -> UserAdmin:
        if self.admin is None:
            raise PageError(404, "Users are not managed in this console.")
        return self.admin

    async def _users_page(
        self, call: Call, added: tuple[str, str] | None = None
    ) -> ConsoleResponse:
        """The users, then the SAS policies; ``added``: a policy just added and its key,
        shown in this answer only (never kept)."""
        admin = self._user_admin()
        users = await admin.users(call.principal)
        grants = await self._grants_by_user(call, [u.name for u in users])
        rows = [
            {"user": u, "policy": is_policy(u), "grants": grants.get(u.name, [])} for u in users
        ]
        return self._pages.page(
            call.session,
            "users.html",
            rows=rows,
            policies=await admin.policies(call.principal),
            sas=admin.sas_secret is not None,
            added=added,
            notice=await self._pages.notice(call),
            principal=call.principal,
        )

    async def _add_policy(self, call: Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "").strip()
        claims = ",".join(c for c in ("Send", "Listen", "Manage") if form.get(c.lower()) == "1")
        if not claims:
            raise PageError(400, "Tick at least one claim.")
        try:
            key = await admin.add_policy(
                call.principal, name, form.get("pattern", "").strip(), claims
            )
        except (ValueError, BadGrant) as exc:
            raise PageError(400, said(exc)) from None
        except KeyError:
            raise PageError(409, f"A user or policy named {name} exists already.") from None
        return await self._users_page(call, (name, key))

    async def _remove_policy(self, call: Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "")
        if not await admin.remove_policy(call.principal, name):
            raise PageError(404, f"No such SAS policy: {name[:64]}.")
        notice = f"Removed SAS policy {name}: its key no longer works."
        return await self._pages.noticed(call, notice, "/users")

    async def _grants_by_user(self, call: Call, names: list[str]) -> dict[str, list[str]]:
        admin = self._user_admin()
        shown: dict[str, list[str]] = {}
        for name in names[: PAGE_SIZE * 4]:
            with contextlib.suppress(UnknownUser):  # removed meanwhile
                described = await admin.describe(call.principal, name)
                shown[name] = [
                    f"{','.join(g['rights'])} on {g['pattern']}" for g in described["grants"]
                ]
        return shown

    async def _user_page(self, call: Call) -> ConsoleResponse:
        admin, who = self._user_admin(), call.principal
        name = call.query.get("name", "")
        try:
            described = await admin.describe(who, name)
            user = await admin.principal(who, name)
        except UnknownUser:
            raise PageError(404, f"No such user: {name[:64]}.") from None
        streams = self._pages.streams
        access = streams.access
        may = [
            {
                "stream": info.name,
                "rights": [
                    label for right, label in _RIGHT_LABELS if access.allows(user, right, info.name)
                ],
            }
            for info in sorted(streams, key=lambda info: info.name)
        ]
        return self._pages.page(
            call.session,
            "user.html",
            user=described,
            may=[m for m in may if m["rights"]],
            notice=await self._pages.notice(call),
            principal=who,
        )

    async def _add_user(self, call: Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name, password = form.get("name", "").strip(), form.get("password", "")
        if not password:
            raise PageError(400, "Give the new user a password.")
        try:
            await admin.add(
                call.principal,
                name,
                await asyncio.to_thread(hash_password, password),
                is_admin=form.get("admin") == "1",
                scram=await asyncio.to_thread(scram_credentials, password),
            )
        except ValueError as exc:
            raise PageError(400, said(exc)) from None
        except KeyError:
            raise PageError(409, f"The user {name} exists already.") from None
        return await self._user_done(call, name, f"Added user {name}.")

    async def _remove_user(self, call: Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "")
        if form.get("confirm", "") != name:
            raise PageError(400, f"Type the user's name, {name[:64]}, to remove them.")
        try:
            removed = await admin.remove(call.principal, name)
        except ValueError as exc:
            raise PageError(400, said(exc)) from None
        if not removed:
            raise PageError(404, f"No such user: {name[:64]}.")
        notice = f"Removed user {name} and their consumers."
        return await self._pages.noticed(call, notice, "/users")

    async def _change_grant(self, call: Call) -> ConsoleResponse:
        """A grant (``/users/grant``) or a revoke (``/users/revoke``) of the rights ticked
        (``read``, ``write``, ``manage``) on a pattern."""
        admin, form = self._user_admin(), call.form
        name, pattern = form.get("name", ""), form.get("pattern", "").strip()
        rights = ",".join(r for r in ("read", "write", "manage") if form.get(r) == "1")
        if not rights:
            raise PageError(400, "Tick at least one right.")
        granting = call.path == "/users/grant"
        try:
            if granting:
                await admin.grant(call.principal, name, rights, pattern)
                notice = f"Granted {rights} on {pattern} to {name}."
            elif await admin.revoke(call.principal, name, rights, pattern):
                notice = f"Revoked {rights} on {pattern} from {name}."
            else:
                notice = f"{name} held none of {rights} on {pattern}: nothing revoked."
        except UnknownUser:
            raise PageError(404, f"No such user: {name[:64]}.") from None
        except BadGrant as exc:
            raise PageError(400, said(exc)) from None
        return await self._user_done(call, name, notice)

    async def _user_done(self, call: Call, name: str, notice: str) -> ConsoleResponse:
        return await self._pages.noticed(call, notice, f"/user?name={quote(name, safe='')}")
