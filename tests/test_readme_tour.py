"""The README's tour, run as written: its two first commands, every shell line and every Python
program of "Using it" against a server started as the README starts it (``futoin-evt serve``,
its database ``./futoin-evt.sqlite`` in the working directory, before any user exists), and
the getting-started page's programs. Only the port differs: a free one, given to the shell
through ``$FUTOIN_EVT_URL`` and put into the programs' URLs.

The tour is a newcomer's first hour: a refusal here is a refusal they meet.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from futoin_evt.client.receiver import ReliableReceiver

from .support.servers import ServerProcess, free_port

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
README_URL = "ws://127.0.0.1:8480/"
#: A tour program may take this long (the receiver's example runs for 3 seconds).
PROGRAM_TIMEOUT = 60


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next section."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_starts_with_its_two_commands() -> None:
    first = blocks(README.read_text(), "sh")[0].splitlines()
    assert first == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/futoin-evt serve",
        "python3 -m venv .venv && .venv/bin/pip install -q '.[test,spark]'"
        " && PYTHONSAFEPATH=1 .venv/bin/python -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[1] in ci, "CI runs the README's test command verbatim"


class Tour:
    """A server started as the README starts it, in a directory of its own."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = ServerProcess(directory / "futoin-evt.sqlite", free_port())
        self.url = self.server.url
        bin_dir = Path(sys.executable).parent
        self.env = {
            **os.environ,
            "FUTOIN_EVT_URL": self.url,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        }
        self.bin_dir = bin_dir

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        """A README shell block, one bash script (its ``export`` holds for the lines after)."""
        script = script.replace(".venv/bin/", f"{self.bin_dir}/")
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=PROGRAM_TIMEOUT,
        )

    def python(self, program: str) -> subprocess.CompletedProcess[str]:
        """A README Python block, run as a script of its own."""
        assert README_URL in program, "the program talks to the README's server"
        path = self.directory / "program.py"
        path.write_text(program.replace(README_URL, self.url))
        return subprocess.run(
            [sys.executable, str(path)],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=PROGRAM_TIMEOUT,
        )


@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    tour = Tour(tmp_path)
    yield tour
    tour.server.stop()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_using_it_as_written(tour: Tour) -> None:
    using_it = section(README.read_text(), "Using it")
    (shell,) = blocks(using_it, "sh")
    programs = blocks(using_it, "python")
    assert len(programs) == 3

    # the user is added and granted while the server runs, and used at once
    out = ok(tour.shell(shell)).splitlines()
    (added_id,) = [int(line) for line in out if line.isdigit()]  # what `add` prints
    polled = [line for line in out if line.startswith("{")]
    assert any('"ORDER_PLACED"' in line and str(added_id) in line for line in polled), out

    calls = ok(tour.python(programs[0]))
    assert re.search(r"^added \d+$", calls, flags=re.MULTILINE), calls
    assert "ORDER_PAID" in calls, "BILLING reads the events added since the shell's poll"

    produced = ok(tour.python(programs[1]))
    stored = int(re.fullmatch(r"stored as (\d+)\n", produced).group(1))  # type: ignore[union-attr]

    received = ok(tour.python(programs[2]))
    got = re.findall(r"^SHIPPING got (\d+) (\w+)", received, flags=re.MULTILINE)
    assert {kind for _, kind in got} == {"ORDER_PLACED"}, received
    # (the shell's event is gone: read by BILLING, the only consumer then, it was discarded)
    assert str(stored) in {event_id for event_id, _ in got}, received


def test_getting_started_programs(tour: Tour, js_peer: Path) -> None:
    page = GETTING_STARTED.read_text()
    ok(tour.shell(blocks(section(page, "A first user"), "sh")[0]))
    (program,) = blocks(section(page, "From Python"), "python")
    assert re.search(r"^added \d+$", ok(tour.python(program)), flags=re.MULTILINE)

    (script,) = blocks(section(page, "From JavaScript, with the official FutoIn client"), "js")
    path = js_peer / "getting_started.tmp.js"
    path.write_text(script.replace("secure+ws://127.0.0.1:8480/", f"secure+{tour.url}"))
    try:
        result = subprocess.run(
            ["node", str(path)], cwd=js_peer, capture_output=True, text=True, timeout=120
        )
    finally:
        path.unlink()
    assert re.search(r"^added \d+$", ok(result), flags=re.MULTILINE), result.stderr


def test_a_client_without_its_server_says_so(tmp_path: Path) -> None:
    """A producer pointed at a port where nothing listens says so on stderr (where Python
    prints warnings when the program set up no logging) while it keeps retrying."""
    url = f"ws://127.0.0.1:{free_port()}/"
    program = tmp_path / "producer.py"
    program.write_text(
        "import asyncio\n"
        "from futoin_evt.client.producer import ReliableProducer\n"
        "async def main():\n"
        f"    async with ReliableProducer({url!r}, credentials='a:b') as p:\n"
        "        p.submit('ORDER_PLACED', {})\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(program)], stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert proc.stderr is not None
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready, "nothing on stderr"
        line = proc.stderr.readline()
        assert "cannot use ws://127.0.0.1:" in line, line
        assert "trying again" in line, line
        assert proc.poll() is None, "it keeps trying"
    finally:
        proc.kill()
        proc.communicate(timeout=30)


@pytest.mark.parametrize(
    ("component", "want", "rule"),
    [
        ("BILL-ING", None, "a consumer component is"),
        ("BILLING", ["order_placed"], "an event type is"),
    ],
)
def test_a_receiver_refuses_what_no_server_would_take(
    component: str, want: list[str] | None, rule: str
) -> None:
    """Before connecting (a reliable receiver would register its component first, and its
    loop would meet the server's refusal again at every reconnect)."""
    with pytest.raises(ValueError, match=rule):
        ReliableReceiver("ws://127.0.0.1:1/", credentials="a:b", component=component, want=want)
