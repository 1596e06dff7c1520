"""The futoin-evt command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from futoin_evt import __version__
from futoin_evt.ftn3 import messages

from .support.cli import CLI, run
from .support.servers import ServerProcess
from .support.waiting import Deadline

pytestmark = pytest.mark.functional


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    db = tmp_path / "cli.sqlite"
    assert (
        run("user", "add", "carol", "--password-stdin", "--db", str(db), stdin="c-pw\n").returncode
        == 0
    )
    assert run("grant", "carol", "read,write", "*", "--db", str(db)).returncode == 0
    server = ServerProcess(db)
    env = {"FUTOIN_EVT_URL": server.url, "FUTOIN_EVT_USER": "carol", "FUTOIN_EVT_PASSWORD": "c-pw"}
    yield server, env
    if server.proc.poll() is None:
        server.stop()


def test_users(tmp_path: Path) -> None:
    db = str(tmp_path / "u.sqlite")
    secret = "dave's long passphrase"
    assert (
        run("user", "add", "dave", "--password-stdin", "--db", db, stdin=secret + "\n").returncode
        == 0
    )
    assert (
        run(
            "user", "add", "erin", "--password-stdin", "--admin", "--db", db, stdin="pw\n"
        ).returncode
        == 0
    )
    assert run("user", "list", "--db", db).stdout.split("\n")[:2] == ["dave", "erin (admin)"]
    again = run("user", "add", "dave", "--password-stdin", "--db", db, stdin="pw\n")
    assert (again.returncode, again.stderr) == (1, "futoin-evt: user dave exists already.\n")
    empty = run("user", "add", "fay", "--password-stdin", "--db", db, stdin="")
    assert empty.returncode == 1
    assert run("user", "remove", "dave", "--db", db).returncode == 0
    assert run("user", "remove", "dave", "--db", db).returncode == 1
    # the password is stored hashed, never as given (in the file or its write-ahead log)
    for path in (Path(db), Path(db + "-wal")):
        if path.exists():
            assert secret.encode() not in path.read_bytes()


def _on_a_terminal(args: list[str], answers: list[str]) -> tuple[int, str]:
    """Run the command with a terminal of its own (a pty), answering each prompt in turn;
    its exit status and what the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal and stdin
        os.execv(sys.executable, [*CLI, *args])
    shown, pending = b"", list(answers)
    deadline = Deadline(60)
    try:
        while deadline.left():
            ready, _, _ = select.select([fd], [], [], deadline.left())
            if not ready:
                break
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child closed the terminal: it has exited
                break
            if not chunk:
                break
            shown += chunk
            asked = shown.count(b"Password")  # each prompt once, echo off before it shows
            if pending and asked > len(answers) - len(pending) and shown.endswith(b": "):
                os.write(fd, pending.pop(0).encode() + b"\n")
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        exit_within = Deadline(30)
        while done == 0 and exit_within.left():  # its exit, once the terminal closed
            time.sleep(0.01)
            done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:  # still waiting for an answer: the test fails below
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


def test_user_add_asks_for_the_password_twice_on_a_terminal(tmp_path: Path) -> None:
    db = str(tmp_path / "t.sqlite")
    code, shown = _on_a_terminal(["user", "add", "gil", "--db", db], ["g-pw-1", "g-pw-1"])
    assert code == 0, shown
    assert "Password: " in shown
    assert "Password again: " in shown
    assert "added user gil" in shown
    assert "g-pw-1" not in shown  # not echoed
    differ = _on_a_terminal(["user", "add", "hal", "--db", db], ["h-pw-1", "h-pw-2"])
    assert differ[0] == 1
    assert "the two passwords differ: nothing was changed." in differ[1]
    assert run("user", "list", "--db", db).stdout == "gil\n"
    # the password typed is the one that logs in
    server = ServerProcess(db)
    try:
        assert run("grant", "gil", "write", "*", "--db", db).returncode == 0
        env = {"FUTOIN_EVT_USER": "gil", "FUTOIN_EVT_PASSWORD": "g-pw-1"}
        added = run("add", "ORDER", "{}", "--url", server.url, env=env)
        assert added.stdout == "1\n", added.stderr
    finally:
        server.stop()
    # without a terminal and without --password-stdin: what to do, in one sentence
    piped = run("user", "add", "ida", "--db", db, stdin="i-pw\n")
    assert piped.returncode == 1
    assert piped.stderr == (
        "futoin-evt: no terminal to ask for the password on: give it with --password-stdin.\n"
    )


def test_sas_keys(tmp_path: Path) -> None:
    db, secret = str(tmp_path / "k.sqlite"), str(tmp_path / "sas-secret")
    assert run("user", "add", "gus", "--password-stdin", "--db", db, stdin="pw1\n").returncode == 0
    first = run("user", "sas-key", "gus", "--db", db, "--sas-secret", secret)
    assert first.returncode == 0
    assert run("user", "sas-key", "gus", "--db", db, "--sas-secret", secret).stdout == first.stdout
    assert len(first.stdout.strip()) == 44  # base64 of 32 bytes
    beside = run("user", "sas-key", "gus", "--db", db)  # the default secret: beside the file
    assert beside.returncode == 0
    assert Path(db + ".sas-secret").exists()
    assert beside.stdout != first.stdout
    assert (
        run("user", "passwd", "gus", "--password-stdin", "--db", db, stdin="pw2\n").returncode == 0
    )
    changed = run("user", "sas-key", "gus", "--db", db, "--sas-secret", secret)
    assert changed.stdout != first.stdout  # a new password gives a new key
    missing = run("user", "sas-key", "nobody", "--db", db, "--sas-secret", secret)
    assert (missing.returncode, missing.stderr) == (1, "futoin-evt: no user nobody.\n")
    Path(secret).write_text("short\n")
    bad = run("user", "sas-key", "gus", "--db", db, "--sas-secret", secret)
    assert bad.returncode == 2
    assert bad.stderr.startswith("futoin-evt: the SAS secret file")
    assert "Traceback" not in bad.stderr


def test_add_and_poll_then_clean_shutdown_keeps_events(
    served: tuple[ServerProcess, dict[str, str]], tmp_path: Path
) -> None:
    server, env = served
    ids = [run("add", "ORDER", json.dumps({"n": n}), env=env).stdout.strip() for n in range(3)]
    assert ids == ["1", "2", "3"]
    polled = run("poll", "SHIPPING", env=env)
    assert polled.returncode == 0, polled.stderr
    lines = [json.loads(line) for line in polled.stdout.splitlines()]
    assert [(e["id"], e["data"]) for e in lines] == [
        (1, {"n": 0}),
        (2, {"n": 1}),
        (3, {"n": 2}),
    ]
    # printed events were acknowledged: a second run has nothing new
    assert run("poll", "SHIPPING", env=env).stdout == ""
    assert run("add", "ORDER", '{"n": 3}', env=env).stdout.strip() == "4"
    assert server.stop() == 0
    restarted = ServerProcess(tmp_path / "cli.sqlite")
    try:
        env = {**env, "FUTOIN_EVT_URL": restarted.url}
        # the position survived the restart: only the unread event comes
        after = [json.loads(line) for line in run("poll", "SHIPPING", env=env).stdout.splitlines()]
        assert [e["id"] for e in after] == [4]  # a number, as the Python client's Event.id
        # read events were discarded, ids are never reused
        assert run("add", "ORDER", "1", env=env).stdout.strip() == "5"
    finally:
        assert restarted.stop() == 0


@pytest.mark.parametrize(
    ("args", "env_change", "message"),
    [
        (["add", "ORDER", "{bad"], {}, "event data is not valid JSON"),
        (["add", "order", "1"], {}, "invalid event type 'order': an event type is"),
        (
            ["add", "ORDER", "1"],
            {"FUTOIN_EVT_PASSWORD": "wrong"},
            "the server refused: SecurityError",
        ),
        (["poll", "LIVE", "--want", "a"], {}, "invalid event type 'a': an event type is"),
        (["poll", "C", "--last-id", "3"], {}, "--last-id is for LIVE"),
        (["add", "ORDER", "1"], {"FUTOIN_EVT_URL": "ws://127.0.0.1:1/"}, "cannot connect"),
    ],
)
def test_errors_are_one_sentence_and_non_zero(
    served: tuple[ServerProcess, dict[str, str]],
    args: list[str],
    env_change: dict[str, str],
    message: str,
) -> None:
    _server, env = served
    result = run(*args, env={**env, **env_change})
    assert result.returncode == 1
    assert result.stderr.startswith("futoin-evt: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_port_in_use_is_a_clear_error(
    served: tuple[ServerProcess, dict[str, str]], tmp_path: Path
) -> None:
    server, _env = served
    port = server.url.rsplit(":", 1)[1].strip("/")
    result = run("serve", "--db", str(tmp_path / "x.sqlite"), "--port", port)
    assert result.returncode == 2
    assert "cannot listen" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unopenable_sqlite_file_is_reported_at_once_even_with_wait_for_db(
    tmp_path: Path,
) -> None:
    """--wait-for-db waits for a database server; a file that cannot be opened is not one."""
    db = tmp_path / "no-such-dir" / "x.sqlite"
    result = run("serve", "--port", "0", "--db", str(db), "--wait-for-db", "600")
    assert result.returncode == 2
    assert result.stderr == (
        f"futoin-evt: --db {db} cannot be made: there is no directory {db.parent}.\n"
    )
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--pg-pool-size", "0"], "--pg-pool-size must be at least 1."),
        (["--pg-pool-timeout", "0"], "--pg-pool-timeout must be above 0."),
        (["--pg-link-timeout", "0.5"], "--pg-link-timeout must be at least 1 (seconds)."),
        (["--pg-link-timeout", "inf"], "--pg-link-timeout must be at least 1 (seconds)."),
        (["--wait-for-db", "-1"], "--wait-for-db cannot be negative."),
        (["--dedup-window", "-1"], "--dedup-window must be 0 or more seconds."),
        (["--dedup-window", "nan"], "--dedup-window must be 0 or more seconds."),
        (["--dedup-window", "inf"], "--dedup-window must be 0 or more seconds."),
        (["--feed-path", "/feeds"], "--feed-path cannot be under /feeds: each stream's feed is."),
        (["--dcb-path", "/feeds/x"], "--dcb-path cannot be under /feeds: each stream's feed is."),
    ],
)
def test_pool_and_wait_settings_are_checked(
    tmp_path: Path, option: list[str], message: str
) -> None:
    result = run("serve", "--port", "0", "--db", str(tmp_path / "x.sqlite"), *option)
    assert (result.returncode, result.stderr) == (2, f"futoin-evt: {message}\n")


def test_add_with_a_key_stores_the_event_once(
    served: tuple[ServerProcess, dict[str, str]],
) -> None:
    """Run again with its key (a retry after a lost reply), ``add`` prints the first id."""
    _server, env = served
    runs = [run("add", "ORDER", "{}", "--key", key, env=env) for key in ("o-1", "o-1", "o 2")]
    assert [r.stdout for r in runs[:2]] == ["1\n", "1\n"]
    assert runs[2].returncode != 0
    assert "invalid event key 'o 2': an event key is" in runs[2].stderr
    assert run("add", "ORDER", "{}", env=env).stdout == "2\n"


def test_version_says_which_build_is_installed() -> None:
    """``--version`` names the build: compiled (setup.py, mypyc) or pure Python."""
    compiled = Path(messages.__file__ or "").suffix not in (".py", ".pyc")
    build = "compiled with mypyc: " if compiled else "pure Python)"
    assert run("--version").stdout.startswith(f"futoin-evt {__version__} ({build}")


def test_tail_prints_pushed_events_until_interrupted(
    served: tuple[ServerProcess, dict[str, str]],
) -> None:
    _server, env = served
    assert run("add", "BEFORE", "1", env=env).returncode == 0
    tail = subprocess.Popen(
        [*CLI, "tail", "TAILER", "--want", "BEFORE,AFTER"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        assert tail.stdout is not None
        first = json.loads(tail.stdout.readline())
        assert (first["id"], first["type"]) == (1, "BEFORE")
        assert run("add", "OTHER", "2", env=env).returncode == 0
        assert run("add", "AFTER", '{"x": 3}', env=env).returncode == 0
        second = json.loads(tail.stdout.readline())
        assert (second["id"], second["type"], second["data"]) == (3, "AFTER", {"x": 3})
    finally:
        tail.send_signal(signal.SIGTERM)
        tail.communicate(timeout=30)
    assert tail.returncode == 0


def test_tail_needs_a_component_or_live(served: tuple[ServerProcess, dict[str, str]]) -> None:
    _server, env = served
    result = run("tail", env=env)
    assert result.returncode == 1
    assert "COMPONENT" in result.stderr


def test_tail_with_a_selector_prints_transformed_notifications(
    served: tuple[ServerProcess, dict[str, str]],
) -> None:
    _server, env = served
    selector = "eventType = 'ORDER_PLACED' AND total > 100"
    tail = subprocess.Popen(
        [*CLI, "tail", "--live", "--selector", selector, "--fields", "id,total"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        assert tail.stderr is not None
        assert tail.stdout is not None
        assert "subscribed" in tail.stderr.readline()
        for event_type, total in [("ORDER_PLACED", 50), ("ORDER_SHIPPED", 500),
                                  ("ORDER_PLACED", 150)]:  # fmt: skip
            assert run("add", event_type, json.dumps({"total": total}), env=env).returncode == 0
        assert json.loads(tail.stdout.readline()) == {"id": 3, "total": 150}
    finally:
        tail.send_signal(signal.SIGTERM)
        tail.communicate(timeout=30)
    assert tail.returncode == 0
    events = run("events", "--type", "ORDER_PLACED", env=env)
    assert events.returncode == 0
    assert events.stdout == "ORDER_PLACED: eventType, id, ts, stream, partition, total\n"
    listed = json.loads(run("events", "--json", env=env).stdout)
    assert listed["org.futoin.evt.consumerRegistered"][:3] == ["eventType", "ts", "stream"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--live", "--selector", "total > > 1"], "unexpected '>' (at column 9)"),
        (["--live", "--selector", "(" * 10_000 + "1" + ")" * 10_000], "longer than 4096"),
        (["--live", "--fields", ""], "non-empty list"),
        (["COMP", "--selector", "id > 1"], "go with --live"),
        (["--live", "--want", "A", "--selector", "id > 1"], "do not go together"),
    ],
)
def test_tail_selector_errors_are_one_sentence_and_status_2(
    served: tuple[ServerProcess, dict[str, str]], args: list[str], message: str
) -> None:
    _server, env = served
    result = run("tail", *args, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
