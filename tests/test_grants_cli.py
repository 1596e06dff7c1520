"""``futoin-evt grant``, ``revoke`` and ``user show`` on ``--db`` (SQLite and PostgreSQL):
grants by name, prefix and ``*``, and bad input that exits 2 with one line and changes
nothing."""

from __future__ import annotations

import json

import pytest

from .test_cli import run

pytestmark = pytest.mark.functional


def ok(db: str, *args: str, stdin: str = "") -> str:
    result = run(*args, "--db", db, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_grant_revoke_and_show(store_db: str) -> None:
    ok(store_db, "user", "add", "alice", "--password-stdin", stdin="pw\n")
    ok(store_db, "user", "add", "root", "--password-stdin", "--admin", stdin="pw\n")
    assert ok(store_db, "user", "show", "alice") == "alice\n  no rights\n"
    assert ok(store_db, "grant", "alice", "read,write", "orders*") == (
        "granted alice read,write on orders*\n"
    )
    ok(store_db, "grant", "alice", "manage", "payroll")
    ok(store_db, "grant", "alice", "read", "*")
    assert ok(store_db, "user", "show", "alice") == (
        "alice\n  read on *\n  read,write on orders*\n  manage on payroll\n"
    )
    assert ok(store_db, "revoke", "alice", "write,manage", "orders*") == (
        "revoked write,manage on orders* from alice\n"
    )
    assert "nothing revoked" in ok(store_db, "revoke", "alice", "write", "payroll")
    ok(store_db, "revoke", "alice", "manage", "payroll")
    shown = json.loads(ok(store_db, "user", "show", "alice", "--json"))
    assert shown == {
        "name": "alice",
        "admin": False,
        "grants": [
            {"pattern": "*", "rights": ["read"]},
            {"pattern": "orders*", "rights": ["read"]},
        ],
    }
    assert ok(store_db, "user", "show", "root") == ("root (admin: every right on every stream)\n")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("grant", "alice", "read,admin", "orders"), "unknown right 'admin'"),
        (("grant", "alice", "", "orders"), "no rights given"),
        (("grant", "alice", ",", "orders"), "no rights given"),
        (("grant", "alice", "read", "Orders"), "bad stream pattern 'Orders'"),
        (("grant", "alice", "read", "or*ders"), "bad stream pattern"),
        (("revoke", "alice", "read", "*x"), "bad stream pattern"),
        (("grant", "nobody", "read", "orders"), "no user nobody."),
        (("revoke", "nobody", "read", "orders"), "no user nobody."),
        (("user", "show", "nobody"), "no user nobody."),
    ],
)
def test_bad_input_exits_2_with_one_line(store_db: str, args: tuple[str, ...], says: str) -> None:
    ok(store_db, "user", "add", "alice", "--password-stdin", stdin="pw\n")
    result = run(*args, "--db", store_db)
    assert result.returncode == 2, result
    assert says in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert ok(store_db, "user", "show", "alice") == "alice\n  no rights\n"
