"""Shared access signature (SAS) tokens, the claims Event Hubs clients put to ``$cbs``.

A client signs ``quote_plus(resource) + "\\n" + expiry`` with HMAC-SHA256 under its shared
access key, and names the key (``skn``) by a user of ours. Checking such a signature needs the
key itself, and passwords are only stored as scrypt hashes, so the key is not the password: it
is derived from a server secret (a file beside the database, never in it) and the user's
current password hash. Nothing about it is stored, a new password gives a new key, and a removed
user's key stops working. ``futoin-evt user sas-key NAME`` prints it.

A shared access policy (as Event Hubs has them) is a user that cannot log in with a password:
its password hash is a random marker (:func:`policy_hash`), so its key is derived the same way
and changes when the policy is made again, and its claims (Send, Listen, Manage) are its grants
(write, read, manage) on the streams of its pattern.

A token is refused when it expires more than a maximum lifetime (``serve --sas-max-lifetime``,
default :data:`DEFAULT_MAX_LIFETIME` seconds) from now: a token that never expires would
outlive every revocation of its key's signer but a new password.

A token holds only under its resource (``sr``, :class:`TokenScope`): ``sb://HOST/`` for
whatever its signer may use, ``sb://HOST/NAME`` for the stream NAME and the addresses under it,
a longer path for the addresses under that path. Hosts and paths are compared without case and
the port, as Event Hubs compares them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, quote_plus, unquote_plus

from ..domain.principal import Principal
from ..domain.rights import Right, names_text, parse_names
from ..domain.stream import UserId
from ..storage.user_roles import User, UserSource

#: Seconds from now a token's expiry (``se``) may be at most, unless configured otherwise.
DEFAULT_MAX_LIFETIME: Final = 7 * 24 * 3600
#: Bytes of randomness in a new secret file.
SECRET_BYTES: Final = 32
#: A token is refused when it is longer than this (no key is that long to check).
MAX_TOKEN_CHARS: Final = 4096
TOKEN_PREFIX: Final = "SharedAccessSignature "
_KEY_CONTEXT: Final = b"futoin-evt sas-key v1\0"
#: Whose key a token that names no user is checked against (no user has an empty name).
_NOBODY: Final = User(UserId(0), "", "", False)


#: What a client is told of a token whose skn names no user: the same as for a wrong
#: signature, so that refusals do not tell which names are users.
SIGNATURE_MISMATCH: Final = "the token's signature does not match the key of its skn"


class InvalidToken(Exception):
    """A token that names no user of ours, has a wrong signature, or has expired. The message
    (for the client) says which, without repeating the token and without telling a name that
    is no user from a wrong signature; ``detail`` is the reason for the server's log."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


class SecretFileError(Exception):
    """The secret file cannot be read or created."""


def load_secret(path: Path, *, create: bool) -> bytes:
    """The server secret in ``path``; with ``create``, a new random one is written first (mode
    0600) when there is none."""
    try:
        text = path.read_text("ascii").strip()
    except FileNotFoundError:
        if not create:
            raise SecretFileError(f"no SAS secret file {path}") from None
        text = secrets.token_urlsafe(SECRET_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created at the same moment by another process
            return load_secret(path, create=False)
        except OSError as exc:
            raise SecretFileError(f"cannot create the SAS secret file {path}: {exc}") from None
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(text + "\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"cannot read the SAS secret file {path}: {exc}") from None
    if len(text) < 32:
        raise SecretFileError(f"the SAS secret file {path} holds fewer than 32 characters")
    return text.encode("ascii")


#: The password hash of a policy: this, then random hex (never a scrypt hash: no password
#: logs in as a policy).
POLICY_HASH_PREFIX: Final = "sas-policy$"
#: A policy's claims, as Event Hubs names them, and the rights each gives.
CLAIMS: Final = {"Send": Right.WRITE, "Listen": Right.READ, "Manage": Right.MANAGE}


def policy_hash() -> str:
    """A new policy's password hash (its key follows from it)."""
    return POLICY_HASH_PREFIX + secrets.token_hex(16)


def is_policy(user: User) -> bool:
    return user.password_hash.startswith(POLICY_HASH_PREFIX)


def parse_claims(text: str) -> Right:
    """``Send,Listen`` as rights; raises :class:`~futoin_evt.domain.rights.BadGrant`."""
    return parse_names(text, CLAIMS, "claim")


def claims_text(rights: Right) -> str:
    return names_text(rights, CLAIMS)


def sas_key(secret: bytes, user: User) -> str:
    """The shared access key of ``user`` (as the ``SharedAccessKey`` of a connection string)."""
    material = _KEY_CONTEXT + user.name.encode() + b"\0" + user.password_hash.encode()
    return base64.b64encode(hmac.digest(secret, material, hashlib.sha256)).decode("ascii")


def sign(resource: str, key_name: str, key: str, expiry: int) -> str:
    """A token as Event Hubs clients make it (for tests and for our own clients)."""
    signature = _signature(key, resource, expiry)
    fields = {"sr": resource, "sig": signature, "se": str(expiry), "skn": key_name}
    return TOKEN_PREFIX + "&".join(f"{k}={quote_plus(v)}" for k, v in fields.items())


@dataclass(frozen=True, slots=True)
class TokenScope:
    """Where a token holds: a host, and a path of segments on it (``""``: all of the host)."""

    host: str
    path: str

    @classmethod
    def of(cls, resource: str) -> TokenScope:
        """The scope of a token's resource (``sb://HOST[:PORT]/PATH``)."""
        authority, _slash, path = _strip_scheme(resource).partition("/")
        return cls(host_name(authority), scope_path(path))

    def covers(self, path: str) -> bool:
        """Whether the scope holds for an address path (``orders/Partitions/1``)."""
        return path_covers(self.path, scope_path(path))


def scope_path(path: str) -> str:
    """A path as scopes compare it: lowercased, its segments joined by single slashes."""
    return "/".join(segment for segment in path.lower().split("/") if segment)


def path_covers(scope: str, path: str) -> bool:
    """Whether a scope's path holds for ``path`` (both as :func:`scope_path` gives them):
    the same path, one under it, or any path for the empty scope."""
    return not scope or path == scope or path.startswith(scope + "/")


def host_name(authority: str) -> str:
    """The host of ``host``, ``host:port``, ``[v6]:port``, ``user@host`` or a bare IPv6
    address, lowercased: what a token's host and a connection's are compared as."""
    host = authority.rpartition("@")[2].lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a checked token says: who the connection acts as, until when, and where."""

    principal: Principal
    expiry: int
    scope: TokenScope


@dataclass(frozen=True, slots=True)
class SasToken:
    resource: str
    expiry: int
    key_name: str
    signature: str

    @classmethod
    def parse(cls, text: object) -> SasToken:
        if not isinstance(text, str) or not text.startswith(TOKEN_PREFIX):
            raise InvalidToken("not a SharedAccessSignature token")
        if len(text) > MAX_TOKEN_CHARS:
            raise InvalidToken(f"a token has at most {MAX_TOKEN_CHARS} characters")
        fields = dict(parse_qsl(text[len(TOKEN_PREFIX) :], keep_blank_values=True))
        missing = [name for name in ("sr", "sig", "se", "skn") if not fields.get(name)]
        if missing:
            raise InvalidToken(f"the token has no {', '.join(missing)}")
        if not fields["se"].isascii() or not fields["se"].isdigit() or len(fields["se"]) > 12:
            raise InvalidToken("the token's se is not a time in seconds")
        return cls(fields["sr"], int(fields["se"]), fields["skn"], fields["sig"])

    def key_names(self) -> tuple[str, ...]:
        """The user the token names; some clients encode ``skn`` twice, so also that decoded."""
        decoded = unquote_plus(self.key_name)
        return (self.key_name,) if decoded == self.key_name else (self.key_name, decoded)

    def signed_with(self, key: str) -> bool:
        """Whether the signature is that of ``key`` (in constant time)."""
        expected = _signature(key, self.resource, self.expiry)
        return hmac.compare_digest(expected.encode(), self.signature.encode("utf-8", "replace"))

    def check(
        self, key: str, audience: str, now: float, max_lifetime: float = DEFAULT_MAX_LIFETIME
    ) -> None:
        """Raises :class:`InvalidToken` unless signed with ``key``, unexpired, expiring
        within ``max_lifetime`` seconds, and for a resource that ``audience`` is (or is
        under)."""
        if not self.signed_with(key):
            raise InvalidToken(SIGNATURE_MISMATCH)
        if self.expiry <= now:
            raise InvalidToken("the token has expired")
        if self.expiry > now + max_lifetime:
            raise InvalidToken(
                f"the token's expiry (se) is more than {max_lifetime:g} seconds away:"
                " make one that expires sooner"
            )
        if not _covers(self.resource, audience):
            raise InvalidToken("the token's resource (sr) does not cover the name it is put for")


class SasVerifier:
    """Turns a token into the user it names."""

    def __init__(
        self, users: UserSource, secret: bytes, max_lifetime: float = DEFAULT_MAX_LIFETIME
    ) -> None:
        self._users = users
        self._secret = secret
        #: Seconds from now a token may expire at most.
        self.max_lifetime = max_lifetime

    async def verify(self, text: object, audience: str) -> TokenClaims:
        """The user, the token's expiry (Unix seconds) and its scope; raises
        :class:`InvalidToken`."""
        token = SasToken.parse(text)
        for name in token.key_names():
            user = await self._users.get_user(name)
            if user is not None:
                token.check(sas_key(self._secret, user), audience, time.time(), self.max_lifetime)
                principal = Principal(user.id, user.name, user.is_admin)
                return TokenClaims(principal, token.expiry, TokenScope.of(token.resource))
        # The work of a wrong signature (a key derived, the signature compared), so that the
        # time taken does not tell a name that is a user from one that is not.
        token.signed_with(sas_key(self._secret, _NOBODY))
        raise InvalidToken(SIGNATURE_MISMATCH, "the token's skn names no user of this server")


def _signature(key: str, resource: str, expiry: int) -> str:
    signed = f"{quote_plus(resource)}\n{expiry}".encode()
    return base64.b64encode(hmac.digest(key.encode(), signed, hashlib.sha256)).decode("ascii")


def _covers(resource: str, audience: str) -> bool:
    """Whether a token for ``resource`` holds for ``audience``: the same URI or one under it,
    compared without scheme and case as Event Hubs does (``sb://`` and ``amqp://`` alike)."""
    granted = _strip_scheme(resource).rstrip("/")
    wanted = _strip_scheme(audience).rstrip("/")
    return wanted == granted or wanted.startswith(granted + "/")


def _strip_scheme(uri: str) -> str:
    _scheme, sep, rest = uri.partition("://")
    return (rest if sep else uri).lower()
