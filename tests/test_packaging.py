"""The built package carries what an installed server needs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .support.servers import ROOT

pytestmark = pytest.mark.functional


def test_wheel_ships_the_iface_definitions(tmp_path: Path) -> None:
    """The pure-Python wheel (``FUTOIN_EVT_PURE=1``): every module as source, nothing compiled,
    for any platform."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "FUTOIN_EVT_PURE": "1"},
    )
    (wheel,) = tmp_path.glob("futoin_evt-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for iface in (ROOT / "ifaces").glob("*-iface.json"):
        assert f"futoin_evt/ifaces/{iface.name}" in names
    assert "futoin_evt/py.typed" in names
    assert "futoin_evt/notify/selector.lark" in names  # the selector grammar
    assert "futoin_evt/amqp/filter.lark" in names  # the AMQP filters' grammar
    # the console's templates, style and script
    console = ROOT / "futoin_evt" / "console"
    for asset in [*console.glob("templates/*.html"), *console.glob("static/*")]:
        assert asset.relative_to(ROOT).as_posix() in names
    # every module of every package (setup.cfg lists the packages one by one)
    for module in (ROOT / "futoin_evt").rglob("*.py"):
        assert module.relative_to(ROOT).as_posix() in names
    assert not [name for name in names if name.endswith(".so")]
