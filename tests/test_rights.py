"""Rights per stream: the grammar of rights and patterns, what a set of grants allows, the
grants in the database (both backends), the upgrade that keeps earlier users' access, and
:class:`AccessControl` reloading grants and ending what a revoked right allowed."""

from __future__ import annotations

import logging
import shutil
import stat
from pathlib import Path

import pytest

from futoin_evt.domain.principal import Principal
from futoin_evt.domain.rights import (
    ADMIN_RIGHTS,
    BadGrant,
    Grant,
    Right,
    Rights,
    check_pattern,
    parse_rights,
    rights_text,
)
from futoin_evt.domain.stream import UserId
from futoin_evt.log.access import AccessControl, AccessDenied
from futoin_evt.storage import open_store
from futoin_evt.storage.user_roles import GrantRow

from .support.sql import execute_sql, pg_schema_at

DATA = Path(__file__).parent / "data"
READ, WRITE, MANAGE = Right.READ, Right.WRITE, Right.MANAGE


@pytest.mark.parametrize(
    ("text", "rights"),
    [
        ("read", READ),
        ("read,write", READ | WRITE),
        ("manage, read", READ | MANAGE),
        ("read,write,manage", READ | WRITE | MANAGE),
        ("write,write", WRITE),
    ],
)
def test_rights_are_a_comma_list_of_names(text: str, rights: Right) -> None:
    assert parse_rights(text) == rights
    assert parse_rights(rights_text(rights)) == rights


@pytest.mark.parametrize("text", ["", " , ", "read,admin", "READ", "read;write", "all"])
def test_a_list_that_is_not_rights_is_refused(text: str) -> None:
    with pytest.raises(BadGrant):
        parse_rights(text)


@pytest.mark.parametrize("pattern", ["orders", "orders*", "*", "a", "o-1_x*", "x" * 48])
def test_patterns_are_names_prefixes_or_all(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    "pattern", ["", "**", "Orders", "ord*ers", "*orders", "orders/0", "x" * 49, "-a*", "a b"]
)
def test_a_pattern_that_is_none_of_those_is_refused(pattern: str) -> None:
    with pytest.raises(BadGrant):
        check_pattern(pattern)


def test_grants_allow_by_name_by_prefix_and_for_all() -> None:
    rights = Rights([Grant("payroll", READ), Grant("orders*", READ | WRITE)])
    assert rights.on("payroll") == READ
    assert rights.on("orders") == READ | WRITE
    assert rights.on("orders-eu") == READ | WRITE
    assert rights.on("order") == Right.NONE
    assert rights.on("payroll2") == Right.NONE
    assert rights.allows(READ | WRITE, "orders-eu")
    assert not rights.allows(READ | WRITE, "payroll")
    assert not rights.allows(MANAGE, "orders")
    everything = Rights([Grant("*", MANAGE), Grant("payroll", WRITE)])
    assert everything.on("payroll") == MANAGE | WRITE
    assert everything.on("anything") == MANAGE
    assert ADMIN_RIGHTS.allows(READ | WRITE | MANAGE, "payroll")


class Grants:
    """An in-memory grant source for the fast tests (the stores are tested below)."""

    def __init__(self) -> None:
        self.rows: list[GrantRow] = []

    async def list_grants(self) -> list[GrantRow]:
        return list(self.rows)


async def test_access_control_checks_and_ends_what_a_revoke_took_away() -> None:
    grants = Grants()
    alice = Principal(UserId(1), "alice", False)
    bob = Principal(UserId(2), "bob", False)
    root = Principal(UserId(3), "root", True)
    grants.rows = [GrantRow(alice.user_id, "orders*", 3), GrantRow(bob.user_id, "*", 1)]
    access = AccessControl(grants, refresh_seconds=0)
    await access.start()
    access.check(alice, WRITE, "orders")
    access.check(bob, READ, "payroll")
    access.check(root, MANAGE, "payroll")
    with pytest.raises(AccessDenied) as refused:
        access.check(alice, READ, "payroll")
    assert str(refused.value) == "the read right on stream payroll is needed"
    with pytest.raises(AccessDenied):
        access.check(bob, WRITE, "orders")
    ended: list[str] = []
    access.watch(alice, READ, "orders", lambda: ended.append("alice orders"))
    access.watch(bob, READ, "orders", lambda: ended.append("bob orders"))
    cancelled = access.watch(bob, READ, "payroll", lambda: ended.append("bob payroll"))
    access.watch(root, READ, "orders", lambda: ended.append("root"))
    cancelled()
    grants.rows = [GrantRow(alice.user_id, "orders*", 3)]
    await access.changed_here()
    assert ended == ["bob orders"]
    with pytest.raises(AccessDenied):
        access.check(bob, READ, "orders")
    grants.rows = []
    await access.reload()
    assert ended == ["bob orders", "alice orders"]
    await access.close()


async def test_grants_are_kept_per_user_and_pattern(store_db: str) -> None:
    async with await open_store(store_db) as store:
        alice = await store.add_user("alice", "h")
        bob = await store.add_user("bob", "h")
        assert await store.list_grants() == []
        await store.grant(alice, "orders*", int(READ))
        await store.grant(alice, "orders*", int(WRITE))
        await store.grant(bob, "*", int(READ | MANAGE))
        assert await store.list_grants() == [
            GrantRow(alice, "orders*", 3),
            GrantRow(bob, "*", 5),
        ]
        assert await store.revoke(bob, "*", int(MANAGE))
        assert not await store.revoke(bob, "*", int(WRITE))
        assert not await store.revoke(bob, "payroll", int(READ))
        assert await store.revoke(alice, "orders*", int(READ | WRITE))
        assert await store.list_grants() == [GrantRow(bob, "*", 1)]
        await store.remove_user("bob")
        assert await store.list_grants() == []


async def test_a_new_sqlite_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "new.sqlite"
    async with await open_store(str(db)) as store:
        await store.append("T", "1")
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


async def test_an_upgrade_keeps_what_earlier_users_could_do_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "v7.sqlite"
    shutil.copy(DATA / "schema-v7.sqlite", db)
    with caplog.at_level(logging.WARNING, "futoin_evt.storage"):
        async with await open_store(str(db)) as store:
            users = {user.name: user.id for user in await store.list_users()}
            assert await store.list_grants() == [
                GrantRow(users["alice"], "*", 3),
                GrantRow(users["bob"], "*", 3),
            ]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("upgrade:")]
    assert len(said) == 1
    assert said[0].startswith("upgrade: 2 users who are not admins")
    caplog.clear()
    async with await open_store(str(db)) as store:
        assert len(await store.list_grants()) == 2
    assert not [r for r in caplog.records if r.getMessage().startswith("upgrade:")]


@pytest.mark.postgres
async def test_a_postgres_upgrade_keeps_what_earlier_users_could_do(pg_url: str) -> None:
    pg_schema_at(pg_url, 7)
    execute_sql(
        pg_url,
        "INSERT INTO users (name, password_hash, is_admin, created_at)"
        " VALUES ('alice', 'h', false, 't'), ('root', 'h', true, 't')",
    )
    async with await open_store(pg_url) as store:
        alice = await store.get_user("alice")
        assert alice is not None
        assert await store.list_grants() == [GrantRow(alice.id, "*", 3)]
        # a user added after the upgrade has no rights
        await store.add_user("carol", "h")
        assert len(await store.list_grants()) == 1
