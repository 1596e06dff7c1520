"""eventsourcing's own DCB recorder test case, unmodified, against a running server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from eventsourcing.dcb.tests import DCBRecorderTestCase

from futoin_evt.dcb.eventsourcing import FutoinDCBRecorder

from .support.servers import USERS, ServerProcess

pytestmark = pytest.mark.functional


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    db = tmp_path / "dcb.sqlite"
    subprocess.run(
        [sys.executable, "-m", "futoin_evt", "user", "add", "alice", "--password-stdin",
         "--db", str(db)],
        input=USERS["alice"] + "\n", text=True, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "futoin_evt", "grant", "alice", "read,write", "*", "--db", str(db)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = ServerProcess(db)
    try:
        yield server.url.replace("ws", "http", 1)
    finally:
        server.stop()


class TestFutoinDCBRecorder(DCBRecorderTestCase):
    url: str

    @pytest.fixture(autouse=True)
    def _server(self, server_url: str) -> None:
        self.url = server_url

    def recorder(self) -> FutoinDCBRecorder:
        return FutoinDCBRecorder(self.url, credentials=f"alice:{USERS['alice']}")

    def test_append_read(self) -> None:
        recorder = self.recorder()
        try:
            self._test_append_read(recorder)
        finally:
            recorder.close()

    def test_append_subscribe(self) -> None:
        recorder = self.recorder()
        try:
            self._test_append_subscribe(recorder)
        finally:
            recorder.close()
