"""``futoinevt.ops``: rights on streams, for ``futoin-evt grant``, ``revoke`` and ``user show``
with ``--url`` (admin users only). A change is in use in this process before the answer, in
the other workers of the server at once, and in other processes of the database within the
grants' reload interval."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from ..domain.principal import Principal
from ..domain.rights import BadGrant
from ..ftn3.calls import CallContext
from ..ftn3.errors import SECURITY_ERROR, FTN3Error
from ..log import access

INVALID_GRANT: Final = "InvalidGrant"
UNKNOWN_USER: Final = "UnknownUser"


class GrantAdmin:
    """The calls of the ops iface on grants."""

    def __init__(self, store: access.GrantStore, control: access.AccessControl) -> None:
        self._store = store
        self._control = control

    async def grant_rights(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        _admins_only(ctx.principal)
        with _as_ftn3():
            await access.grant(self._store, params["user"], params["rights"], params["pattern"])
        await self._control.changed_here()
        return True

    async def revoke_rights(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        _admins_only(ctx.principal)
        with _as_ftn3():
            taken = await access.revoke(
                self._store, params["user"], params["rights"], params["pattern"]
            )
        await self._control.changed_here()
        return taken

    async def show_user(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        _admins_only(ctx.principal)
        with _as_ftn3():
            return await access.describe_user(self._store, params["user"])


def _admins_only(who: Principal) -> None:
    if not who.is_admin:
        raise FTN3Error(SECURITY_ERROR, "only admin users grant, revoke and show rights")


@contextlib.contextmanager
def _as_ftn3() -> Iterator[None]:
    """Bad grants and unknown users as the iface's errors."""
    try:
        yield
    except BadGrant as exc:
        raise FTN3Error(INVALID_GRANT, str(exc)) from None
    except access.UnknownUser as exc:
        raise FTN3Error(UNKNOWN_USER, str(exc)) from None
