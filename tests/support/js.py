"""The official FutoIn JavaScript client (tests/js) as a peer."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any


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
