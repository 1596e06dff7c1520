"""The web console: pages rendered here from Jinja2 templates, no wire in it.

:class:`Console` answers one :class:`ConsoleRequest` with one :class:`ConsoleResponse` (the
server's HTTP endpoint carries them) through the handler of its method and path, which a
group of pages gives (:mod:`.login`, :mod:`.pages_streams`, :mod:`.pages_events`,
:mod:`.publish`, :mod:`.pages_consumers`, :mod:`.tail`, :mod:`.pages_users`,
:mod:`.pages_server`; what they share is :mod:`.pages`). Every page but the login page needs
a session; every POST needs its CSRF token (the session's; the login form's, bound to a
pre-session cookie: :mod:`.guard`) and must not come from another site. Per-partition data
is read through the event logs (``log/``) of the partitions the registry knows, as the user
of the session, so a stream added by any process shows as soon as the registry has it.

A user sees what their rights on streams allow, as at every door: the streams they hold a
right on (heads, rates and charts of those they may read), the events, DCB queries and live
tails of streams they may read, their own consumers there and, on streams they manage,
everyone's. Dropping or seeking a consumer needs read (their own) or manage (another's).
What the console changes goes through the same calls as the command line and the ops iface,
as the session's user: streams through the registry (manage on the name), an event through
its partition's log (write), users and grants through :class:`~futoin_evt.log.users.UserAdmin`
(admins), a connection closed through :class:`~futoin_evt.log.connections.Connections`
(admins; anyone else sees their own connections only). A refusal is the error page with
status 403 and the sentence naming the right and the stream, the same for a name that names
no stream (unless the user holds some right on that name, who gets 404).

Sessions are in the database (:mod:`.sessions`): a login on one worker, or on another
process on the same database, holds on every other.
"""

from __future__ import annotations

import asyncio
import contextlib
from importlib import resources
from typing import Final
from urllib.parse import parse_qs, quote, urlsplit

from ..auth.users import Authenticator
from ..domain.management import ManagementBus
from ..domain.sessions import SessionLimits
from ..log.connections import Connections
from ..log.deliveries import ConnectedDeliveries
from ..log.errors import Fault, fault_of
from ..log.schemas import SchemaRegistry
from ..log.sessions import ConsoleSessions
from ..log.streams import StreamLogs, StreamRegistry
from ..log.users import UserAdmin
from ..notify.live import LiveStreams
from .config import ConsoleConfig
from .exchange import (
    CONSOLE_DOOR,
    SECURITY_HEADERS,
    Call,
    ConsoleRequest,
    ConsoleResponse,
    PageError,
    Routes,
    redirect,
)
from .formatting import sentence
from .guard import LOGIN_COOKIE, foreign, login_csrf_matches, login_token
from .login import COOKIE, LoginPages
from .overview import ServerFacts
from .pages import Pages
from .pages_consumers import ConsumerPages
from .pages_events import EventPages
from .pages_server import ServerPages
from .pages_streams import StreamPages
from .pages_users import UserPages
from .publish import PublishPages
from .samples import HeadSamples
from .sessions import Session, Sessions
from .tail import TailPages

#: The status of the error page for each kind of failure of the log (:mod:`futoin_evt.log.errors`),
#: which says its sentence.
CONSOLE_FAULTS: Final[dict[Fault, int]] = {
    Fault.UNAUTHENTICATED: 401,
    Fault.REFUSED: 403,
    Fault.BAD_INPUT: 400,
    Fault.NOT_WRITABLE: 400,
    Fault.CONDITION_FAILED: 409,
    Fault.ID_CONFLICT: 409,
    Fault.UNAVAILABLE: 503,
    Fault.DAMAGED: 500,
}

__all__ = ["CONSOLE_DOOR", "COOKIE", "Console", "ConsoleRequest", "ConsoleResponse", "PageError"]

DEFAULT_CONFIG: Final = ConsoleConfig()
#: A form's body larger than this is refused (an event's data is published through one).
MAX_FORM_BYTES: Final = 1024 * 1024
STATIC_TYPES: Final = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


class Console:
    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        push: ConnectedDeliveries,
        authenticator: Authenticator,
        notices: ManagementBus,
        live: LiveStreams,
        sessions: ConsoleSessions,
        config: ConsoleConfig = DEFAULT_CONFIG,
        schemas: SchemaRegistry | None = None,
    ) -> None:
        """``sessions``: where the sessions are kept (the database every process shares)."""
        self.config = config
        self.sessions = Sessions(
            sessions,
            SessionLimits(config.max_sessions, config.idle_seconds, config.lifetime_seconds),
        )
        self._checking: asyncio.Task[None] | None = None
        self.samples = HeadSamples(logs, streams, config.sample_seconds)
        #: Set when the server shuts down: live tails end at once.
        self.closing = asyncio.Event()
        self._pages = Pages(logs, streams, self.sessions, config, schemas)
        self.base = self._pages.base
        self._server_pages = ServerPages(self._pages, self.samples)
        self._user_pages = UserPages(self._pages)
        self._routes: Routes = {}
        for group in (
            LoginPages(self._pages, authenticator),
            self._server_pages,
            StreamPages(self._pages, self.samples),
            PublishPages(self._pages),
            EventPages(self._pages),
            self._user_pages,
            ConsumerPages(self._pages, push, self.samples),
            TailPages(self._pages, live, notices, self.closing),
        ):
            self._routes.update(group.routes())

    @property
    def facts(self) -> ServerFacts | None:
        """The server's doors and workers (set by the server; None: the overview omits them)."""
        return self._server_pages.facts

    @facts.setter
    def facts(self, facts: ServerFacts | None) -> None:
        self._server_pages.facts = facts

    @property
    def users(self) -> UserAdmin | None:
        """Users and their rights, for admins (set by the server; None: no users pages)."""
        return self._user_pages.admin

    @users.setter
    def users(self, admin: UserAdmin | None) -> None:
        self._user_pages.admin = admin

    @property
    def connections(self) -> Connections | None:
        """This process's open connections (set by the server; None: the page lists none)."""
        return self._server_pages.connections

    @connections.setter
    def connections(self, connections: Connections | None) -> None:
        self._server_pages.connections = connections

    def start(self) -> None:
        self.samples.start()
        self._checking = asyncio.get_running_loop().create_task(
            self.sessions.keep_checking(self.config.session_check_seconds)
        )

    async def close(self) -> None:
        self.closing.set()
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
        await self.samples.close()

    async def handle(self, request: ConsoleRequest) -> ConsoleResponse:
        url = urlsplit(request.target)
        path = url.path[len(self.base) :] or "/"
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if path in ("/", ""):
            return redirect(f"{self.base}/streams")
        if path.startswith("/static/") and request.method == "GET":
            return _static(path[len("/static/") :])
        handler = self._routes.get((request.method, path))
        if handler is None:
            methods = [m for m, p in self._routes if p == path]
            if methods:
                raise PageError(405, f"This page serves {', '.join(methods)} only.")
            return self.error(404, "No such page.")
        token = request.cookie(COOKIE)
        session = await self.sessions.get(token)
        form: dict[str, str] = {}
        if request.method == "POST":
            form = _form(request, session, path)
        call = Call(request, path, query, form, session, token)
        if session is None and path != "/login":
            if request.method == "GET" and path != "/tail/stream":
                return redirect(f"{self.base}/login?next={quote(request.target, safe='')}")
            raise PageError(401, "Log in first.")
        try:
            response = await handler(call)
        except PageError as exc:
            response = self._error(session, exc.status, exc.message)
        except Exception as exc:
            fault = fault_of(exc)
            if fault is None:
                raise
            response = self._error(session, CONSOLE_FAULTS[fault], sentence(exc))
        response.user = session.principal.name if session is not None else None
        return response

    def error(self, status: int, message: str) -> ConsoleResponse:
        return self._error(None, status, message)

    def _error(self, session: Session | None, status: int, message: str) -> ConsoleResponse:
        return self._pages.page(session, "error.html", status=status, message=message)


def _form(request: ConsoleRequest, session: Session | None, path: str) -> dict[str, str]:
    """A POST's fields, once its origin and its CSRF token (the session's; the login form's,
    bound to its pre-session cookie) are right."""
    why = foreign(request.headers, request.tls)
    if why is not None:
        raise PageError(403, why)
    if len(request.body) > MAX_FORM_BYTES:
        raise PageError(413, "The form is too large.")
    try:
        text = request.body.decode()
    except UnicodeDecodeError:
        raise PageError(400, "The form is not UTF-8.") from None
    form = {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
    if path == "/login":
        pre_session = login_token(request.cookie(LOGIN_COOKIE))
        if not login_csrf_matches(pre_session, form.get("csrf")):
            raise PageError(
                403, "The login form's token is missing or wrong: load the login page again."
            )
    elif session is None or not session.csrf_matches(form.get("csrf")):
        raise PageError(403, "The form's CSRF token is missing or wrong: load the page again.")
    return form


def _static(name: str) -> ConsoleResponse:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or suffix not in STATIC_TYPES:
        raise PageError(404, "No such file.")
    try:
        body = resources.files("futoin_evt.console").joinpath("static", name).read_bytes()
    except (FileNotFoundError, OSError):
        raise PageError(404, "No such file.") from None
    headers = [("Cache-Control", "max-age=300"), *SECURITY_HEADERS]
    return ConsoleResponse(200, body, STATIC_TYPES[suffix], headers)
