"""The console's headers are data, and its login form cannot be sent from elsewhere: a real
server on 127.0.0.1 and httpx, with the probes a hostile link or page would make."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from websockets.http11 import Request

from futoin_evt.console.config import ConsoleConfig
from futoin_evt.server.app import EventServer
from futoin_evt.server.http import Exchange, HttpEndpoint
from futoin_evt.server.websocket import TransportConfig, WebSocketTransport
from futoin_evt.wsio import ServerIO

from .support.console import console_login, csrf_in
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

COOKIE = "futoin_evt_console"
#: A ``next`` that would add a cookie and a header of its own to the redirect.
INJECTING = (
    "/console/x%0d%0aSet-Cookie:%20futoin_evt_console=ATTACKER;%20Path=/console"
    "%0d%0aX-Injected:%201"
)
#: The same through the login form (as the login page kept it in its hidden field).
INJECTING_FORM = "/console/x\r\nSet-Cookie: futoin_evt_console=ATTACKER\r\nX-Injected-Login: yes"


@pytest.fixture
async def console(start_server: ServerFactory) -> EventServer:
    return await start_server(console=ConsoleConfig())


@pytest.fixture
async def http(console: EventServer) -> AsyncIterator[httpx.AsyncClient]:
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as client:
        yield client


def assert_home_and_nothing_injected(reply: httpx.Response) -> None:
    assert reply.status_code == 303, reply.text
    assert reply.headers["location"] == "/console/streams"
    assert "x-injected" not in reply.headers
    assert "x-injected-login" not in reply.headers
    assert not any("ATTACKER" in c for c in reply.headers.get_list("set-cookie"))


async def test_a_next_with_line_breaks_goes_home_with_a_session(http: httpx.AsyncClient) -> None:
    assert (await console_login(http, "alice", USERS["alice"])).status_code == 303
    reply = await http.get(f"login?next={INJECTING}")
    assert_home_and_nothing_injected(reply)
    assert http.cookies[COOKIE] != "ATTACKER"


async def test_a_next_with_line_breaks_neither_stays_in_the_login_form_nor_reaches_the_login(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get(f"login?next={INJECTING}")
    assert page.status_code == 200
    assert "Set-Cookie" not in page.text
    assert 'name="next" value=""' in page.text
    reply = await console_login(http, "alice", USERS["alice"], next=INJECTING_FORM)
    assert_home_and_nothing_injected(reply)
    # the session it made is the one that works
    assert (await http.get("streams")).status_code == 200


async def test_a_next_beyond_ascii_goes_home(http: httpx.AsyncClient) -> None:
    reply = await console_login(http, "alice", USERS["alice"], next="/console/\u20ac\u0100")
    assert_home_and_nothing_injected(reply)
    reply = await http.get("login?next=/console/%E2%82%AC")
    assert_home_and_nothing_injected(reply)
    # a page of the console is where the login goes on to, its query kept
    reply = await http.get("login?next=/console/consumers%3Fstream%3Dorders")
    assert reply.headers["location"] == "/console/consumers?stream=orders"


class _Echo(HttpEndpoint):
    """Answers with the header the query names (as a bug elsewhere might)."""

    async def handle(
        self, io: ServerIO, request: Request, body: bytes, exchange: Exchange
    ) -> int | None:
        query = parse_qs(urlsplit(request.path).query)
        exchange.respond(200, b"ok\n", headers=[(query["name"][0], query["value"][0])])
        return None


@pytest.mark.parametrize(
    ("value", "why"), [("a\r\nX-Injected: 1", "line break"), ("\u20ac", "beyond Latin-1")]
)
async def test_a_header_that_cannot_be_one_is_a_500_naming_it_and_its_request(
    console: EventServer, value: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """(A port of its own serves the endpoint: the server's own never send such a header.)"""
    echo = _Echo("/echo", console.authenticator, console.transport.is_secure)
    transport = WebSocketTransport(console.executor, TransportConfig(port=0))
    transport.http_handler = echo.take
    await transport.start()
    try:
        await echo_probes(
            transport.url.replace("ws", "http", 1).rstrip("/") + "/echo", value, why, caplog
        )
    finally:
        await transport.close()


async def echo_probes(url: str, value: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="futoin_evt.server.http"):
        async with httpx.AsyncClient(timeout=30) as http:
            reply = await http.get(url, params={"name": "X-Echo", "value": value})
            assert reply.status_code == 500, why
            assert "x-injected" not in reply.headers
            assert reply.text == (
                "The response's X-Echo header holds a character a header cannot carry.\n"
            )
            # a Location is percent-encoded: it never fails
            reply = await http.get(url, params={"name": "Location", "value": f"/x/{value} y"})
            assert reply.status_code == 200
            encoded = {"line break": "a%0D%0AX-Injected:%201", "beyond Latin-1": "%E2%82%AC"}
            assert reply.headers["location"] == f"/x/{encoded[why]}%20y"
    (record,) = [r for r in caplog.records if "X-Echo" in r.getMessage()]
    assert record.exc_info is None
    assert "GET /echo?name=X-Echo" in record.getMessage()


async def test_a_login_without_its_forms_token_is_refused(
    console: EventServer, http: httpx.AsyncClient
) -> None:
    form = {"user": "alice", "password": USERS["alice"]}
    reply = await http.post("login", data=form)
    assert reply.status_code == 403
    assert "login form&#39;s token is missing or wrong: load the login page again" in reply.text
    assert COOKIE not in http.cookies
    # a token of another pre-session cookie (the attacker's own) is no better
    assert console.console_url is not None
    async with httpx.AsyncClient(base_url=console.console_url, timeout=30) as attacker:
        token = csrf_in((await attacker.get("login")).text)
    await http.get("login")  # the victim's pre-session cookie
    reply = await http.post("login", data={**form, "csrf": token})
    assert reply.status_code == 403
    assert COOKIE not in http.cookies


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "null"},
        {"Origin": "http://elsewhere.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
    ids=["origin-null", "foreign-origin", "cross-site", "same-site"],
)
async def test_a_login_sent_from_another_site_is_refused(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    token = csrf_in((await http.get("login")).text)
    form = {"user": "alice", "password": USERS["alice"], "csrf": token}
    reply = await http.post("login", data=form, headers=headers)
    assert reply.status_code == 403
    assert "<h1>Not allowed</h1>" in reply.text
    assert COOKIE not in http.cookies
    # from the console's own page, it works
    reply = await http.post("login", data=form, headers={"Sec-Fetch-Site": "same-origin"})
    assert reply.status_code == 303
    assert COOKIE in http.cookies
