"""Shared access keys and tokens (no server): what ``$cbs`` accepts and refuses."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from futoin_evt.auth.sas import (
    InvalidToken,
    SasToken,
    SasVerifier,
    SecretFileError,
    TokenScope,
    host_name,
    load_secret,
    sas_key,
    sign,
)
from futoin_evt.domain.stream import UserId
from futoin_evt.storage.user_roles import User

SECRET = b"x" * 40
ALICE = User(UserId(1), "alice", "scrypt$16384$8$1$c2FsdA==$aGFzaA==", False)
RESOURCE = "sb://127.0.0.1:5671/events"
#: An expiry within the longest lifetime a token may have.
SOON = int(time.time()) + 3600


class Users:
    def __init__(self, *users: User) -> None:
        self._users = {user.name: user for user in users}

    async def get_user(self, name: str) -> User | None:
        return self._users.get(name)


def test_the_key_depends_on_secret_name_and_password() -> None:
    key = sas_key(SECRET, ALICE)
    assert key == sas_key(SECRET, ALICE)
    assert key != sas_key(b"y" * 40, ALICE)
    assert key != sas_key(SECRET, User(ALICE.id, "alice2", ALICE.password_hash, False))
    assert key != sas_key(SECRET, User(ALICE.id, "alice", "scrypt$other", False))


async def test_a_signed_token_names_its_user() -> None:
    verifier = SasVerifier(Users(ALICE), SECRET)
    token = sign(RESOURCE, "alice", sas_key(SECRET, ALICE), SOON)
    claims = await verifier.verify(token, RESOURCE)
    principal = claims.principal
    assert (principal.user_id, principal.name, claims.expiry) == (1, "alice", SOON)
    assert claims.scope == TokenScope("127.0.0.1", "events")
    # Any address under the resource, with another scheme or case (Event Hubs compares so).
    assert await verifier.verify(token, "amqps://127.0.0.1:5671/EVENTS/Partitions/0")


async def test_a_name_encoded_twice_is_understood() -> None:
    """azure-eventhub url-encodes ``skn`` twice."""
    odd = User(UserId(2), "a b+c", "scrypt$z", False)
    token = sign(RESOURCE, "a+b%2Bc", sas_key(SECRET, odd), SOON)
    claims = await SasVerifier(Users(odd), SECRET).verify(token, RESOURCE)
    assert claims.principal.name == "a b+c"


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "not a SharedAccessSignature"),
        ("Bearer abc", "not a SharedAccessSignature"),
        ("SharedAccessSignature sr=a&se=1&skn=alice", "no sig"),
        ("SharedAccessSignature sr=a&sig=x&se=soon&skn=alice", "not a time"),
        ("SharedAccessSignature sr=a&sig=x&se=1" + "9" * 20 + "&skn=alice", "not a time"),
        ("SharedAccessSignature " + "x" * 5000, "at most 4096"),
        (sign(RESOURCE, "nobody", "k", SOON), "signature does not match"),
        (sign(RESOURCE, "alice", "not the key", SOON), "signature does not match"),
        (sign(RESOURCE, "alice", sas_key(SECRET, ALICE), 1_000_000), "has expired"),
        (
            sign("sb://127.0.0.1:5671/other", "alice", sas_key(SECRET, ALICE), SOON),
            "does not cover",
        ),
        (
            sign("sb://127.0.0.1:5671/ev", "alice", sas_key(SECRET, ALICE), SOON),
            "does not cover",
        ),
    ],
)
async def test_bad_tokens(token: object, reason: str) -> None:
    with pytest.raises(InvalidToken, match=reason):
        await SasVerifier(Users(ALICE), SECRET).verify(token, RESOURCE)


async def test_a_token_of_no_user_costs_what_a_wrong_signature_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same key derivation and constant-time comparison run whether ``skn`` names a user or
    not, so the time a refusal takes does not tell which names are users."""
    import hmac

    calls: list[str] = []
    digest, compare = hmac.digest, hmac.compare_digest

    def counted_digest(key: bytes, message: bytes, algorithm: str) -> bytes:
        calls.append("digest")
        return bytes(digest(key, message, algorithm))

    def counted_compare(a: bytes, b: bytes) -> bool:
        calls.append(f"compare {len(a)} {len(b)}")
        return bool(compare(a, b))

    monkeypatch.setattr(hmac, "digest", counted_digest)
    monkeypatch.setattr(hmac, "compare_digest", counted_compare)
    verifier = SasVerifier(Users(ALICE), SECRET)
    work = []
    for name in ("alice", "nobody"):
        token = sign(RESOURCE, name, "not the key", SOON)
        calls.clear()
        with pytest.raises(InvalidToken):
            await verifier.verify(token, RESOURCE)
        work.append(list(calls))
    assert work[0] == work[1] == ["digest", "digest", "compare 44 44"]


def test_a_tampered_expiry_breaks_the_signature() -> None:
    token = SasToken.parse(sign(RESOURCE, "alice", sas_key(SECRET, ALICE), 2_000_000_000))
    longer = SasToken(token.resource, SOON, token.key_name, token.signature)
    with pytest.raises(InvalidToken, match="signature"):
        longer.check(sas_key(SECRET, ALICE), RESOURCE, 0)


def test_the_secret_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    with pytest.raises(SecretFileError, match="no SAS secret file"):
        load_secret(path, create=False)
    first = load_secret(path, create=True)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_secret(path, create=True) == first == load_secret(path, create=False)


def test_a_short_or_unreadable_secret_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("too short\n")
    with pytest.raises(SecretFileError, match="fewer than 32"):
        load_secret(short, create=True)
    with pytest.raises(SecretFileError, match="cannot"):
        load_secret(tmp_path / "no-such-dir" / "secret", create=True)


async def test_a_name_that_is_no_user_is_refused_like_a_wrong_signature() -> None:
    """The client cannot tell which names are users; the server's log can."""
    verifier = SasVerifier(Users(ALICE), SECRET)
    with pytest.raises(InvalidToken) as unknown:
        await verifier.verify(sign(RESOURCE, "nobody", "k", SOON), RESOURCE)
    with pytest.raises(InvalidToken) as wrong:
        await verifier.verify(sign(RESOURCE, "alice", "k", SOON), RESOURCE)
    assert str(unknown.value) == str(wrong.value)
    assert "names no user" in unknown.value.detail
    assert "names no user" not in wrong.value.detail


@pytest.mark.parametrize(
    ("resource", "host", "path"),
    [
        ("sb://127.0.0.1/", "127.0.0.1", ""),
        ("sb://127.0.0.1", "127.0.0.1", ""),
        ("sb://Hub.Example:5671/Orders/", "hub.example", "orders"),
        (
            "amqps://[::1]:5671/orders/ConsumerGroups/$Default",
            "::1",
            "orders/consumergroups/$default",
        ),
        ("127.0.0.1//orders", "127.0.0.1", "orders"),
    ],
)
def test_a_token_scope_is_its_host_and_path(resource: str, host: str, path: str) -> None:
    assert TokenScope.of(resource) == TokenScope(host, path)


@pytest.mark.parametrize(
    ("authority", "host"),
    [("127.0.0.1", "127.0.0.1"), ("LocalHost:5672", "localhost"), ("[::1]:5672", "::1"),
     ("::1", "::1"), ("[::1]", "::1"), ("user@hub:1", "hub")],
)  # fmt: skip
def test_host_names_are_compared_without_port_and_case(authority: str, host: str) -> None:
    assert host_name(authority) == host


def test_a_scope_covers_its_path_and_what_is_under_it() -> None:
    root = TokenScope.of("sb://h/")
    orders = TokenScope.of("sb://h/orders")
    partition = TokenScope.of("sb://h/orders/Partitions/1")
    for path in ("orders", "payroll", "orders/Partitions/1", "$events/orders"):
        assert root.covers(path)
    assert orders.covers("orders")
    assert orders.covers("Orders/ConsumerGroups/g/Partitions/0")
    assert not orders.covers("orders2")
    assert not orders.covers("payroll/orders")
    assert partition.covers("orders/partitions/1")
    assert not partition.covers("orders/Partitions/10")
    assert not partition.covers("orders")
