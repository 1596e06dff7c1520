"""Password hashing and request authentication."""

from __future__ import annotations

import pytest

from futoin_evt.auth.users import Authenticator, hash_password, verify_password
from futoin_evt.domain.principal import NotAuthenticated
from futoin_evt.domain.stream import UserId
from futoin_evt.storage.user_roles import User


def test_hashes_are_salted_and_verify() -> None:
    password = "correct horse battery staple"
    first, second = hash_password(password), hash_password(password)
    assert first != second
    assert first.startswith("scrypt$")
    assert password not in first  # only the salted hash is kept
    assert verify_password(password, first)
    assert not verify_password(password + "!", first)
    assert not verify_password(password, "garbage")


class _Users:
    def __init__(self, users: dict[str, User]) -> None:
        self.users = users
        self.lookups = 0

    async def get_user(self, name: str) -> User | None:
        self.lookups += 1
        return self.users.get(name)


@pytest.fixture(scope="module")
def carol() -> User:
    return User(UserId(3), "carol", hash_password("secret"), is_admin=False)


async def test_basic_credentials(carol: User) -> None:
    users = _Users({"carol": carol})
    auth = Authenticator(users)
    principal = await auth.authenticate("carol:secret")
    assert (principal.user_id, principal.name) == (3, "carol")
    assert await auth.authenticate({"user": "carol", "secret": "secret"}) == principal
    # a verified password is remembered: no second lookup
    lookups = users.lookups
    await auth.authenticate("carol:secret")
    assert users.lookups == lookups


@pytest.mark.parametrize(
    "sec",
    [
        "carol:wrong",
        "nobody:secret",
        "carol",
        ":secret",
        "-hmac:carol:SHA256:abc",
        {"user": "carol"},
    ],
)
async def test_bad_credentials_are_security_errors(carol: User, sec: str | dict[str, str]) -> None:
    auth = Authenticator(_Users({"carol": carol}))
    with pytest.raises(NotAuthenticated):
        await auth.authenticate(sec)


async def test_a_removed_user_is_refused_once_the_cache_expires(carol: User) -> None:
    users = _Users({"carol": carol})
    auth = Authenticator(users, cache_seconds=0)
    await auth.authenticate("carol:secret")
    del users.users["carol"]
    with pytest.raises(NotAuthenticated):
        await auth.authenticate("carol:secret")
