"""``futoin-evt serve`` as an operator meets it: each bad ``--db`` refused in a sentence of
its own and left as it was, a port in use named with its option before anything is made,
and the start-up banner that lists every door and says how to add the first user."""

from __future__ import annotations

import ctypes
import os
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .support.servers import ServerProcess

pytestmark = pytest.mark.functional

CLI = [sys.executable, "-m", "futoin_evt"]


def serve(
    *args: str, cwd: Path, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        preexec_fn=preexec,
        env={k: v for k, v in os.environ.items() if not k.startswith("FUTOIN_EVT_")},
    )


def files(where: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(where.iterdir()) if p.is_file()}


def _without_root_reads() -> None:
    """In the child: drop the capabilities that let root read any file (as a user is)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    for cap in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")


def test_a_directory(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    result = serve("--db", "dir", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "futoin-evt: --db dir is a directory, not a database file: give a file's path (a new"
        " database is made there when there is no file).\n"
    )
    assert list((tmp_path / "dir").iterdir()) == []
    assert files(tmp_path) == {}


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("order 17: paid\n")
    result = serve("--db", "notes.txt", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "futoin-evt: --db notes.txt is not a SQLite database (it does not begin as one): give"
        " another file; this one was left as it is.\n"
    )
    assert files(tmp_path) == {"notes.txt": b"order 17: paid\n"}


def test_another_programs_sqlite_database(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
        conn.execute("INSERT INTO orders (total) VALUES (150)")
    conn.close()
    before = files(tmp_path)
    result = serve("--db", "shop.db", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "futoin-evt: --db shop.db is another program's SQLite database (it has none of"
        " futoin-evt's tables): give another file; this one was left as it is.\n"
    )
    assert files(tmp_path) == before


def test_an_unreadable_file(tmp_path: Path) -> None:
    db = tmp_path / "events.sqlite"
    made = subprocess.run(
        [*CLI, "user", "add", "shop", "--password-stdin", "--db", str(db)],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    db.chmod(0)
    before = {name: len(data) for name, data in files(tmp_path).items() if name != db.name}
    preexec = _without_root_reads if os.geteuid() == 0 else None
    result = serve("--db", db.name, "--port", "0", cwd=tmp_path, preexec=preexec)
    assert result.returncode == 2
    assert result.stderr == f"futoin-evt: cannot read --db {db.name}: Permission denied.\n"
    db.chmod(0o600)
    assert {n: len(d) for n, d in files(tmp_path).items() if n != db.name} == before


def test_only_a_futoin_evt_database_is_called_damaged(tmp_path: Path) -> None:
    """A futoin-evt file whose pages fail SQLite's check is damaged; the refusals above are
    not (each says what the file is instead)."""
    db = tmp_path / "events.sqlite"
    made = subprocess.run(
        [*CLI, "user", "add", "shop", "--password-stdin", "--db", str(db)],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(db) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    assert pages > 2
    data = bytearray(db.read_bytes())
    for page in range(1, pages):  # every page but the header's: b-trees that make no sense
        data[page * page_size : page * page_size + 64] = b"\xa5" * 64
    db.write_bytes(bytes(data))
    result = serve("--db", db.name, "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"futoin-evt: the database file {db.name} is damaged")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("option", "value", "extra"),
    [
        ("--port", "{port}", ()),
        ("--amqp", "127.0.0.1:{port}", ()),
        ("--metrics", "127.0.0.1:{port}", ()),
        ("--metrics", "{port}", ()),  # PORT alone: 127.0.0.1
        ("--amqp", "127.0.0.1:{port}", ("--workers", "2")),
        ("--kafka", "127.0.0.1:{port}", ()),
        ("--kafka", "127.0.0.1:{port}", ("--workers", "2")),
    ],
    ids=[
        "port",
        "amqp",
        "metrics",
        "metrics-port-alone",
        "amqp-workers2",
        "kafka",
        "kafka-workers2",
    ],
)
def test_a_port_in_use_is_named_with_its_option_and_nothing_is_made(
    tmp_path: Path, taken_port: int, option: str, value: str, extra: tuple[str, ...]
) -> None:
    args = ["--db", "events.sqlite", "--amqp", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]
    args += ["--kafka", "127.0.0.1:0"]
    args += ["--port", "0", *extra, option, value.format(port=taken_port)]
    result = serve(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"futoin-evt: cannot listen on 127.0.0.1:{taken_port} ({option}): Address already in use.\n"
    )
    assert files(tmp_path) == {}  # no database, no SAS secret


def test_two_options_on_one_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = serve(
        "--db", "events.sqlite", "--port", str(port), "--amqp", f"127.0.0.1:{port}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr == f"futoin-evt: --port and --amqp name the same port, {port}.\n"
    assert files(tmp_path) == {}


def test_the_banner_lists_every_door_and_the_first_user(
    tmp_path: Path, processes: list[ServerProcess], serve_workers: int
) -> None:
    """The same banner from one process and from a group of workers (its supervisor)."""
    db = tmp_path / "fresh.sqlite"
    server = ServerProcess(
        db,
        0,
        "--amqp",
        "127.0.0.1:0",
        "--kafka",
        "127.0.0.1:0",
        "--metrics",
        "0",
        "--console",
        log_level="info",
        workers=serve_workers,
    )
    processes.append(server)
    assert server.proc.stdout is not None
    lines = [server.proc.stdout.readline().rstrip("\n") for _ in range(12)]
    http = server.url.replace("ws://", "http://").rstrip("/")
    doors = dict(re.findall(r"^  (\S.*?\S)  +(\S+)$", "\n".join(lines[:9]), re.M))
    assert doors.keys() == {
        "FTN18 (WebSocket, /NAME/P)", "HTTP feed", "DCB", "schema registry", "AsyncAPI",
        "console", "AMQP", "Kafka", "metrics",
    }  # fmt: skip
    assert doors["FTN18 (WebSocket, /NAME/P)"] == server.url
    assert doors["HTTP feed"] == f"{http}/feed"
    assert doors["DCB"] == f"{http}/dcb/v1"
    assert doors["schema registry"] == f"{http}/schemas"
    assert doors["AsyncAPI"] == f"{http}/asyncapi.json"
    assert doors["console"] == f"{http}/console/"
    assert doors["AMQP"] == server.amqp_url
    assert doors["Kafka"] == f"kafka://{server.kafka_address}"
    assert re.fullmatch(r"http://127\.0\.0\.1:[0-9]+/metrics", doors["metrics"])
    assert lines[9:] == [
        "  no users yet: add one, with rights on every stream, by",
        f"    futoin-evt user add NAME --db {db}",
        f"    futoin-evt grant NAME read,write '*' --db {db}",
    ]
    code, logged = server.stop_and_read_log(timeout=30)
    assert code == 0
    assert f"WARNING futoin_evt: {doors['metrics']} is open to whoever reaches its port" in logged
    assert f"database {db}: other futoin-evt processes may use this file" in logged

    # the commands as printed, then the banner without the hint
    added = subprocess.run(
        [*CLI, "user", "add", "shop", "--password-stdin", "--db", str(db)],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    again = ServerProcess(db, 0, "--metrics", "0", "--metrics-user", "shop", log_level="info")
    processes.append(again)
    assert again.proc.stdout is not None
    rest = [again.proc.stdout.readline() for _ in range(6)]
    assert rest[-1].startswith("  metrics ")
    code, logged = again.stop_and_read_log(timeout=30)
    assert code == 0
    assert "no users yet" not in again.line + "".join(rest)
    assert "is open to whoever" not in logged
