"""rhea (npm), an AMQP 1.0 client no one here wrote, against the AMQP listener."""

from __future__ import annotations

from pathlib import Path

import pytest

from futoin_evt.amqp import AmqpConfig, AmqpLimits
from futoin_evt.server.app import EventServer

from .support.js import run_js
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional


@pytest.fixture
async def amqp_server(start_server: ServerFactory) -> EventServer:
    # frames of 16 KiB: a large event goes in several transfers both ways
    return await start_server(amqp=AmqpConfig(port=0, limits=AmqpLimits(max_frame_bytes=16384)))


async def test_rhea_sends_and_receives_small_and_multi_frame_messages(
    js_peer: Path, amqp_server: EventServer
) -> None:
    assert amqp_server.amqp is not None
    big = 60_000  # four frames of 16 KiB, both ways
    lines = await run_js(
        js_peer,
        "amqp_rhea.js",
        {"port": amqp_server.amqp.port, "user": "alice", "password": USERS["alice"],
         "count": 300, "big": big},
    )  # fmt: skip
    *messages, summary = lines
    assert summary == {"accepted": 301}
    assert messages[:300] == [{"subject": "RHEA", "body": {"n": n}} for n in range(300)]
    assert messages[300] == {"subject": "RHEA", "body": {"length": big}}
