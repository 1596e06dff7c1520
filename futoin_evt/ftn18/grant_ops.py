"""``futoinevt.ops``: rights on streams, for ``futoin-evt grant``, ``revoke`` and ``user show``
with ``--url`` (admin users only, as :class:`~futoin_evt.log.users.UserAdmin` checks: a
refusal is a SecurityError). A change is in use in this process before the answer, in the
other workers of the server at once, and in other processes of the database within the
grants' reload interval."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from ..domain.principal import Principal
from ..domain.rights import BadGrant
from ..ftn3.calls import CallContext
from ..ftn3.errors import FTN3Error
from ..log.access import UnknownUser
from ..log.users import UserAdmin

INVALID_GRANT: Final = "InvalidGrant"
UNKNOWN_USER: Final = "UnknownUser"


class GrantAdmin:
    """The calls of the ops iface on grants."""

    def __init__(self, users: UserAdmin) -> None:
        self._users = users

    async def grant_rights(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        with _as_ftn3():
            await self._users.grant(
                ctx.principal, params["user"], params["rights"], params["pattern"]
            )
        return True

    async def revoke_rights(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        with _as_ftn3():
            return await self._users.revoke(
                ctx.principal, params["user"], params["rights"], params["pattern"]
            )

    async def show_user(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        with _as_ftn3():
            return await self._users.describe(ctx.principal, params["user"])


@contextlib.contextmanager
def _as_ftn3() -> Iterator[None]:
    """Bad grants and unknown users as the iface's errors."""
    try:
        yield
    except BadGrant as exc:
        raise FTN3Error(INVALID_GRANT, str(exc)) from None
    except UnknownUser as exc:
        raise FTN3Error(UNKNOWN_USER, str(exc)) from None
