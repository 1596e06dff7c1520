"""SCRAM (RFC 5802) with SHA-256 and SHA-512 (RFC 7677), the server's side, as Kafka's SASL
takes it. No I/O.

Credentials: when a password is set, :func:`scram_credentials` derives, for each mechanism, a
random salt, :data:`ITERATIONS` and the StoredKey and ServerKey; the salted password is never
kept. The password is used as its UTF-8 bytes, without SASLprep, as Kafka's clients and
broker use it.

The exchange: :func:`parse_client_first` reads the client-first message (GS2 header ``n,,`` or
``y,,``, or with an authzid that is the user; channel binding, ``p=``, is refused), then a
:class:`ScramServer` made with the user's credential answers the server-first message and
checks the client-final one: its channel binding, its nonce and its proof (in constant time),
and answers the server-final message (``v=``). The user name is taken as Kafka takes it: the
``=2C`` and ``=3D`` escapes undone, no SASLprep.

A name that is no user, or a user without credentials, gets a server-first message that looks
alike (:func:`stand_in`: a salt derived from the name under a key of the process, so asking
twice gives the same one), and the same failure after the client-final message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from typing import Final

from ..storage.user_roles import ScramCredential

#: PBKDF2 iterations of new credentials: twice Kafka's minimum (4096), well under its
#: maximum (16384), so that every Kafka client takes them.
ITERATIONS: Final = 8192
#: Bytes of a new salt.
SALT_BYTES: Final = 24
#: What a client is told of a failed login, whatever the reason (as for SASL PLAIN).
INVALID_CREDENTIALS: Final = "Invalid credentials"
#: Characters of the nonce the server adds (random, printable, no comma).
_SERVER_NONCE_BYTES: Final = 24
#: Bounds on what a client sends (no name, nonce or proof is longer).
_MAX_MESSAGE: Final = 4096
_ESCAPE: Final = re.compile("=2C|=3D")
_SASLNAME: Final = re.compile("(?:[^=]|=2C|=3D)*")


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str
    #: hashlib's name of the hash function.
    hash_name: str


SCRAM_SHA_256: Final = ScramMechanism("SCRAM-SHA-256", "sha256")
SCRAM_SHA_512: Final = ScramMechanism("SCRAM-SHA-512", "sha512")
#: The mechanisms by their SASL names.
MECHANISMS: Final = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}


class ScramFailure(Exception):
    """A SCRAM login fails. The message is what the client is told (never whether the user
    exists); ``detail`` is the reason for the server's log."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


def derive(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int = ITERATIONS
) -> ScramCredential:
    """The credential of ``password`` with this salt and iteration count."""
    salted = hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(
        mechanism.name,
        salt,
        iterations,
        hashlib.new(mechanism.hash_name, client_key).digest(),
        _hmac(mechanism, salted, b"Server Key"),
    )


def scram_credentials(password: str) -> tuple[ScramCredential, ...]:
    """New credentials of ``password`` for every mechanism, each with a fresh salt (a few
    milliseconds of work: run it beside the password hash)."""
    return tuple(derive(m, password, os.urandom(SALT_BYTES)) for m in MECHANISMS.values())


def stand_in(mechanism: ScramMechanism, name: str, key: bytes) -> ScramCredential:
    """A credential for a name that has none: the salt derived from the name under ``key``
    (the same one every time the name is asked for), the keys random (no proof matches)."""
    digest = hmac.digest(key, f"{mechanism.name}\0{name}".encode(), "sha256")
    size = hashlib.new(mechanism.hash_name).digest_size
    return ScramCredential(
        mechanism.name, digest[:SALT_BYTES], ITERATIONS, os.urandom(size), os.urandom(size)
    )


@dataclass(frozen=True, slots=True)
class ClientFirst:
    """A client-first message as read."""

    #: The user, its escapes undone.
    user: str
    #: The GS2 header as sent (``n,,``), which the client-final message repeats.
    gs2_header: str
    #: The message without the GS2 header (part of what is signed).
    bare: str
    nonce: str


def parse_client_first(message: bytes) -> ClientFirst:
    """``gs2-header client-first-message-bare``; raises :class:`ScramFailure`."""
    text = _text(message)
    flag, comma, rest = text.partition(",")
    authzid, comma2, bare = rest.partition(",")
    if not (comma and comma2):
        raise _malformed("the client-first message has no GS2 header")
    if flag.startswith("p="):
        raise ScramFailure("channel binding is not supported", "the client asked for it")
    if flag not in ("n", "y"):
        raise _malformed("the client-first message's GS2 header is not n, y or p=")
    if authzid and not authzid.startswith("a="):
        raise _malformed("the client-first message's authzid is not a=")
    attributes = bare.split(",")
    if len(attributes) < 2 or attributes[0].startswith("m="):
        raise _malformed("the client-first message has no user and nonce, or asks for m=")
    user = _attribute(attributes[0], "n")
    nonce = _attribute(attributes[1], "r")
    if any(attribute == "tokenauth=true" for attribute in attributes[2:]):
        raise ScramFailure(INVALID_CREDENTIALS, "the client logs in with a delegation token")
    name = _unescape(user)
    if not name or not nonce or not nonce.isprintable() or not nonce.isascii():
        raise _malformed("the client-first message's user or nonce is empty or not printable")
    if authzid and _unescape(authzid[2:]) != name:
        raise ScramFailure(INVALID_CREDENTIALS, "the authzid is another user than the authcid")
    return ClientFirst(name, f"{flag},{authzid},", bare, nonce)


class ScramServer:
    """One login's exchange after its client-first message: :attr:`server_first`, then
    :meth:`finish` with the client-final message. ``known`` is False when ``credential`` is a
    :func:`stand_in`: the exchange looks the same and fails at the end."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        first: ClientFirst,
        credential: ScramCredential,
        *,
        known: bool = True,
        server_nonce: str | None = None,
    ) -> None:
        self._mechanism = mechanism
        self._first = first
        self._credential = credential
        self._known = known
        nonce = server_nonce or secrets.token_urlsafe(_SERVER_NONCE_BYTES)
        self._nonce = first.nonce + nonce
        salt = base64.b64encode(credential.salt).decode("ascii")
        self.server_first = f"r={self._nonce},s={salt},i={credential.iterations}".encode()

    def finish(self, message: bytes) -> bytes:
        """The server-final message (``v=``) when the proof holds; raises
        :class:`ScramFailure`."""
        text = _text(message)
        without_proof, comma, proof_attribute = text.rpartition(",")
        attributes = without_proof.split(",")
        if not comma or len(attributes) < 2:
            raise _malformed("the client-final message has no binding, nonce and proof")
        binding = _attribute(attributes[0], "c")
        nonce = _attribute(attributes[1], "r")
        proof = _base64(_attribute(proof_attribute, "p"))
        if binding != base64.b64encode(self._first.gs2_header.encode()).decode("ascii"):
            raise _malformed("the client-final message's channel binding is not its GS2 header")
        if not hmac.compare_digest(nonce.encode(), self._nonce.encode()):
            raise _malformed("the client-final message's nonce is not the exchange's")
        signed = f"{self._first.bare},{self.server_first.decode()},{without_proof}".encode()
        mechanism, credential = self._mechanism, self._credential
        signature = _hmac(mechanism, credential.stored_key, signed)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        stored_key = hashlib.new(mechanism.hash_name, client_key).digest()
        matches = len(proof) == len(signature) and hmac.compare_digest(
            stored_key, credential.stored_key
        )
        if not matches or not self._known:
            raise ScramFailure(INVALID_CREDENTIALS)
        verifier = _hmac(mechanism, credential.server_key, signed)
        return b"v=" + base64.b64encode(verifier)


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, mechanism.hash_name)


def _text(message: bytes) -> str:
    if len(message) > _MAX_MESSAGE:
        raise _malformed(f"a SCRAM message of more than {_MAX_MESSAGE} bytes")
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise _malformed("a SCRAM message that is not UTF-8") from None


def _attribute(text: str, name: str) -> str:
    """The value of ``name=value``; raises :class:`ScramFailure` for another attribute."""
    key, equals, value = text.partition("=")
    if key != name or not equals:
        raise _malformed(f"a SCRAM message without its {name}= attribute in place")
    return value


def _unescape(name: str) -> str:
    """A saslname with ``=2C`` and ``=3D`` as ``,`` and ``=``; any other ``=`` is refused."""
    if _SASLNAME.fullmatch(name) is None:
        raise _malformed("a user name with an = that is not =2C or =3D")
    return _ESCAPE.sub(lambda escape: "," if escape[0] == "=2C" else "=", name)


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise _malformed("a SCRAM proof that is not base64") from None


def _malformed(detail: str) -> ScramFailure:
    return ScramFailure(INVALID_CREDENTIALS, detail)
