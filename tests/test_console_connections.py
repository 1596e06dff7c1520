"""The console's connections page, in a real browser: a server with the console and AMQP, an
FTN3 client and an AMQP client (python-qpid-proton) connected as two users; an admin sees both
and closes one, a user sees only their own and closes none."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, expect
from proton import ConnectionException
from proton.utils import BlockingConnection, BlockingReceiver

from futoin_evt.amqp.config import AmqpConfig
from futoin_evt.auth.users import hash_password
from futoin_evt.client.aio import EventStreamClient
from futoin_evt.console.config import ConsoleConfig
from futoin_evt.log.connections import CLOSED_BY_ADMIN
from futoin_evt.server.app import EventServer

from .support import console
from .support.console import (
    ADMIN,
    client_of,
    console_login,
    csrf_in,
    in_browser,
    log_in,
    menu,
    needs_chromium,
    shoot,
)
from .support.ftn3 import closed_with
from .support.servers import USERS, ServerFactory, ServerProcess

#: The database of the console behind a group of workers.
db = console.db

pytestmark = pytest.mark.functional

WITHIN = 30.0
PEER = re.compile(r"^127\.0\.0\.1:\d+$")


@pytest.fixture
async def served(start_server: ServerFactory) -> EventServer:
    server = await start_server(console=ConsoleConfig(), amqp=AmqpConfig(port=0))
    await server.store.add_user(ADMIN[0], hash_password(ADMIN[1]), is_admin=True)
    await server.access.changed_here()
    return server


@pytest.fixture
async def alice(served: EventServer) -> AsyncIterator[EventStreamClient]:
    """alice over FTN3, past her login (a call made)."""
    async with await client_of(served, "alice") as client:
        await client.add_event("ORDER_PLACED", {"n": 1})
        yield client


class Amqp:
    """bob over AMQP (SASL PLAIN), a receiver attached; blocking, so run in a thread."""

    def __init__(self, url: str) -> None:
        self.connection = BlockingConnection(
            url, user="bob", password=USERS["bob"], allowed_mechs="PLAIN", timeout=WITHIN
        )
        self.receiver: BlockingReceiver = self.connection.create_receiver("events", credit=10)

    def closed_by_server(self) -> str:
        """Waits for the server's close; what proton says of it."""
        with pytest.raises(ConnectionException) as closed:
            self.receiver.receive(timeout=WITHIN)
        return str(closed.value)

    def close(self) -> None:
        with contextlib.suppress(ConnectionException):  # closed by the server already
            self.connection.close()


@pytest.fixture
async def bob(served: EventServer) -> AsyncIterator[Amqp]:
    assert served.amqp_url is not None
    client = await asyncio.to_thread(Amqp, served.amqp_url)
    yield client
    await asyncio.to_thread(client.close)


@asynccontextmanager
async def console_as(
    server: EventServer, user: str, password: str
) -> AsyncIterator[httpx.AsyncClient]:
    assert server.console_url is not None
    async with httpx.AsyncClient(base_url=server.console_url, timeout=WITHIN) as http:
        assert (await console_login(http, user, password)).status_code == 303
        yield http


def local_peer(client: EventStreamClient) -> str:
    """The client's own address, as the server sees it (``host:port``)."""
    transport = client.ftn3._io.transport
    assert transport is not None
    host, port = transport.get_extra_info("sockname")[:2]
    return f"{host}:{port}"


def row(user: str) -> str:
    return f'#connections tr[data-user="{user}"]'


def ids_in(page: str) -> Iterator[tuple[str, str]]:
    """(user, connection id) of each row of the page."""
    for found in re.finditer(r'<tr data-user="([^"]+)".*?</tr>', page, re.DOTALL):
        key = re.search(r'name="id" value="([^"]+)"', found.group(0))
        assert key is not None, found.group(0)
        yield found.group(1), key.group(1)


@in_browser
@needs_chromium
async def test_an_admin_sees_every_connection_and_closes_one(
    served: EventServer, alice: EventStreamClient, bob: Amqp, page: Page, shots: list[Path]
) -> None:
    await log_in(page, served, *ADMIN)
    await menu(page, "Connections")
    await expect(page.locator(row("alice") + " .door")).to_have_text("FTN3 over WebSocket")
    await expect(page.locator(row("alice") + " .peer")).to_have_text(local_peer(alice))
    await expect(page.locator(row("alice") + " .calls")).to_have_text("0")
    await expect(page.locator(row("bob") + " .door")).to_have_text("AMQP 1.0")
    await expect(page.locator(row("bob") + " .peer")).to_have_text(PEER)
    await expect(page.locator(row("bob") + " .calls")).to_have_text("—")
    await expect(page.locator(row("alice") + " .since")).to_have_text(re.compile(r"\(\d+ s ago\)$"))
    await expect(page.locator("#connections tbody tr")).to_have_count(2)  # no console session
    await shoot(page, shots, "connections")

    await page.locator(row("alice")).get_by_role("button", name="Close").click()
    await expect(page.locator(".notice")).to_have_text(
        f"Closed the FTN3 over WebSocket connection of alice from {local_peer(alice)}."
    )
    assert await closed_with(alice.ftn3) == (1008, CLOSED_BY_ADMIN)
    await page.reload()
    await expect(page.locator(row("alice"))).to_have_count(0)
    await expect(page.locator(row("bob"))).to_have_count(1)  # the other one is untouched


async def test_a_user_sees_only_their_own_and_closes_none(
    served: EventServer, alice: EventStreamClient, bob: Amqp
) -> None:
    async with console_as(served, *ADMIN) as admin:
        listed = dict(ids_in((await admin.get("connections")).text))
    assert set(listed) == {"alice", "bob"}
    async with console_as(served, "alice", USERS["alice"]) as own:
        page = await own.get("connections")
        assert page.status_code == 200
        assert 'data-user="alice"' in page.text
        assert 'data-user="bob"' not in page.text
        assert "connections/close" not in page.text  # no close button
        csrf = csrf_in((await own.get("publish")).text)
        refused = await own.post("connections/close", data={"csrf": csrf, "id": listed["bob"]})
        assert refused.status_code == 403
        assert "Only admin users close connections." in refused.text
    async with console_as(served, *ADMIN) as admin:
        assert dict(ids_in((await admin.get("connections")).text)) == listed  # none closed


async def test_an_admin_closes_an_amqp_connection_and_a_form_needs_its_token(
    served: EventServer, bob: Amqp
) -> None:
    async with console_as(served, *ADMIN) as admin:
        page = (await admin.get("connections")).text
        key = dict(ids_in(page))["bob"]
        assert served.amqp is not None
        amqp_sockets = list(served.amqp.slots)  # bob's only
        no_token = await admin.post("connections/close", data={"id": key})
        assert no_token.status_code == 403
        assert "CSRF token is missing or wrong" in no_token.text
        closed = await admin.post("connections/close", data={"csrf": csrf_in(page), "id": key})
        assert closed.status_code == 303
        said = await asyncio.to_thread(bob.closed_by_server)
        assert "amqp:connection:forced" in said
        assert CLOSED_BY_ADMIN in said
        # gone from the list once the server's side has closed; closing it again finds nothing
        async with asyncio.timeout(WITHIN):
            await asyncio.gather(*(connection.closed for connection in amqp_sockets))
        assert 'data-user="bob"' not in (await admin.get("connections")).text
        again = await admin.post("connections/close", data={"csrf": csrf_in(page), "id": key})
        assert again.status_code == 404


async def test_each_worker_lists_its_own_connections_and_says_so(
    db: str, servers: list[ServerProcess], worker: console.Connect
) -> None:
    group = console.consoled(db)
    servers.append(group)
    pages = [worker(group, 0), worker(group, 1)]
    token = pages[0].log_in()  # alice, who is no admin: her own connections
    client = await EventStreamClient.connect(group.url, credentials=f"alice:{USERS['alice']}")
    async with client:
        await client.ping()
        serving = await group.worker_of(client.ftn3)
        shown = [page.get("connections", token).text for page in pages]
    for slot, text in enumerate(shown):
        assert f"of worker {slot + 1} of 2 (the one serving this page" in text
        assert ('data-user="alice"' in text) == (slot == serving), slot
