"""The command line as an operator runs it, against a database or a running server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import ServerProcess

CLI = [sys.executable, "-m", "futoin_evt"]


def run(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def admin_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    """A served SQLite file with the admin ``root`` and the user ``carol`` (no rights);
    root's settings."""
    db = str(tmp_path / "streams.sqlite")
    for name, flags in (("root", ["--admin"]), ("carol", [])):
        added = run("user", "add", name, *flags, "--password-stdin", "--db", db, stdin="pw\n")
        assert added.returncode == 0, added.stderr
    server = ServerProcess(db)
    try:
        yield server, {"FUTOIN_EVT_USER": "root", "FUTOIN_EVT_PASSWORD": "pw"}
    finally:
        server.stop()


def on_server(server: ServerProcess, env: dict[str, str], *args: str) -> str:
    result = run("stream", *args, "--url", server.url, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def stream_command(db: str, *args: str) -> None:
    result = await asyncio.to_thread(run, "stream", *args, "--db", db)
    assert result.returncode == 0, result.stderr
