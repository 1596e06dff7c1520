"""Shared fixtures: a real server on 127.0.0.1 over a real SQLite file, clients, the JS peer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from futoin_evt.auth import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.retention import RetentionConfig
from futoin_evt.server.app import EventServer, ServerConfig
from futoin_evt.server.websocket import TransportConfig

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "js"
NPM_CACHE = ROOT / ".cache" / "npm"
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
TRANSPORT_OPTIONS = {"host", "tls", "trust_channel", "limits"}


@pytest.fixture(scope="session")
def password_hashes() -> dict[str, str]:
    return {name: hash_password(password) for name, password in USERS.items()}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "events.sqlite"


ServerFactory = Callable[..., Awaitable[EventServer]]


@pytest.fixture
async def start_server(
    db_path: Path, password_hashes: dict[str, str]
) -> AsyncIterator[ServerFactory]:
    """Start servers on free ports (closed at the end); users alice and bob exist."""
    started: list[EventServer] = []

    async def start(**options: Any) -> EventServer:
        """Options of TransportConfig (host, limits, ...) or of ServerConfig."""
        transport = {k: options.pop(k) for k in list(options) if k in TRANSPORT_OPTIONS}
        config = ServerConfig(
            db_path=db_path,
            transport=TransportConfig(port=0, **transport),
            check_results=True,
            # discarding runs when a test asks for it (server.discarder.discard())
            retention=RetentionConfig(interval=3600),
            **options,
        )
        server = await EventServer.start(config)
        started.append(server)
        existing = {user.name for user in await server.store.list_users()}
        for name, password_hash in password_hashes.items():
            if name not in existing:
                await server.store.add_user(name, password_hash)
        return server

    yield start
    for server in reversed(started):
        await server.close()


@pytest.fixture
async def server(start_server: ServerFactory) -> EventServer:
    return await start_server()


ClientFactory = Callable[..., Awaitable[EventStreamClient]]


@pytest.fixture
async def connect(server: EventServer) -> AsyncIterator[ClientFactory]:
    """Open clients to ``server`` as a user (closed at the end)."""
    clients: list[EventStreamClient] = []

    async def open_client(user: str = "alice", password: str | None = None) -> EventStreamClient:
        secret = USERS[user] if password is None else password
        client = await EventStreamClient.connect(server.url, credentials=f"{user}:{secret}")
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()


@pytest.fixture
async def alice(connect: ClientFactory) -> EventStreamClient:
    return await connect("alice")


@pytest.fixture
async def bob(connect: ClientFactory) -> EventStreamClient:
    return await connect("bob")


# -- the official JavaScript client -------------------------------------------------------------


@pytest.fixture(scope="session")
def js_peer() -> Path:
    """The official FutoIn JS packages, installed once into tests/js/node_modules."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the interop tests")
    stamp = JS_DIR / "node_modules" / ".installed-from"
    wanted = (JS_DIR / "package.json").read_text()
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--cache",
                str(NPM_CACHE),
            ],
            cwd=JS_DIR,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
        stamp.write_text(wanted)
    return JS_DIR


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``futoin-evt serve`` as its own process, as an operator runs it."""

    def __init__(self, db: Path, port: int = 0, *extra: str) -> None:
        self.db = db
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "futoin_evt", "--log-level", "warning", "serve",
             "--db", str(db), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"ws://[^ ]+", line)
        if match is None:
            _out, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"no URL in {line!r}; stderr: {err}")
        self.url = match.group(0)
        self.port = int(self.url.rsplit(":", 1)[1].strip("/"))
        amqp = re.search(r"amqps?://[^ ]+", line)
        self.amqp_url = amqp.group(0) if amqp else None

    def stop(self) -> int:
        """SIGTERM, as an operator stops it; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)  # also closes the pipes
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.proc.kill()
        self.proc.communicate(timeout=30)


async def run_js(js_dir: Path, script: str, scenario: dict[str, Any]) -> list[Any]:
    """Run a script of tests/js with a JSON scenario; return its JSON output lines."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        script,
        json.dumps(scenario),
        cwd=js_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]
