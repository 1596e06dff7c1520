"""The FTN3 core stays free of I/O so every transport can share it."""

from __future__ import annotations

import ast
from pathlib import Path

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
