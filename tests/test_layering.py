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
