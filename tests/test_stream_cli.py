"""``futoin-evt stream`` on ``--db``, on a SQLite file and on PostgreSQL, and on ``--url``
against a running server: every subcommand, and bad input that exits 2 with one line and
changes nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from futoin_evt.storage import open_store

from .support.cli import on_server, run
from .support.servers import ServerProcess
from .support.sql import execute_sql

pytestmark = pytest.mark.functional


def stream(db: str, *args: str) -> str:
    result = run("stream", *args, "--db", db)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_add_list_info_grow_and_drop(store_db: str) -> None:
    assert stream(store_db, "add", "orders", "--partitions", "3") == (
        "added stream orders with 3 partitions\n"
    )
    listed = json.loads(stream(store_db, "list", "--json"))
    assert [(s["name"], s["partitions"]) for s in listed] == [("events", 1), ("orders", 3)]
    assert [line.split()[:3] for line in stream(store_db, "list").splitlines()] == [
        ["events", "partitions", "1"],
        ["orders", "partitions", "3"],
    ]

    async def fill() -> None:
        async with await open_store(store_db) as store:
            info = await store.stream("orders")
            assert info is not None
            log = store.partition_log(info.partitions[1])
            for _ in range(5):
                await log.append("T", "1")
            user = await store.add_user("alice", "h")
            await log.register_consumer(user, "C")
            await log.acknowledge(user, "C", 2)
            await log.delete_events(1, 10)

    asyncio.run(fill())
    info = json.loads(stream(store_db, "info", "orders", "--json"))
    assert [
        (p["number"], p["head"], p.get("oldest_id"), p["events"]) for p in info["partitions"]
    ] == [
        (0, 0, None, 0),
        (1, 5, 2, 4),
        (2, 0, None, 0),
    ]
    consumers = info["partitions"][1]["consumers"]
    assert consumers == [{"user": "alice", "component": "C", "position": 2, "behind": 3}]
    text = stream(store_db, "info", "orders")
    assert "partition 1: head 5, oldest 2, 4 events\n  alice/C: position 2, behind 3\n" in text
    assert stream(store_db, "grow", "orders", "--partitions", "5") == (
        "stream orders has 5 partitions\n"
    )
    assert len(json.loads(stream(store_db, "info", "orders", "--json"))["partitions"]) == 5
    assert stream(store_db, "drop", "orders", "--yes") == "dropped stream orders\n"
    assert [s["name"] for s in json.loads(stream(store_db, "list", "--json"))] == ["events"]


BAD_INPUT = [
    (["add", "Orders", "--partitions", "1"], "invalid stream name 'Orders'"),
    (["add", "a" * 49, "--partitions", "1"], "invalid stream name"),
    (["add", "feed", "--partitions", "1"], "reserved"),
    (["add", "metrics", "--partitions", "1"], "reserved"),
    (["add", "new", "--partitions", "0"], "1 to 1024 partitions, not 0"),
    (["add", "new", "--partitions", "1025"], "1 to 1024 partitions, not 1025"),
    (["add", "new", "--partitions", "x"], "invalid int value"),
    (["add", "kept", "--partitions", "1"], "the stream kept exists already"),
    (["add", "events", "--partitions", "1"], "the stream events exists already"),
    (["grow", "kept", "--partitions", "1"], "it can only grow"),
    (["grow", "kept", "--partitions", "1025"], "1 to 1024 partitions"),
    (["grow", "nope", "--partitions", "3"], "no stream nope"),
    (["info", "nope"], "no stream nope"),
    (["drop", "events", "--yes"], "cannot be dropped"),
    (["drop", "kept"], "add --yes"),
    (["drop", "nope", "--yes"], "no stream nope"),
]


def test_bad_input_exits_2_with_one_line_and_changes_nothing(store_db: str) -> None:
    stream(store_db, "add", "kept", "--partitions", "2")
    before = stream(store_db, "list", "--json")
    version = execute_sql(store_db, "SELECT value FROM meta WHERE key = 'streams_version'")
    for args, says in BAD_INPUT:
        result = run("stream", *args, "--db", store_db)
        assert result.returncode == 2, args
        assert says in result.stderr, args
        assert len(result.stderr.strip().splitlines()) == 1, args
        assert result.stdout == "", args
    assert stream(store_db, "list", "--json") == before
    assert execute_sql(store_db, "SELECT value FROM meta WHERE key = 'streams_version'") == version


def test_an_admin_manages_streams_of_a_running_server(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, root = admin_server
    assert on_server(server, root, "add", "orders", "--partitions", "3") == (
        "added stream orders with 3 partitions\n"
    )
    # the server and the database agree: it is the same registry
    assert stream(str(server.db), "list", "--json") == on_server(server, root, "list", "--json")
    assert on_server(server, root, "grow", "orders", "--partitions", "4") == (
        "stream orders has 4 partitions\n"
    )
    info = json.loads(on_server(server, root, "info", "orders", "--json"))
    assert [(p["number"], p["head"], p["events"]) for p in info["partitions"]] == [
        (n, 0, 0) for n in range(4)
    ]
    assert on_server(server, root, "drop", "orders", "--yes") == "dropped stream orders\n"
    assert [s["name"] for s in json.loads(stream(str(server.db), "list", "--json"))] == ["events"]


def test_a_user_lists_streams_and_sees_only_their_own_consumers_but_changes_nothing(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    """carol may read ``orders*``: she lists and describes those streams only, and may not
    add, grow or drop streams (that needs manage)."""
    server, root = admin_server
    carol = {"FUTOIN_EVT_USER": "carol", "FUTOIN_EVT_PASSWORD": "pw"}
    on_server(server, root, "add", "orders", "--partitions", "2")
    on_server(server, root, "add", "payroll", "--partitions", "1")
    granted = run("grant", "carol", "read", "orders*", "--url", server.url, env=root)
    assert granted.returncode == 0, granted.stderr

    async def register() -> None:
        async with await open_store(str(server.db)) as store:
            info = await store.stream("orders")
            assert info is not None
            log = store.partition_log(info.partitions[1])
            for name in ("root", "carol"):
                user = await store.get_user(name)
                assert user is not None
                await log.register_consumer(user.id, "C")

    asyncio.run(register())
    seen = json.loads(on_server(server, carol, "info", "orders", "--json"))
    assert seen["partitions"][1]["consumers"] == [
        {"user": "carol", "component": "C", "position": 0, "behind": 0}
    ]
    all_seen = json.loads(on_server(server, root, "info", "orders", "--json"))
    assert {c["user"] for c in all_seen["partitions"][1]["consumers"]} == {"root", "carol"}
    assert [s["name"] for s in json.loads(on_server(server, carol, "list", "--json"))] == ["orders"]
    before = on_server(server, root, "list", "--json")
    for args, name in (
        (["add", "orders-mine", "--partitions", "1"], "orders-mine"),
        (["grow", "orders", "--partitions", "3"], "orders"),
        (["drop", "orders", "--yes"], "orders"),
        (["info", "payroll"], "payroll"),
    ):
        refused = run("stream", *args, "--url", server.url, env=carol)
        assert refused.returncode == 1, args
        needed = "read" if args[0] == "info" else "manage"
        assert refused.stderr.strip().splitlines() == [
            f"futoin-evt: the server refused: SecurityError: the {needed} right on stream"
            f" {name} is needed"
        ], args
    assert on_server(server, root, "list", "--json") == before


def test_bad_input_on_a_server_exits_2_with_one_line_and_changes_nothing(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, root = admin_server
    on_server(server, root, "add", "kept", "--partitions", "2")
    before = on_server(server, root, "list", "--json")
    for args, says in BAD_INPUT:
        result = run("stream", *args, "--url", server.url, env=root)
        assert result.returncode == 2, args
        assert says in result.stderr, args
        assert len(result.stderr.strip().splitlines()) == 1, args
        assert result.stdout == "", args
    assert on_server(server, root, "list", "--json") == before


def test_add_and_poll_name_their_stream_and_partition(
    admin_server: tuple[ServerProcess, dict[str, str]],
) -> None:
    """``add``, ``poll`` and ``tail`` take ``--stream NAME`` and ``--partition P`` as
    ``info`` does, instead of a URL path: the event goes to that partition and is read there."""
    server, root = admin_server
    on_server(server, root, "add", "orders", "--partitions", "2")
    where = ("--url", server.url, "--stream", "orders", "--partition", "1")
    added = run("add", "ORDER_PLACED", '{"total": 5}', *where, env=root)
    assert added.stdout == "1\n", added.stderr
    info = json.loads(on_server(server, root, "info", "orders", "--json"))
    assert [p["head"] for p in info["partitions"]] == [0, 1]
    polled = run("poll", "BILLING", *where, env=root)
    assert polled.returncode == 0, polled.stderr
    assert [json.loads(line)["data"] for line in polled.stdout.splitlines()] == [{"total": 5}]
    # --partition alone: the URL's own stream; a bad name is refused before anything is sent
    other = run("poll", "BILLING", "--url", f"{server.url}orders/0", "--partition", "1", env=root)
    assert other.returncode == 0, other.stderr
    assert other.stdout == ""  # the same consumer, which read event 1 above
    bad = run("add", "ORDER_PLACED", "{}", "--url", server.url, "--stream", "Orders!", env=root)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
