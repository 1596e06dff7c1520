"""Users, grants and SAS tokens as the operator changes them on ``--db`` while
``futoin-evt serve`` runs (SQLite and PostgreSQL, one worker and two): a grant is in use by
the time the command returns, a revoke refuses within 100 ms of it, a password change ends
the user's FTN3 connection, AMQP connection and console session, and a SAS token that
expires too far ahead is refused."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proton import ConnectionException, Endpoint, Message
from proton.utils import BlockingConnection

from futoin_evt.auth.sas import sign
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.ftn3.errors import FTN3Error

from .support.cli import run
from .support.console import console_login
from .support.servers import ServerProcess, free_port
from .support.waiting import until

pytestmark = pytest.mark.functional

#: A revoke refuses within this many seconds of the command's return (the requirement).
REVOKED_WITHIN = 0.1
#: How long a closing connection is waited for at most (it closes within ``REVOKED_WITHIN``
#: of being told; the test's own threads may be slow on a busy machine).
CLOSED_WITHIN = 10.0
#: FTN3 connections opened to a group of workers: each lands on one of them.
CONNECTIONS = 12


def ok(db: str, *args: str, stdin: str = "") -> str:
    """A command on ``--db`` that must succeed; its output."""
    result = run(*args, "--db", db, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def secret(tmp_path: Path) -> str:
    """The SAS secret file of the server and the commands."""
    return str(tmp_path / "sas-secret")


@pytest.fixture
def served(store_db: str, serve_workers: int, secret: str) -> Iterator[ServerProcess]:
    """``futoin-evt serve`` on the database (no users yet), with AMQP (at
    ``server.amqp_url``) and the console."""
    amqp_port = free_port()
    server = ServerProcess(store_db, 0, "--amqp", f"127.0.0.1:{amqp_port}", "--sas-secret",
                           secret, "--console", workers=serve_workers)  # fmt: skip
    server.amqp_url = f"amqp://127.0.0.1:{amqp_port}"
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.kill()


async def connections(server: ServerProcess, credentials: str) -> list[EventStreamClient]:
    return [
        await EventStreamClient.connect(server.url, credentials=credentials)
        for _ in range(CONNECTIONS)
    ]


async def refused_add(client: EventStreamClient) -> bool:
    """Whether an add on ``client`` is refused for want of the write right."""
    try:
        await client.add_event("ORDER_PLACED", {"n": 1})
    except FTN3Error as exc:
        if exc.name != "SecurityError":
            raise
        return True
    return False


async def test_the_tour_grant_then_add_and_a_revoke_within_100_ms(
    served: ServerProcess, store_db: str
) -> None:
    ok(store_db, "user", "add", "shop", "--password-stdin", stdin="s3cret\n")
    ok(store_db, "grant", "shop", "read,write", "*")
    shop = {"FUTOIN_EVT_USER": "shop", "FUTOIN_EVT_PASSWORD": "s3cret"}
    added = run("add", "ORDER_PLACED", '{"id": 1}', "--url", served.url, env=shop)
    assert added.returncode == 0, added.stderr
    clients = await connections(served, "shop:s3cret")
    try:
        for client in clients:  # every worker has the grant in use
            assert not await refused_add(client)
        ok(store_db, "revoke", "shop", "write", "*")
        pending = list(clients)

        async def every_add_refused() -> bool:
            pending[:] = [client for client in pending if not await refused_add(client)]
            return not pending

        await until(
            every_add_refused, "every connection refused an add", REVOKED_WITHIN, interval=0
        )
        ok(store_db, "grant", "shop", "write", "*")
        for client in clients:  # given back: in use by the time the command returned
            assert not await refused_add(client)
    finally:
        for client in clients:
            await client.close()


def amqp_closed(server: ServerProcess, change: Any) -> str:
    """Log in to AMQP with alice's password, attach a link, run ``change``; why the server
    closed the connection after it."""
    assert server.amqp_url is not None
    port = server.amqp_url.rsplit(":", 1)[1]
    conn = BlockingConnection(
        f"amqp://alice:old-pw@127.0.0.1:{port}", allowed_mechs="PLAIN", timeout=30
    )
    endpoint = conn.conn
    assert endpoint is not None
    try:
        conn.create_sender("events")
        change()
        try:
            conn.wait(
                lambda: bool(endpoint.state & Endpoint.REMOTE_CLOSED),
                timeout=CLOSED_WITHIN,
                msg="the connection to be closed",
            )
        except ConnectionException as exc:
            return str(exc)
        condition = endpoint.remote_condition
        return f"{condition.name}: {condition.description}" if condition else "closed"
    finally:
        conn.close()


async def test_a_password_change_ends_the_users_connections_and_sessions(
    served: ServerProcess, store_db: str
) -> None:
    ok(store_db, "user", "add", "alice", "--password-stdin", stdin="old-pw\n")
    ok(store_db, "grant", "alice", "read,write", "*")
    base = served.url.replace("ws://", "http://") + "console/"
    clients = await connections(served, "alice:old-pw")
    async with httpx.AsyncClient(base_url=base) as browser:
        logged_in = await console_login(browser, "alice", "old-pw")
        assert logged_in.status_code == 303, logged_in.text
        assert (await browser.get("streams")).status_code == 200
        for client in clients:
            await client.ping()

        def change() -> None:
            ok(store_db, "user", "passwd", "alice", "--password-stdin", stdin="new-pw\n")

        why = await asyncio.to_thread(amqp_closed, served, change)
        assert "password changed" in why, why
        for client in clients:
            async with asyncio.timeout(CLOSED_WITHIN):
                await client.ftn3.wait_closed()
        page = await browser.get("streams")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/console/login")
    for client in clients:
        await client.close()
    # the new password logs in, the old one no longer does
    async with await EventStreamClient.connect(served.url, credentials="alice:old-pw") as old:
        with pytest.raises(FTN3Error, match="Invalid credentials"):
            await old.ping()
    async with await EventStreamClient.connect(served.url, credentials="alice:new-pw") as fresh:
        await fresh.add_event("ORDER_PLACED", {})
        ok(store_db, "user", "remove", "alice")  # a removal ends the connection too
        async with asyncio.timeout(CLOSED_WITHIN):
            await fresh.ftn3.wait_closed()


async def test_a_schema_added_on_the_database_checks_the_next_event(
    served: ServerProcess, store_db: str, tmp_path: Path
) -> None:
    ok(store_db, "user", "add", "shop", "--password-stdin", stdin="s3cret\n")
    ok(store_db, "grant", "shop", "read,write", "*")
    schema = tmp_path / "order.json"
    schema.write_text(
        json.dumps(
            {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
        )
    )
    clients = await connections(served, "shop:s3cret")
    try:
        for client in clients:
            await client.add_event("ORDER_PLACED", {"note": "no id"})
        ok(store_db, "schema", "add", "events", "ORDER_PLACED", str(schema))
        pending = list(clients)

        async def every_invalid_event_rejected() -> bool:
            pending[:] = [client for client in pending if not await rejected_add(client)]
            return not pending

        await until(
            every_invalid_event_rejected, "every connection rejected", REVOKED_WITHIN, interval=0
        )
    finally:
        for client in clients:
            await client.close()


async def rejected_add(client: EventStreamClient) -> bool:
    """Whether an event without its schema's ``id`` is refused on ``client``."""
    try:
        await client.add_event("ORDER_PLACED", {"note": "no id"})
    except FTN3Error as exc:
        if "id" not in exc.desc:
            raise
        return True
    return False


def put_token(server: ServerProcess, token: str, audience: str) -> tuple[int, str]:
    """One put-token on ``$cbs`` of a new ANONYMOUS connection: (status, description)."""
    assert server.amqp_url is not None
    port = server.amqp_url.rsplit(":", 1)[1]
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", allowed_mechs="ANONYMOUS", timeout=30)
    try:
        replies = conn.create_receiver("$cbs", credit=1)
        requests = conn.create_sender("$cbs")
        requests.send(
            Message(
                id=1,
                reply_to="$cbs",
                body=token,
                properties={
                    "operation": "put-token",
                    "type": "servicebus.windows.net:sastoken",
                    "name": audience,
                },
            )
        )
        reply = replies.receive(timeout=30)
        properties: dict[str, Any] = dict(reply.properties or {})
        return properties["status-code"], properties["status-description"]
    finally:
        conn.close()


async def test_a_sas_token_that_expires_too_far_ahead_is_refused(
    served: ServerProcess, store_db: str, secret: str
) -> None:
    policy = ("sas", "policy", "add", "shop-send", "--stream", "*", "--claims", "Send")
    key = ok(store_db, *policy, "--sas-secret", secret).strip()
    audience = "sb://127.0.0.1/events"
    now = int(time.time())
    far = sign(audience, "shop-send", key, now + 10**9)
    status, why = await asyncio.to_thread(put_token, served, far, audience)
    assert status == 401
    assert "expiry (se) is more than 604800 seconds away" in why
    soon = sign(audience, "shop-send", key, now + 3600)
    assert (await asyncio.to_thread(put_token, served, soon, audience))[0] == 200
