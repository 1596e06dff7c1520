"""``futoin-evt grant``, ``revoke`` and ``user show``: rights on streams, in the database
(``--db``) or on a running server (``--url``, through the ops iface, admins only)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from ..domain.rights import BadGrant, check_pattern, parse_rights
from ..log import access
from ..storage.user_roles import GrantStore
from .common import BadSetting, Commands, OnServer, acting_where, add_where, print_json

#: The ops iface's errors for a bad grant and an unknown user (exit 2, as here).
INVALID_GRANT = "InvalidGrant"
UNKNOWN_USER = "UnknownUser"

_PATTERN_HELP = "a stream name, a prefix ending in * (orders*), or * for every stream"
_RIGHTS_HELP = "a comma list of read, write and manage"


def add_commands(commands: Commands) -> None:
    grant = commands.add_parser("grant", help="give a user rights on streams")
    revoke = commands.add_parser("revoke", help="take rights on streams from a user")
    for parser, run, whose in (
        (grant, _grant, "the user who gets the rights"),
        (revoke, _revoke, "the user who loses the rights"),
    ):
        parser.add_argument("grantee", metavar="USER", help=whose)
        parser.add_argument("rights", metavar="RIGHTS", help=_RIGHTS_HELP)
        parser.add_argument("pattern", metavar="PATTERN", help=_PATTERN_HELP)
        add_where(parser, acting="--as")
        parser.set_defaults(run=run, acting_option="--as")


def add_show(user_commands: Any) -> None:
    """``user show USER``: its grants."""
    show = user_commands.add_parser("show", help="a user's rights on streams")
    show.add_argument("name", metavar="NAME", help="the user")
    show.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_where(show, acting="--as")
    show.set_defaults(run=_show, acting_option="--as")


class GrantTarget(Protocol):
    async def grant(self, user: str, rights: str, pattern: str) -> None: ...

    async def revoke(self, user: str, rights: str, pattern: str) -> bool: ...

    async def show(self, user: str) -> dict[str, Any]: ...


class _InDatabase:
    def __init__(self, store: GrantStore) -> None:
        self._store = store

    async def grant(self, user: str, rights: str, pattern: str) -> None:
        await access.grant(self._store, user, rights, pattern)

    async def revoke(self, user: str, rights: str, pattern: str) -> bool:
        return await access.revoke(self._store, user, rights, pattern)

    async def show(self, user: str) -> dict[str, Any]:
        return await access.describe_user(self._store, user)


class _OnServer(OnServer):
    bad_input = (INVALID_GRANT, UNKNOWN_USER)

    async def grant(self, user: str, rights: str, pattern: str) -> None:
        await self.call("grantRights", {"user": user, "rights": rights, "pattern": pattern})

    async def revoke(self, user: str, rights: str, pattern: str) -> bool:
        params = {"user": user, "rights": rights, "pattern": pattern}
        return bool(await self.call("revokeRights", params))

    async def show(self, user: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("showUser", {"user": user})
        return result


@contextlib.asynccontextmanager
async def _admin(args: argparse.Namespace) -> AsyncIterator[GrantTarget]:
    acting: contextlib.AbstractAsyncContextManager[GrantTarget]
    acting = acting_where(args, _OnServer, _InDatabase)
    try:
        async with acting as admin:
            yield admin
    except access.UnknownUser as exc:
        raise BadSetting(f"{exc}.") from None


def _checked(args: argparse.Namespace) -> None:
    """Bad rights or a bad pattern exit 2 before the database or the server is touched."""
    try:
        parse_rights(args.rights)
        check_pattern(args.pattern)
    except BadGrant as exc:
        raise BadSetting(f"{exc}.") from None


async def _grant(args: argparse.Namespace) -> int:
    _checked(args)
    async with _admin(args) as admin:
        await admin.grant(args.grantee, args.rights, args.pattern)
    print(f"granted {args.grantee} {args.rights} on {args.pattern}")
    return 0


async def _revoke(args: argparse.Namespace) -> int:
    _checked(args)
    async with _admin(args) as admin:
        taken = await admin.revoke(args.grantee, args.rights, args.pattern)
    if taken:
        print(f"revoked {args.rights} on {args.pattern} from {args.grantee}")
    else:
        print(f"{args.grantee} held none of {args.rights} on {args.pattern}: nothing revoked")
    return 0


async def _show(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        user = await admin.show(args.name)
    if args.json:
        print_json(user)
        return 0
    print(f"{user['name']}{' (admin: every right on every stream)' if user['admin'] else ''}")
    for grant in user["grants"]:
        print(f"  {','.join(grant['rights'])} on {grant['pattern']}")
    if not user["grants"] and not user["admin"]:
        print("  no rights")
    return 0
