"""The SASL logins other than PLAIN with a password, with the store's users, as a door runs
them. A failure is told to the client as a wrong password is, whatever its reason, and counted,
logged and told (``authFailed``) as :class:`~.users.Authenticator` does for passwords.

SCRAM (:mod:`.scram`'s exchange, :class:`ScramLogins`): :meth:`ScramLogins.begin` with the
client-first message, then :meth:`ScramLogin.finish` with the client-final one. A user whose
password was set before the server kept SCRAM credentials has none: their login fails, and
the log says once (per user, in this process) that they must set their password again.

Event Hubs connection strings (:class:`ConnectionStringLogins`): checked as an Event Hubs
client's token is: a token for the endpoint (and the hub, if named) is signed with the key, as
the SDKs sign one from a connection string, and :class:`~.sas.SasVerifier` checks it, so the
key is the one ``futoin-evt user sas-key`` or ``futoin-evt sas policy add`` gave. The login
acts as the key's user (a SAS policy: its claims are its grants) with that user's rights, as a
PLAIN login does; the endpoint's host is not compared with the one the client reached (the key
is the secret).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Final

from ..domain.management import AUTH_FAILED
from ..domain.principal import NotAuthenticated, Principal
from ..domain.stream import UserId
from ..quoting import quote_input
from ..stats import BAD_CREDENTIALS, current_door
from ..storage.user_roles import ScramSource, User, UserSource
from .connection_string import CONNECTION_STRING_USER, ConnectionString
from .login_log import log_failed_login
from .sas import InvalidToken, SasVerifier, sign
from .scram import (
    INVALID_CREDENTIALS,
    MECHANISMS,
    ClientFirst,
    ScramFailure,
    ScramMechanism,
    ScramServer,
    parse_client_first,
    stand_in,
)
from .users import Authenticator

logger = logging.getLogger(__name__)

#: What the password hash of a user who logs in with a password starts with.
_PASSWORD_HASH_PREFIX: Final = "scrypt$"
#: Seconds the token made to check a connection string is valid (it is checked at once).
_TOKEN_SECONDS: Final = 60


class ScramLogin:
    """One login after its client-first message: send :attr:`server_first`, then
    :meth:`finish`."""

    def __init__(
        self, logins: ScramLogins, server: ScramServer, name: str, user: User | None, why: str
    ) -> None:
        self._logins = logins
        self._server = server
        self._name = name
        #: The user, or None with why the login fails whatever the proof.
        self._user = user
        self._why = why
        self.server_first = server.server_first

    def finish(self, client_final: bytes, peer: str) -> tuple[Principal, bytes]:
        """The user and the server-final message; raises
        :class:`~futoin_evt.domain.principal.NotAuthenticated`."""
        try:
            server_final = self._server.finish(client_final)
        except ScramFailure as exc:
            detail = exc.detail if self._user is not None else self._why
            authenticator = self._logins.authenticator
            raise _refused(authenticator, self._name, peer, f"SCRAM: {detail}") from None
        user = self._user
        assert user is not None  # a stand-in's exchange never succeeds
        return Principal(user.id, user.name, user.is_admin), server_final


class ScramLogins:
    """SCRAM-SHA-256 and SCRAM-SHA-512 logins with ``users`` and their ``credentials``;
    failures counted and told as ``authenticator`` does."""

    def __init__(
        self, users: UserSource, credentials: ScramSource, authenticator: Authenticator
    ) -> None:
        self._users = users
        self._credentials = credentials
        self.authenticator = authenticator
        #: What the salts of names without credentials derive from.
        self._stand_in_key = os.urandom(32)
        #: The users already told to set their password again.
        self._told: set[UserId] = set()

    async def begin(self, mechanism: str, client_first: bytes, peer: str) -> ScramLogin:
        """The exchange after the client-first message; raises
        :class:`~futoin_evt.domain.principal.NotAuthenticated` when it is malformed."""
        scram = MECHANISMS[mechanism]
        try:
            first = parse_client_first(client_first)
        except ScramFailure as exc:
            raise _refused(self.authenticator, "", peer, f"SCRAM: {exc.detail}", str(exc)) from None
        user = await self._users.get_user(first.user)
        if user is None:  # the same reads as for a user: no probing for names by time
            await self._credentials.scram_credential(UserId(0), mechanism)
            return self._stand_in(scram, first, "no such user")
        credential = await self._credentials.scram_credential(user.id, mechanism)
        if credential is None:
            self._tell_to_set_password(user)
            return self._stand_in(scram, first, f"the user has no {mechanism} credentials")
        return ScramLogin(self, ScramServer(scram, first, credential), first.user, user, "")

    def _stand_in(self, scram: ScramMechanism, first: ClientFirst, why: str) -> ScramLogin:
        """An exchange that looks like a user's and fails."""
        credential = stand_in(scram, first.user, self._stand_in_key)
        server = ScramServer(scram, first, credential, known=False)
        return ScramLogin(self, server, first.user, None, why)

    def _tell_to_set_password(self, user: User) -> None:
        if user.id in self._told or not user.password_hash.startswith(_PASSWORD_HASH_PREFIX):
            return  # told, or a SAS policy or internal user, with no password to set
        self._told.add(user.id)
        logger.warning(
            "user %s has no SCRAM credentials (the password was set before the server kept"
            " them): it must set its password again to log in with SCRAM",
            quote_input(user.name, 64),
        )


class ConnectionStringLogins:
    """Connection strings checked with ``verifier`` (None: this server takes no SAS, and
    every such login fails); failures counted and told as ``authenticator`` does."""

    def __init__(self, verifier: SasVerifier | None, authenticator: Authenticator) -> None:
        self._verifier = verifier
        self._authenticator = authenticator

    async def authenticate(self, text: str, peer: str) -> Principal:
        """The key's user; raises :class:`~futoin_evt.domain.principal.NotAuthenticated`."""
        name = ""
        try:
            parsed = ConnectionString.parse(text)
            name = parsed.key_name
            if self._verifier is None:
                raise InvalidToken(INVALID_CREDENTIALS, "this server has no SAS secret")
            resource = parsed.resource
            token = sign(resource, name, parsed.key, int(time.time()) + _TOKEN_SECONDS)
            claims = await self._verifier.verify(token, resource)
        except (ValueError, InvalidToken) as exc:
            detail = exc.detail if isinstance(exc, InvalidToken) else str(exc)
            detail = f"{CONNECTION_STRING_USER}: {detail}"
            raise _refused(self._authenticator, name, peer, detail) from None
        return claims.principal


def _refused(
    authenticator: Authenticator, name: str, peer: str, detail: str, told: str = INVALID_CREDENTIALS
) -> NotAuthenticated:
    """What a failed login raises (``told`` to the client), counted, logged with ``detail``
    and told (``authFailed``)."""
    door = current_door()
    authenticator.refusals.note(door, BAD_CREDENTIALS)
    log_failed_login(door, name, peer, detail)
    if authenticator.notices is not None:
        authenticator.notices.publish(AUTH_FAILED, peer=peer, user=name[:64], reason=told)
    return NotAuthenticated(told)
