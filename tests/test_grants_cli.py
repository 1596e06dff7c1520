"""``futoin-evt grant``, ``revoke`` and ``user show`` on ``--db`` (SQLite and PostgreSQL):
grants by name, prefix and ``*``, and bad input that exits 2 with one line and changes
nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .support.cli import run
from .support.servers import ServerProcess

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


def test_sas_policies_are_added_listed_and_removed(tmp_path: Path) -> None:
    db = str(tmp_path / "policies.sqlite")
    key = ok(
        db, "sas", "policy", "add", "orders-rw", "--stream", "orders*", "--claims", "Send,Listen"
    )
    assert len(key.strip()) == 44  # base64 of 32 bytes
    ok(db, "sas", "policy", "add", "all-manage", "--stream", "*", "--claims", "Manage")
    assert ok(db, "sas", "policy", "list") == (
        "all-manage  Manage on *\norders-rw  Send,Listen on orders*\n"
    )
    assert "orders-rw (SAS policy)" in ok(db, "user", "list")
    assert ok(db, "user", "show", "orders-rw") == "orders-rw\n  read,write on orders*\n"
    # a policy has no password, and its name is taken
    passwd = run("user", "passwd", "orders-rw", "--password-stdin", "--db", db, stdin="pw\n")
    assert passwd.returncode == 2
    assert "is a SAS policy" in passwd.stderr
    again = run(
        "sas", "policy", "add", "orders-rw", "--stream", "x", "--claims", "Send", "--db", db
    )
    assert again.returncode == 2
    assert "exists already" in again.stderr
    bad = run("sas", "policy", "add", "p", "--stream", "x", "--claims", "Send,Peek", "--db", db)
    assert bad.returncode == 2
    assert "unknown claim 'Peek'" in bad.stderr
    assert ok(db, "sas", "policy", "remove", "orders-rw") == "removed policy orders-rw\n"
    assert ok(db, "sas", "policy", "list") == "all-manage  Manage on *\n"


def test_grants_through_a_running_server(tmp_path: Path) -> None:
    """With --url: an admin grants, revokes and shows, in use at once; others are refused."""
    db = str(tmp_path / "served.sqlite")
    ok(db, "user", "add", "root", "--password-stdin", "--admin", stdin="root-pw\n")
    ok(db, "user", "add", "alice", "--password-stdin", stdin="alice-pw\n")
    server = ServerProcess(db)
    try:
        root = {"FUTOIN_EVT_USER": "root", "FUTOIN_EVT_PASSWORD": "root-pw"}
        alice = {"FUTOIN_EVT_USER": "alice", "FUTOIN_EVT_PASSWORD": "alice-pw"}

        def on_server(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return run(*args, "--url", server.url, env=env)

        refused = on_server("add", "ORDER", "{}", env=alice)
        assert refused.returncode == 1
        assert "the write right on stream events is needed" in refused.stderr
        granted = on_server("grant", "alice", "read,write", "*", env=root)
        assert granted.stdout == "granted alice read,write on *\n", granted.stderr
        added = on_server("add", "ORDER", "{}", env=alice)
        assert added.returncode == 0, added.stderr
        assert on_server("user", "show", "alice", env=root).stdout == ("alice\n  read,write on *\n")
        taken = on_server("revoke", "alice", "write", "*", env=root)
        assert taken.stdout == "revoked write on * from alice\n", taken.stderr
        assert on_server("add", "ORDER", "{}", env=alice).returncode == 1
        # only admins grant; bad input exits 2 with the server's sentence
        by_alice = on_server("grant", "alice", "manage", "*", env=alice)
        assert by_alice.returncode == 1
        assert "only admin users grant" in by_alice.stderr
        unknown = on_server("grant", "nobody", "read", "*", env=root)
        assert unknown.returncode == 2
        assert unknown.stderr == "futoin-evt: no user nobody.\n"
        # the user who acts is --as; --user (before --as) still works, and says it is old
        password = {"FUTOIN_EVT_PASSWORD": "root-pw"}
        acting = on_server("grant", "alice", "manage", "orders", "--as", "root", env=password)
        assert acting.stdout == "granted alice manage on orders\n", acting.stderr
        assert acting.stderr == ""
        old = on_server("revoke", "alice", "manage", "orders", "--user", "root", env=password)
        assert old.stdout == "revoked manage on orders from alice\n", old.stderr
        assert "--user is deprecated here, use --as" in old.stderr
        shown = on_server("user", "show", "alice", "--as", "root", env=password)
        assert shown.stdout == "alice\n  read on *\n", shown.stderr
        nobody = on_server("user", "show", "alice", env=password)
        assert nobody.returncode == 1
        assert nobody.stderr == "futoin-evt: no user given: use --as or $FUTOIN_EVT_USER.\n"
    finally:
        server.stop()
