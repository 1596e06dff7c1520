"""The FTN3 core stays free of I/O so every transport can share it."""

from __future__ import annotations

import ast
from pathlib import Path

import futoin_evt
import futoin_evt.ftn3

FORBIDDEN = {"asyncio", "websockets", "sqlite3", "aiosqlite", "socket", "ssl"}


def test_ftn3_core_imports_no_io() -> None:
    package = Path(futoin_evt.ftn3.__file__).parent
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{module.name} imports {name}"


BACKENDS = {"aiosqlite", "psycopg", "psycopg_pool"}
BACKEND_MODULES = ("storage.sqlite", "storage.native", "storage.schema", "storage.postgres")


def test_nothing_above_storage_imports_a_backend() -> None:
    """Services, transports and the CLI reach a store through the contract and open_store."""
    package = Path(futoin_evt.ftn3.__file__).parent.parent
    for module in package.rglob("*.py"):
        if module.parent.name == "storage" or "storage" in module.parent.parts[-2:]:
            continue
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in BACKENDS, f"{module} imports {name}"
                assert not name.endswith(BACKEND_MODULES), f"{module} imports {name}"


def test_the_amqp_door_knows_no_other_door() -> None:
    """The AMQP listener reaches the log through the event log calls, not through FTN3's
    services or the WebSocket transport."""
    package = Path(futoin_evt.__file__).parent / "amqp"
    others = {"websockets", "wsio", "websocket", "http", "executor", "services", "push", "feed"}
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = set(node.module.split(".")) | {a.name for a in node.names}
                assert not parts & others, f"{module.name} imports {node.module}"
                assert "storage" not in node.module.split("."), f"{module.name} uses the store"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] != "websockets", module.name
