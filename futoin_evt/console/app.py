"""The web console: pages rendered here from Jinja2 templates, no wire in it.

:class:`Console` answers one :class:`ConsoleRequest` with one :class:`ConsoleResponse` (the
server's HTTP endpoint carries them). Every page but the login page needs a session; every
POST needs its CSRF token (the session's; the login form's, bound to a pre-session cookie:
:mod:`.guard`) and must not come from another site. Per-partition data is read through the
event logs (``log/``) of the partitions the registry knows, as the user of the session, so a
stream added by any process shows as soon as the registry has it.

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
no stream (unless the user holds some right on that name, who gets 404). A live tail ends when
the right it needs is revoked, when its stream is dropped, and with its session.

Sessions are in the database (:mod:`.sessions`): a login on one worker, or on another
process on the same database, holds on every other. A live tail reads through the server's
shared reader of its partition (:class:`~futoin_evt.notify.live.LiveStreams`, the one the
notification service reads through): many tails of one partition cost one reader. A push
consumer's state (in flight, retrying) is known to the worker it is connected to; the
others show it connected, as the workers' channel tells them.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, quote, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape

from ..auth.sas import is_policy
from ..auth.users import Authenticator, hash_password
from ..dcb.model import DcbInputError, parse_query
from ..dcb.service import DcbService, ReadRequest
from ..domain.management import ManagementBus
from ..domain.notification import Notification
from ..domain.partition import DEFAULT_PARTITION, Partition, StreamInfo, check_stream_name
from ..domain.principal import Principal
from ..domain.rights import BadGrant, Right
from ..domain.schemas import top_properties
from ..domain.sessions import ConsoleSessionStore, SessionLimits
from ..domain.stream import EventRejected, StoredEvent
from ..ftn3.errors import FTN3Error
from ..ftn18.push import PushService
from ..log.access import AccessDenied, UnknownUser
from ..log.access import Refused as AccessRefused
from ..log.connections import Connections
from ..log.consumers import ConsumerRow
from ..log.eventlog import DamagedEvent, EventLog, NotWritable
from ..log.schemas import SchemaRegistry
from ..log.streams import StreamLogs, StreamRegistry
from ..log.users import UserAdmin
from ..notify.live import LiveStreams, Subscription, UnknownStream, management_visible_to
from ..notify.message import NotifyError, Transformation, real_message
from ..notify.selector import compile_selector
from ..stats import INSECURE_CHANNEL
from .config import ConsoleConfig
from .guard import (
    LOGIN_COOKIE,
    foreign,
    login_csrf,
    login_csrf_matches,
    login_token,
    new_login_token,
    next_page,
)
from .overview import ServerFacts, about, size, uptime
from .samples import HISTORY_SECONDS, LAG_WINDOW_SECONDS, Chart, HeadSamples, chart
from .sessions import Session, Sessions, Tails

DEFAULT_CONFIG: Final = ConsoleConfig()
COOKIE: Final = "futoin_evt_console"
#: The console as the metrics' door label.
CONSOLE_DOOR: Final = "console"
#: Rows per page of every table.
PAGE_SIZE: Final = 50
#: Events shown per page of the event browser and the DCB query.
EVENTS_PER_PAGE: Final = 50
#: Of an event's data, at most this many characters are shown.
DATA_CHARS: Final = 2000
#: A live tail ends after this long (the page's EventSource opens a new one).
TAIL_SECONDS: Final = 3600.0
TAIL_HEARTBEAT_SECONDS: Final = 15.0
#: Why a live tail ended with its session (a logout, an eviction, anywhere).
SESSION_ENDED: Final = "The session has ended: log in again."
#: Notifications per message pushed to a tail page.
TAIL_BATCH: Final = 100
#: A form's body larger than this is refused (an event's data is published through one).
MAX_FORM_BYTES: Final = 1024 * 1024
STATIC_TYPES: Final = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
SECURITY_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
)
#: The menu entry each page is under.
_NAV: Final = {
    "users.html": "users",
    "user.html": "users",
    "overview.html": "overview",
    "stream.html": "streams",
    "publish.html": "publish",
    "event.html": "events",
    "streams.html": "streams",
    "partition.html": "streams",
    "consumers.html": "consumers",
    "consumer.html": "consumers",
    "confirm.html": "consumers",
    "tail.html": "tail",
    "events.html": "events",
    "dcb.html": "dcb",
    "connections.html": "connections",
}
#: The rights as the users pages name them.
_RIGHT_LABELS: Final = ((Right.READ, "read"), (Right.WRITE, "write"), (Right.MANAGE, "manage"))
#: The error page's heading by status (others: by their class).
_HEADINGS: Final = {
    401: "Log in first",
    403: "Not allowed",
    404: "Not found",
    405: "Not served this way",
    409: "In conflict",
    413: "Too large",
    429: "Too many at once",
    503: "Too many at once",
}
_ISO_TIME: Final = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})(:\d{2})?Z?")


@dataclass(frozen=True, slots=True)
class ConsoleRequest:
    method: str
    #: The path and query, as sent.
    target: str
    #: Header names in lower case (only those the console reads).
    headers: Mapping[str, str]
    body: bytes
    #: The peer's address (without its port): password checks are limited per address.
    peer: str
    #: TLS, loopback or a trusted channel: passwords may be sent.
    secure_channel: bool
    #: TLS: the session cookie is ``Secure``.
    tls: bool


@dataclass(slots=True)
class ConsoleResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: A streamed body (Server-Sent Events): chunks as they come.
    stream: AsyncGenerator[bytes, None] | None = None
    #: The user of the request's session, if it had one.
    user: str | None = None


class Refused(Exception):
    """A request answered with an error page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class _Call:
    """What a page handler gets."""

    request: ConsoleRequest
    path: str
    query: dict[str, str]
    form: dict[str, str]
    session: Session | None
    token: str | None

    @property
    def principal(self) -> Principal:
        assert self.session is not None
        return self.session.principal


Handler = Callable[[_Call], Awaitable[ConsoleResponse]]


class Console:
    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        push: PushService,
        authenticator: Authenticator,
        notices: ManagementBus,
        live: LiveStreams,
        sessions: ConsoleSessionStore,
        config: ConsoleConfig = DEFAULT_CONFIG,
        schemas: SchemaRegistry | None = None,
    ) -> None:
        """``sessions``: where the sessions are kept (the server's store)."""
        self._logs = logs
        self._schemas = schemas
        self._streams = streams
        self._push = push
        self._auth = authenticator
        self._notices = notices
        self._live = live
        self.config = config
        self.base = config.path.rstrip("/")
        self.sessions = Sessions(
            sessions,
            SessionLimits(config.max_sessions, config.idle_seconds, config.lifetime_seconds),
        )
        self._checking: asyncio.Task[None] | None = None
        #: The server's doors and workers (set by the server; None: the overview omits them).
        self.facts: ServerFacts | None = None
        #: Users and their rights, for admins (set by the server; None: no users pages).
        self.users: UserAdmin | None = None
        #: This process's open connections (set by the server; None: the page lists none).
        self.connections: Connections | None = None
        self.about = about(time.time())
        self.samples = HeadSamples(logs, streams, config.sample_seconds)
        #: Live tails open now.
        self.tails = 0
        #: Set when the server shuts down: live tails end at once.
        self.closing = asyncio.Event()
        self._env = Environment(
            loader=PackageLoader("futoin_evt.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            enable_async=False,
        )
        self._env.filters["number"] = _number
        self._env.filters["size"] = size
        self._pages: dict[tuple[str, str], Handler] = {
            ("GET", "/login"): self._login_page,
            ("POST", "/login"): self._login,
            ("POST", "/logout"): self._logout,
            ("GET", "/overview"): self._overview_page,
            ("GET", "/streams"): self._streams_page,
            ("GET", "/stream"): self._stream_page,
            ("POST", "/streams/add"): self._add_stream,
            ("POST", "/streams/grow"): self._grow_stream,
            ("POST", "/streams/drop"): self._drop_stream,
            ("GET", "/publish"): self._publish_page,
            ("POST", "/publish"): self._publish,
            ("GET", "/event"): self._event_page,
            ("GET", "/users"): self._users_page,
            ("GET", "/user"): self._user_page,
            ("POST", "/users/add"): self._add_user,
            ("POST", "/users/remove"): self._remove_user,
            ("POST", "/users/grant"): self._change_grant,
            ("POST", "/users/revoke"): self._change_grant,
            ("POST", "/users/policies/add"): self._add_policy,
            ("POST", "/users/policies/remove"): self._remove_policy,
            ("GET", "/partition"): self._partition_page,
            ("GET", "/consumers"): self._consumers_page,
            ("GET", "/consumers/confirm"): self._confirm_page,
            ("GET", "/consumer"): self._consumer_page,
            ("POST", "/consumers/drop"): self._drop,
            ("POST", "/consumers/seek"): self._seek,
            ("GET", "/tail"): self._tail_page,
            ("GET", "/tail/stream"): self._tail_stream,
            ("GET", "/events"): self._events_page,
            ("GET", "/dcb"): self._dcb_page,
            ("GET", "/connections"): self._connections_page,
            ("POST", "/connections/close"): self._close_connection,
        }

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

    # -- dispatch -------------------------------------------------------------------------

    async def handle(self, request: ConsoleRequest) -> ConsoleResponse:
        url = urlsplit(request.target)
        path = url.path[len(self.base) :] or "/"
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if path in ("/", ""):
            return _redirect(f"{self.base}/streams")
        if path.startswith("/static/") and request.method == "GET":
            return _static(path[len("/static/") :])
        handler = self._pages.get((request.method, path))
        if handler is None:
            methods = [m for m, p in self._pages if p == path]
            if methods:
                raise Refused(405, f"This page serves {', '.join(methods)} only.")
            return self._page(None, "error.html", status=404, message="No such page.")
        token = _cookie(request.headers.get("cookie", ""), COOKIE)
        session = await self.sessions.get(token)
        form: dict[str, str] = {}
        if request.method == "POST":
            form = self._form(request, session, path)
        call = _Call(request, path, query, form, session, token)
        if session is None and path != "/login":
            if request.method == "GET" and path != "/tail/stream":
                return _redirect(f"{self.base}/login?next={quote(request.target, safe='')}")
            raise Refused(401, "Log in first.")
        try:
            response = await handler(call)
        except Refused as exc:
            response = self._page(session, "error.html", status=exc.status, message=exc.message)
        except AccessRefused as exc:
            response = self._page(session, "error.html", status=403, message=_sentence(exc))
        response.user = session.principal.name if session is not None else None
        return response

    def error(self, status: int, message: str) -> ConsoleResponse:
        return self._page(None, "error.html", status=status, message=message)

    def _form(self, request: ConsoleRequest, session: Session | None, path: str) -> dict[str, str]:
        """A POST's fields, once its origin and its CSRF token (the session's; the login
        form's, bound to its pre-session cookie) are right."""
        why = foreign(request.headers, request.tls)
        if why is not None:
            raise Refused(403, why)
        if len(request.body) > MAX_FORM_BYTES:
            raise Refused(413, "The form is too large.")
        try:
            text = request.body.decode()
        except UnicodeDecodeError:
            raise Refused(400, "The form is not UTF-8.") from None
        form = {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
        if path == "/login":
            pre_session = login_token(_cookie(request.headers.get("cookie", ""), LOGIN_COOKIE))
            if not login_csrf_matches(pre_session, form.get("csrf")):
                raise Refused(
                    403, "The login form's token is missing or wrong: load the login page again."
                )
        elif session is None or not session.csrf_matches(form.get("csrf")):
            raise Refused(403, "The form's CSRF token is missing or wrong: load the page again.")
        return form

    def _page(
        self,
        session: Session | None,
        template: str,
        status: int = 200,
        headers: list[tuple[str, str]] | None = None,
        **values: Any,
    ) -> ConsoleResponse:
        if template == "error.html":
            values.setdefault("heading", _heading(status))
        body = (
            self._env.get_template(template)
            .render(
                base=self.base,
                session=session,
                nav=_NAV.get(template, ""),
                refresh=f"{self.config.refresh_seconds:g}",
                **values,
            )
            .encode()
        )
        headers = [("Cache-Control", "no-store"), *SECURITY_HEADERS, *(headers or [])]
        return ConsoleResponse(status, body, headers=headers)

    # -- sessions -------------------------------------------------------------------------

    async def _login_page(self, call: _Call) -> ConsoleResponse:
        if call.session is not None:
            return _redirect(self._next(call.query.get("next")))
        return self._login_form(call, 200, call.query.get("next"))

    def _login_form(
        self, call: _Call, status: int, nxt: str | None, **values: Any
    ) -> ConsoleResponse:
        """The login page, its form's CSRF token bound to the pre-session cookie (set here
        when the browser has none)."""
        cookie = _cookie(call.request.headers.get("cookie", ""), LOGIN_COOKIE)
        token = login_token(cookie)
        headers = []
        if token is None:
            token = new_login_token()
            headers.append(("Set-Cookie", self._cookie(call, LOGIN_COOKIE, token)))
        return self._page(
            None,
            "login.html",
            status=status,
            headers=headers,
            next=next_page(self.base, nxt) or "",
            csrf=login_csrf(token),
            **values,
        )

    def _cookie(self, call: _Call, name: str, value: str, *, ended: bool = False) -> str:
        secure = "; Secure" if call.request.tls else ""
        gone = "; Max-Age=0" if ended else ""
        return f"{name}={value}; Path={self.base}; HttpOnly; SameSite=Strict{gone}{secure}"

    async def _login(self, call: _Call) -> ConsoleResponse:
        request, form = call.request, call.form
        name, password = form.get("user", ""), form.get("password", "")
        nxt = form.get("next", "")
        if not request.secure_channel:
            self._auth.refusals.note(CONSOLE_DOOR, INSECURE_CHANNEL)
            raise Refused(403, "Passwords are accepted only over TLS or loopback.")
        try:
            principal = await self._auth.authenticate(f"{name}:{password}", request.peer)
        except FTN3Error:
            return self._login_form(
                call, 401, nxt, user=name, message="Wrong user name or password."
            )
        await self.sessions.end(call.token)
        token = await self.sessions.create(principal)
        cookies = [
            ("Set-Cookie", self._cookie(call, COOKIE, token)),
            ("Set-Cookie", self._cookie(call, LOGIN_COOKIE, "", ended=True)),
        ]
        return _redirect(self._next(nxt), cookies)

    async def _logout(self, call: _Call) -> ConsoleResponse:
        await self.sessions.end(call.token)
        cookie = self._cookie(call, COOKIE, "", ended=True)
        return _redirect(f"{self.base}/login", [("Set-Cookie", cookie)])

    def _next(self, target: str | None) -> str:
        """Where to go after the login: a page of the console, else its home."""
        return next_page(self.base, target) or f"{self.base}/streams"

    # -- streams --------------------------------------------------------------------------

    def _partition(
        self, call: _Call, fields: Mapping[str, str], right: Right = Right.READ
    ) -> Partition:
        """The partition ``fields`` name (a stream the caller may read when they name none),
        once the caller holds ``right`` on it: :class:`AccessDenied` when they may not, and
        for a name they hold no right on (whether a stream has it or not)."""
        who = call.principal
        name = fields.get("stream") or self._default_stream(who)
        number = fields.get("partition") or "0"
        index = _number_in(number, 5)
        try:
            check_stream_name(name)
        except ValueError:  # no stream can have it: nothing to hide
            info = None
        else:
            info = self._streams.reachable(who, name, right)
        partition = None
        if info is not None and index is not None:
            partition = self._streams.partition(name, index)
        if partition is None:
            raise Refused(404, f"No such stream and partition: {name[:60]}/{number[:10]}.")
        return partition

    def _default_stream(self, who: Principal) -> str:
        """``events`` when ``who`` may read it, else the first stream they may read."""
        access = self._streams.access
        if access.allows(who, Right.READ, DEFAULT_PARTITION.stream):
            return DEFAULT_PARTITION.stream
        readable = (s.name for s in self._streams if access.allows(who, Right.READ, s.name))
        return next(readable, DEFAULT_PARTITION.stream)

    def _log(self, partition: Partition) -> EventLog:
        return self._logs.partition(partition)

    async def _extent(self, call: _Call, partition: Partition) -> dict[str, Any]:
        """A partition's row: head, oldest, rate, who holds back discarding (named to those
        who manage the stream; to others only when it is theirs)."""
        events, who = self._log(partition), call.principal
        limits = await events.retention_limits(who)
        held = limits.lowest_position is not None  # position 0 (never acknowledged) holds too
        lowest = await events.consumers.lowest(who) if held else None
        return {
            "partition": partition,
            "readable": True,
            "head": max(limits.newest_id, events.head),
            "oldest": limits.oldest_id,
            "rate": self.samples.rate(partition),
            "bytes": _kept_bytes(
                limits.oldest_id,
                max(limits.newest_id, events.head),
                self.samples.event_size(partition),
            ),
            "held_back_by": lowest,
            "manages": events.guard.shown_to(who) is None,
            "chart": self._chart(partition, 160, 28),
        }

    def _chart(self, partition: Partition, width: int, height: int) -> Chart:
        rates = self.samples.rates(partition)
        return chart(rates, width, height, time.time(), 30 * self.samples.interval)

    async def _streams_page(self, call: _Call) -> ConsoleResponse:
        """The streams the caller holds a right on; the figures of those they may read."""
        prefix, who = call.query.get("q", ""), call.principal
        visible = self._streams.visible_to(who)
        partitions = [
            p for info in visible if info.name.startswith(prefix) for p in info.partitions
        ]
        page, pages, shown = _paged(partitions, call.query)
        access = self._streams.access
        rows = [
            await self._extent(call, p)
            if access.allows(who, Right.READ, p.stream)
            else {"partition": p, "readable": False}
            for p in shown
        ]
        readable = [
            info.name
            for info in visible
            if info.name.startswith(prefix) and access.allows(who, Right.READ, info.name)
        ]
        return self._page(
            call.session,
            "streams.html",
            rows=rows,
            typed=self._typed(readable),
            page=page,
            pages=pages,
            total=len(partitions),
            streams=len(visible),
            q=prefix,
            notice=await self._notice(call),
            principal=call.principal,
        )

    def _typed(self, streams: list[str]) -> list[dict[str, Any]]:
        """The event types of ``streams`` that have a schema: its newest version, the
        top-level properties and the schema itself."""
        if self._schemas is None:
            return []
        return [
            {
                "stream": name,
                "type": typed.subject[len(name) + 1 :],
                "version": typed.version,
                "id": typed.schema_id,
                "properties": top_properties(typed.document),
                "schema": json.dumps(typed.document, indent=2, ensure_ascii=False),
            }
            for name in streams
            for typed in self._schemas.typed(name)
        ]

    async def _partition_page(self, call: _Call) -> ConsoleResponse:
        partition = self._partition(call, call.query)
        row = await self._extent(call, partition)
        events, who = self._log(partition), call.principal
        oldest = await events.read_after(who, max(row["oldest"] - 1, 0), 1)
        newest = await events.read_after(who, max(row["head"] - 1, 0), 1)
        big = self._chart(partition, 720, 180)
        return self._page(
            call.session,
            "partition.html",
            row=row,
            oldest_ts=oldest[0].ts if oldest else None,
            newest_ts=newest[0].ts if newest else None,
            big=big,
            interval=self.samples.interval,
            principal=call.principal,
        )

    # -- overview -------------------------------------------------------------------------

    async def _overview_page(self, call: _Call) -> ConsoleResponse:
        """Version, build, uptime, workers and doors; events and bytes per second of the
        streams the caller may read (connections per door are shown to admins only: they
        tell of others' activity)."""
        who, access = call.principal, self._streams.access
        partitions = [
            p
            for info in self._streams
            if access.allows(who, Right.READ, info.name)
            for p in info.partitions
        ]
        rates = [self.samples.rate(p) for p in partitions]
        byte_rates = [self.samples.bytes_rate(p) for p in partitions]
        events_hour, bytes_hour = self.samples.total_rates(partitions)
        kib_hour = [(at, rate / 1024) for at, rate in bytes_hour]  # its axis fits KiB/s
        now, shortest = time.time(), 30 * self.samples.interval
        facts = self.facts
        return self._page(
            call.session,
            "overview.html",
            about=self.about,
            workers=facts.workers() if facts is not None else None,
            doors=facts.doors() if facts is not None else [],
            events_rate=_total(rates),
            bytes_rate=_total(byte_rates),
            events_chart=chart(events_hour, 720, 120, now, shortest, HISTORY_SECONDS),
            bytes_chart=chart(kib_hour, 720, 120, now, shortest, HISTORY_SECONDS, "KiB/s"),
            partitions=len(partitions),
            streams=len({p.stream for p in partitions}),
            interval=self.samples.interval,
            principal=who,
        )

    # -- managing streams -----------------------------------------------------------------

    def _stream_info(self, call: _Call, name: str) -> StreamInfo:
        """The stream ``name`` when the caller holds some right on it (404 otherwise, the
        same whether it exists or not)."""
        info = self._streams.get(name) if self._streams.holds_any(call.principal, name) else None
        if info is None:
            raise Refused(404, f"No such stream: {name[:60]}.")
        return info

    async def _stream_page(self, call: _Call) -> ConsoleResponse:
        info = self._stream_info(call, call.query.get("name", ""))
        who, access = call.principal, self._streams.access
        readable = access.allows(who, Right.READ, info.name)
        rows = [await self._extent(call, p) for p in info.partitions] if readable else []
        return self._page(
            call.session,
            "stream.html",
            info=info,
            rows=rows,
            readable=readable,
            total_bytes=_total([r["bytes"] for r in rows]),
            manages=access.allows(who, Right.MANAGE, info.name),
            notice=await self._notice(call),
            principal=who,
        )

    async def _add_stream(self, call: _Call) -> ConsoleResponse:
        name = call.form.get("name", "").strip()
        count = _partitions_in(call.form)
        try:
            info = await self._streams.add(call.principal, name, count)
        except KeyError:
            raise Refused(409, f"The stream {name} exists already.") from None
        except ValueError as exc:
            raise Refused(400, _said(exc)) from None
        return await self._stream_done(call, info.name, f"Added {info.name}: {count} partitions.")

    async def _grow_stream(self, call: _Call) -> ConsoleResponse:
        info = self._stream_info(call, call.form.get("name", ""))
        count = _partitions_in(call.form)
        try:
            grown = await self._streams.grow(call.principal, info.name, count)
        except KeyError:
            raise Refused(404, f"No such stream: {info.name}.") from None
        except ValueError as exc:
            raise Refused(400, _said(exc)) from None
        notice = f"{grown.name} has {len(grown.partitions)} partitions now."
        return await self._stream_done(call, grown.name, notice)

    async def _drop_stream(self, call: _Call) -> ConsoleResponse:
        info = self._stream_info(call, call.form.get("name", ""))
        if call.form.get("confirm", "") != info.name:
            raise Refused(400, f"Type the stream's name, {info.name}, to drop it.")
        try:
            dropped = await self._streams.drop(call.principal, info.name)
        except ValueError as exc:
            raise Refused(400, _said(exc)) from None
        if not dropped:
            raise Refused(404, f"No such stream: {info.name}.")
        return await self._noticed(call, f"Dropped {info.name} and its events.", "/streams")

    async def _stream_done(self, call: _Call, name: str, notice: str) -> ConsoleResponse:
        """After a change: the stream's page, saying what was done."""
        return await self._noticed(call, notice, f"/stream?name={quote(name, safe='')}")

    async def _noticed(self, call: _Call, notice: str, page: str) -> ConsoleResponse:
        """After an action: to ``page`` (under the console's base), saying what was done."""
        assert call.session is not None
        await self.sessions.set_notice(call.session, notice)
        return _redirect(f"{self.base}{page}")

    async def _notice(self, call: _Call) -> str | None:
        return await self.sessions.take_notice(call.session) if call.session else None

    # -- publishing -----------------------------------------------------------------------

    async def _publish_page(self, call: _Call) -> ConsoleResponse:
        query = call.query
        return self._publish_form(
            call, 200, query.get("stream"), query.get("partition", "0"), {}, None
        )

    def _publish_form(
        self,
        call: _Call,
        status: int,
        stream: str | None,
        partition: str,
        values: Mapping[str, str],
        message: str | None,
    ) -> ConsoleResponse:
        """The publish form (``values``: as it was filled in), over the streams the caller
        may write to."""
        who, access = call.principal, self._streams.access
        writable = [
            info.name for info in self._streams if access.allows(who, Right.WRITE, info.name)
        ]
        return self._page(
            call.session,
            "publish.html",
            status=status,
            writable=writable,
            stream=stream or (writable[0] if writable else ""),
            partition=partition,
            typed=self._typed(writable),
            values=values,
            message=message,
            principal=who,
        )

    async def _publish(self, call: _Call) -> ConsoleResponse:
        """One event, as FTN18's addEvent adds it (its type's schema, the key's dedup)."""
        form = call.form
        event_type = form.get("type", "").strip()
        key = form.get("key", "").strip() or None
        try:
            data = json.loads(form.get("data", "") or "null")
        except ValueError as exc:
            return await self._publish_refused(call, f"The data is not JSON: {exc}.")
        partition = self._partition(call, form, Right.WRITE)
        try:
            event_id = await self._log(partition).append(call.principal, event_type, data, key)
        except (EventRejected, NotWritable) as exc:
            return await self._publish_refused(call, _said(exc))
        assert call.session is not None
        await self.sessions.set_notice(call.session, f"Published event {event_id} to {partition}.")
        where = f"stream={quote(partition.stream, safe='')}&partition={partition.number}"
        return _redirect(f"{self.base}/event?{where}&id={event_id}")

    async def _publish_refused(self, call: _Call, message: str) -> ConsoleResponse:
        """The publish form again, as it was filled in, with why it was refused."""
        form = call.form
        return self._publish_form(
            call, 400, form.get("stream"), form.get("partition", "0"), form, message
        )

    # -- users (admins only) ----------------------------------------------------------------

    def _user_admin(self) -> UserAdmin:
        if self.users is None:
            raise Refused(404, "Users are not managed in this console.")
        return self.users

    async def _users_page(
        self, call: _Call, added: tuple[str, str] | None = None
    ) -> ConsoleResponse:
        """The users, then the SAS policies; ``added``: a policy just added and its key,
        shown in this answer only (never kept)."""
        admin = self._user_admin()
        users = await admin.users(call.principal)
        grants = await self._grants_by_user(call, [u.name for u in users])
        rows = [
            {"user": u, "policy": is_policy(u), "grants": grants.get(u.name, [])} for u in users
        ]
        return self._page(
            call.session,
            "users.html",
            rows=rows,
            policies=await admin.policies(call.principal),
            sas=admin.sas_secret is not None,
            added=added,
            notice=await self._notice(call),
            principal=call.principal,
        )

    async def _add_policy(self, call: _Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "").strip()
        claims = ",".join(c for c in ("Send", "Listen", "Manage") if form.get(c.lower()) == "1")
        if not claims:
            raise Refused(400, "Tick at least one claim.")
        try:
            key = await admin.add_policy(
                call.principal, name, form.get("pattern", "").strip(), claims
            )
        except (ValueError, BadGrant) as exc:
            raise Refused(400, _said(exc)) from None
        except KeyError:
            raise Refused(409, f"A user or policy named {name} exists already.") from None
        return await self._users_page(call, (name, key))

    async def _remove_policy(self, call: _Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "")
        if not await admin.remove_policy(call.principal, name):
            raise Refused(404, f"No such SAS policy: {name[:64]}.")
        notice = f"Removed SAS policy {name}: its key no longer works."
        return await self._noticed(call, notice, "/users")

    async def _grants_by_user(self, call: _Call, names: list[str]) -> dict[str, list[str]]:
        admin = self._user_admin()
        shown: dict[str, list[str]] = {}
        for name in names[: PAGE_SIZE * 4]:
            with contextlib.suppress(UnknownUser):  # removed meanwhile
                described = await admin.describe(call.principal, name)
                shown[name] = [
                    f"{','.join(g['rights'])} on {g['pattern']}" for g in described["grants"]
                ]
        return shown

    async def _user_page(self, call: _Call) -> ConsoleResponse:
        admin, who = self._user_admin(), call.principal
        name = call.query.get("name", "")
        try:
            described = await admin.describe(who, name)
            user = await admin.principal(who, name)
        except UnknownUser:
            raise Refused(404, f"No such user: {name[:64]}.") from None
        access = self._streams.access
        may = [
            {
                "stream": info.name,
                "rights": [
                    label for right, label in _RIGHT_LABELS if access.allows(user, right, info.name)
                ],
            }
            for info in sorted(self._streams, key=lambda info: info.name)
        ]
        return self._page(
            call.session,
            "user.html",
            user=described,
            may=[m for m in may if m["rights"]],
            notice=await self._notice(call),
            principal=who,
        )

    async def _add_user(self, call: _Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name, password = form.get("name", "").strip(), form.get("password", "")
        if not password:
            raise Refused(400, "Give the new user a password.")
        try:
            await admin.add(
                call.principal,
                name,
                await asyncio.to_thread(hash_password, password),
                is_admin=form.get("admin") == "1",
            )
        except ValueError as exc:
            raise Refused(400, _said(exc)) from None
        except KeyError:
            raise Refused(409, f"The user {name} exists already.") from None
        return await self._user_done(call, name, f"Added user {name}.")

    async def _remove_user(self, call: _Call) -> ConsoleResponse:
        admin, form = self._user_admin(), call.form
        name = form.get("name", "")
        if form.get("confirm", "") != name:
            raise Refused(400, f"Type the user's name, {name[:64]}, to remove them.")
        try:
            removed = await admin.remove(call.principal, name)
        except ValueError as exc:
            raise Refused(400, _said(exc)) from None
        if not removed:
            raise Refused(404, f"No such user: {name[:64]}.")
        return await self._noticed(call, f"Removed user {name} and their consumers.", "/users")

    async def _change_grant(self, call: _Call) -> ConsoleResponse:
        """A grant (``/users/grant``) or a revoke (``/users/revoke``) of the rights ticked
        (``read``, ``write``, ``manage``) on a pattern."""
        admin, form = self._user_admin(), call.form
        name, pattern = form.get("name", ""), form.get("pattern", "").strip()
        rights = ",".join(r for r in ("read", "write", "manage") if form.get(r) == "1")
        if not rights:
            raise Refused(400, "Tick at least one right.")
        granting = call.path == "/users/grant"
        try:
            if granting:
                await admin.grant(call.principal, name, rights, pattern)
                notice = f"Granted {rights} on {pattern} to {name}."
            elif await admin.revoke(call.principal, name, rights, pattern):
                notice = f"Revoked {rights} on {pattern} from {name}."
            else:
                notice = f"{name} held none of {rights} on {pattern}: nothing revoked."
        except UnknownUser:
            raise Refused(404, f"No such user: {name[:64]}.") from None
        except BadGrant as exc:
            raise Refused(400, _said(exc)) from None
        return await self._user_done(call, name, notice)

    async def _user_done(self, call: _Call, name: str, notice: str) -> ConsoleResponse:
        return await self._noticed(call, notice, f"/user?name={quote(name, safe='')}")

    # -- connections ----------------------------------------------------------------------

    async def _connections_page(self, call: _Call) -> ConsoleResponse:
        """The open connections of this process: every one for an admin (who may close
        one), the caller's own for anyone else."""
        who, facts = call.principal, self.facts
        listed = self.connections.visible_to(who) if self.connections is not None else []
        now = time.time()
        return self._page(
            call.session,
            "connections.html",
            rows=[
                {
                    "connection": c,
                    "calls": c.calls,
                    "at": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(c.since)),
                    "age": uptime(now - c.since),
                }
                for c in listed
            ],
            workers=facts.workers() if facts is not None else None,
            notice=await self._notice(call),
            principal=who,
        )

    async def _close_connection(self, call: _Call) -> ConsoleResponse:
        key = call.form.get("id", "")
        connections = self.connections
        closed = connections.close(call.principal, key) if connections is not None else None
        if closed is None:
            raise Refused(404, "No such connection here: it has closed, or another worker has it.")
        notice = f"Closed the {closed.door} connection of {closed.user} from {closed.peer}."
        return await self._noticed(call, notice, "/connections")

    # -- an event -------------------------------------------------------------------------

    async def _event_page(self, call: _Call) -> ConsoleResponse:
        partition = self._partition(call, call.query)
        wanted = _number_in(call.query.get("id", ""), 18)
        if wanted is None or wanted == 0:
            raise Refused(400, "An event id is a positive number.")
        rows = await self._log(partition).read_after(call.principal, wanted - 1, 1)
        if not rows or rows[0].id != wanted:
            raise Refused(404, f"No event {wanted} in {partition} (never added, or discarded).")
        event = rows[0]
        try:
            pretty = json.dumps(json.loads(event.data_json), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = event.data_json
        return self._page(
            call.session,
            "event.html",
            partition=partition,
            event=event,
            pretty=pretty,
            size=len(event.data_json.encode()),
            notice=await self._notice(call),
            principal=call.principal,
        )

    # -- consumers ------------------------------------------------------------------------

    async def _consumers_page(self, call: _Call) -> ConsoleResponse:
        principal = call.principal
        counts = await self._logs.consumer_counts(principal)
        wanted = call.query.get("stream", "")
        partitions = [
            p
            for info in self._streams
            if not wanted or info.name == wanted
            for p in info.partitions
            if counts.get(p.key)
        ]
        total = sum(counts[p.key] for p in partitions)
        page, pages = _page_of(call.query, total)
        start = (page - 1) * PAGE_SIZE
        rows: list[dict[str, Any]] = []
        offset = 0
        for partition in partitions:
            count = counts[partition.key]
            if offset + count > start and len(rows) < PAGE_SIZE:
                skip = max(start - offset, 0)
                consumers = self._log(partition).consumers
                listed = await consumers.first(principal, skip + PAGE_SIZE - len(rows))
                rows += await self._consumer_rows(
                    call, partition, listed[skip:], PAGE_SIZE - len(rows)
                )
            offset += count
        return self._page(
            call.session,
            "consumers.html",
            rows=rows,
            page=page,
            pages=pages,
            total=total,
            stream=wanted,
            notice=await self.sessions.take_notice(call.session) if call.session else None,
            principal=principal,
        )

    async def _consumer_rows(
        self, call: _Call, partition: Partition, listed: list[ConsumerRow], limit: int
    ) -> list[dict[str, Any]]:
        lowest = await self._log(partition).consumers.lowest(call.principal)
        pushing = {s.key: s for s in self._push.all_streams if s.reliable}
        elsewhere = self._push.pushing_elsewhere()
        now = time.time()
        return [
            {
                "partition": partition,
                "row": row,
                "age": _age(row.oldest_unread_ts, now),
                "push": pushing.get((partition.key, row.user_id, row.component)),
                "elsewhere": (partition.key, row.user_id, row.component) in elsewhere,
                "holds_back": lowest is not None
                and (lowest[1], lowest[2]) == (row.user_id, row.component),
            }
            for row in listed[:limit]
        ]

    async def _consumer_page(self, call: _Call) -> ConsoleResponse:
        """A consumer's figures and its lag over the last hour (own, or managed)."""
        partition, row = await self._consumer(call, call.query)
        lags = self.samples.lags((partition, row.user_id, row.component))
        shortest = 30 * self.samples.interval
        return self._page(
            call.session,
            "consumer.html",
            partition=partition,
            row=row,
            age=_age(row.oldest_unread_ts, time.time()),
            lag=chart(lags, 720, 180, time.time(), shortest, LAG_WINDOW_SECONDS, "events behind"),
            interval=self.samples.interval,
            principal=call.principal,
        )

    async def _confirm_page(self, call: _Call) -> ConsoleResponse:
        action = call.query.get("action", "")
        if action not in ("drop", "seek"):
            raise Refused(400, "The action is drop or seek.")
        partition, row = await self._consumer(call, call.query)
        return self._page(
            call.session,
            "confirm.html",
            action=action,
            partition=partition,
            row=row,
            principal=call.principal,
        )

    def _acted_on(self, call: _Call, fields: Mapping[str, str]) -> tuple[Partition, str, str]:
        """The partition, user and component of the consumer a request names, once the
        caller may act on that user's consumers there: read for their own, manage for
        another's (refused the same whether that consumer exists or not)."""
        partition = self._partition(call, fields)
        user, component = fields.get("user", ""), fields.get("component", "")
        who = call.principal
        if user != who.name and not self._streams.access.allows(
            who, Right.MANAGE, partition.stream
        ):
            raise AccessDenied(Right.MANAGE, partition.stream)
        return partition, user, component

    async def _consumer(
        self, call: _Call, fields: Mapping[str, str]
    ) -> tuple[Partition, ConsumerRow]:
        """The consumer a request names, when the caller may act on it."""
        partition, user, component = self._acted_on(call, fields)
        row = await self._log(partition).consumers.find(call.principal, user, component)
        if row is None:
            raise Refused(404, "No such consumer.")
        return partition, row

    async def _drop(self, call: _Call) -> ConsoleResponse:
        partition, user, component = self._acted_on(call, call.form)
        consumers = self._log(partition).consumers
        if not await consumers.drop(
            call.principal, user, component, reason="dropped in the console"
        ):
            raise Refused(404, "No such consumer.")
        return await self._noticed(
            call, f"Dropped {user}/{component} of {partition}.", "/consumers"
        )

    async def _seek(self, call: _Call) -> ConsoleResponse:
        partition, row = await self._consumer(call, call.form)
        events, who = self._log(partition), call.principal
        at = call.form.get("time", "").strip()
        given = call.form.get("position", "").strip()
        if at:
            ts = _iso_time(at)
            position = await events.id_before(who, ts) or 0
        elif (wanted := _number_in(given, 18)) is not None:
            position = wanted
        else:
            raise Refused(400, "Give a position (an event id) or a time (UTC).")
        try:
            sought = await events.consumers.seek(who, row.user_id, row.component, position)
        except AccessRefused as exc:  # the one seek refuses: a position past the head
            raise Refused(400, _sentence(exc)) from None
        if not sought:
            raise Refused(404, "No such consumer.")
        notice = f"{row.user}/{row.component} of {partition} is at {position} now."
        return await self._noticed(call, notice, "/consumers")

    # -- events ---------------------------------------------------------------------------

    async def _events_page(self, call: _Call) -> ConsoleResponse:
        query = call.query
        partition = self._partition(call, query)
        events, who = self._log(partition), call.principal
        after, message = 0, ""
        from_id, at = query.get("id", "").strip(), query.get("time", "").strip()
        if at:
            try:
                after = await events.id_before(who, _iso_time(at)) or 0
            except Refused as exc:
                message = exc.message
        elif from_id:
            first = _number_in(from_id, 18)
            if first is None:
                message = "An event id is a positive number."
            else:
                after = max(first - 1, 0)
        until, last_ts = query.get("to", "").strip(), None
        if until and not message:
            try:
                last_ts = _iso_time(until)
            except Refused as exc:
                message = exc.message
            if last_ts is not None and at and _iso_time(at) > last_ts:
                message = "The time range ends before it starts."
        types = _words(query.get("type", ""))
        rows: list[StoredEvent] = []
        if types and not message:  # the store reads those types only
            events.guard.read(who)
            rows, _ = await events.read_of_types(after, EVENTS_PER_PAGE, types)
        elif not message:
            rows = await events.read_after(who, after, EVENTS_PER_PAGE)
        full = len(rows) == EVENTS_PER_PAGE
        if last_ts is not None:  # stored times are in id order, to the second
            within = [r for r in rows if r.ts <= last_ts]
            full = full and len(within) == len(rows)
            rows = within
        shown = [
            {"id": r.id, "type": r.type, "data": _shorten(r.data_json), "ts": r.ts} for r in rows
        ]
        return self._page(
            call.session,
            "events.html",
            partition=partition,
            events=shown,
            id=from_id,
            time=at,
            to=until,
            type=query.get("type", ""),
            message=message,
            next_id=rows[-1].id + 1 if full and rows else None,
            principal=call.principal,
        )

    async def _dcb_page(self, call: _Call) -> ConsoleResponse:
        query = call.query
        partition = self._partition(call, query)
        types = _words(query.get("types", ""))
        tags = _words(query.get("tags", ""))
        after_text = query.get("after", "").strip()
        backwards = query.get("backwards") == "1"
        events: list[dict[str, Any]] = []
        message, head = "", None
        if query.get("run"):
            try:
                items = [{"types": types, "tags": tags}] if types or tags else []
                after = _number_in(after_text, 18)
                if after_text and after is None:
                    raise DcbInputError("after", "a position is a number")
                read = await DcbService(self._log(partition)).read(
                    call.principal,
                    ReadRequest(
                        parse_query({"items": items}),
                        after=after,
                        limit=EVENTS_PER_PAGE,
                        backwards=backwards,
                    ),
                )
                head = read.head
                async for page in read.pages():
                    events += [
                        {
                            "position": e.position,
                            "type": e.type,
                            "tags": ", ".join(e.tags),
                            "data": _shorten(e.data_json),
                            "ts": e.ts,
                        }
                        for e in page
                    ]
            except DcbInputError as exc:
                message = f"{exc.field}: {exc.message}."
        return self._page(
            call.session,
            "dcb.html",
            partition=partition,
            types=query.get("types", ""),
            tags=query.get("tags", ""),
            after=after_text,
            backwards=backwards,
            events=events,
            head=head,
            message=message,
            ran=bool(query.get("run")),
            principal=call.principal,
        )

    # -- live tail ------------------------------------------------------------------------

    def _tail_spec(self, call: _Call) -> tuple[Partition, str, Transformation | None, str]:
        """The partition, selector text, transformation, and what is wrong with them."""
        query = call.query
        partition = self._partition(call, query)
        selector = query.get("selector", "").strip()
        names = _words(query.get("attributes", ""))
        try:
            if selector:
                compile_selector(selector)
            shape = Transformation.parse({"requestedAttributes": names}) if names else None
        except NotifyError as exc:
            return partition, selector, None, str(exc)
        return partition, selector, shape, ""

    async def _tail_page(self, call: _Call) -> ConsoleResponse:
        partition, selector, _shape, message = self._tail_spec(call)
        live = bool(call.query.get("run")) and not message
        source = ""
        if live:
            source = f"{self.base}/tail/stream?" + "&".join(
                f"{k}={quote(call.query.get(k, ''), safe='')}"
                for k in ("stream", "partition", "selector", "attributes")
            )
        return self._page(
            call.session,
            "tail.html",
            partition=partition,
            selector=selector,
            attributes=call.query.get("attributes", ""),
            message=message,
            source=source,
            rows=self.config.tail_rows,
            principal=call.principal,
        )

    async def _tail_stream(self, call: _Call) -> ConsoleResponse:
        session = call.session
        assert session is not None
        partition, selector, shape, message = self._tail_spec(call)
        if message:
            raise Refused(400, message)
        if self.tails >= self.config.max_tails:
            raise Refused(503, "Too many live tails are open: close one.")
        if self.sessions.tails_open(session) >= self.config.tails_per_session:
            raise Refused(429, "This session has too many live tails open: close one.")
        try:
            live = self._live.of_stream(partition.stream)[partition.number]
        except (UnknownStream, IndexError):
            raise Refused(404, f"No such stream and partition: {partition}.") from None
        who, access = session.principal, self._streams.access
        own = management_visible_to(who)

        def visible(notice: Notification) -> bool:
            return own(notice) and (
                notice.stream is None or access.allows(who, Right.READ, notice.stream)
            )

        subscription = Subscription(
            live,
            self._notices,
            compile_selector(selector) if selector else None,
            live.events.head,
            management=visible,
        ).start()
        revoked = asyncio.Event()
        stop_watching = access.watch(who, Right.READ, partition.stream, revoked.set)
        self.tails += 1
        tails = self.sessions.tail_opened(session)

        def ended() -> None:
            stop_watching()
            subscription.close()
            self.tails -= 1
            self.sessions.tail_closed(session)

        return ConsoleResponse(
            200,
            content_type="text/event-stream; charset=utf-8",
            headers=[("Cache-Control", "no-store"), *SECURITY_HEADERS],
            stream=_pushed(
                subscription,
                shape,
                tails,
                self.closing,
                ended,
                revoked,
                _sentence(AccessDenied(Right.READ, partition.stream)),
            ),
        )


async def _pushed(
    subscription: Subscription,
    shape: Transformation | None,
    tails: Tails,
    closing: asyncio.Event,
    ended: Callable[[], None],
    revoked: asyncio.Event,
    refusal: str,
) -> AsyncGenerator[bytes, None]:
    """Server-Sent Events: one ``data:`` line per batch (a JSON array), comments to keep
    the connection alive; ends with the server, or after :data:`TAIL_SECONDS`, or with an
    ``ended`` event carrying why: once the session ends (anywhere), once ``revoked`` is set
    (``refusal``), or once the stream is dropped."""
    deadline = time.monotonic() + TAIL_SECONDS
    stop: asyncio.Future[Any] = asyncio.ensure_future(closing.wait())
    taken: asyncio.Future[Any] = asyncio.ensure_future(revoked.wait())
    gone: asyncio.Future[Any] = asyncio.ensure_future(tails.ended.wait())
    reading: asyncio.Future[Any] | None = None
    try:
        yield b"retry: 3000\n\n"
        while not closing.is_set() and time.monotonic() < deadline:
            why = SESSION_ENDED if tails.ended.is_set() else refusal if revoked.is_set() else None
            if why is not None:
                yield f"event: ended\ndata: {json.dumps(why)}\n\n".encode()
                return
            if reading is None:
                reading = asyncio.ensure_future(subscription.next(TAIL_BATCH))
            await asyncio.wait(
                (reading, stop, taken, gone),
                timeout=TAIL_HEARTBEAT_SECONDS,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if revoked.is_set() or tails.ended.is_set():
                continue  # what was read after the end is not sent
            if not reading.done():
                yield b": alive\n\n"
                continue
            failed = reading.exception()
            if isinstance(failed, UnknownStream | DamagedEvent):  # dropped; a damaged event
                yield f"event: ended\ndata: {json.dumps(_sentence(failed))}\n\n".encode()
                return
            batch, reading = reading.result(), None
            messages = [
                {"id": n.id, "type": n.type, "ts": n.ts, "message": real_message(n, shape)}
                for n in batch
            ]
            yield f"data: {json.dumps(messages, separators=(',', ':'))}\n\n".encode()
    finally:
        for waiting in (stop, taken, gone):
            waiting.cancel()
        if reading is not None:
            reading.cancel()
        ended()


def _sentence(exc: AccessRefused | UnknownStream | DamagedEvent) -> str:
    """A refusal of ``log/`` as the console says it (``The read right on stream payroll is
    needed.``)."""
    return _said(exc)


def _total(values: list[float | None]) -> float | None:
    """The sum of the values known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _kept_bytes(oldest: int, head: int, event_size: float | None) -> float | None:
    """The bytes of a partition's events kept, estimated from its mean event size."""
    if event_size is None:
        return None if head else 0.0
    return (head - oldest + 1) * event_size if oldest else 0.0


def _partitions_in(form: Mapping[str, str]) -> int:
    count = _number_in(form.get("partitions", "").strip(), 6)
    if count is None:
        raise Refused(400, "The number of partitions is a whole number, 1 or more.")
    return count


def _said(exc: Exception) -> str:
    """A refusal's text as one sentence: capitalised, with its full stop."""
    text = str(exc)
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _heading(status: int) -> str:
    """The error page's heading: what went wrong in a few words."""
    fallback = "Cannot do that" if status < 500 else "The server failed"
    return _HEADINGS.get(status, fallback)


def _redirect(location: str, headers: list[tuple[str, str]] | None = None) -> ConsoleResponse:
    return ConsoleResponse(
        303, b"", "text/plain; charset=utf-8", [("Location", location), *(headers or [])]
    )


def _static(name: str) -> ConsoleResponse:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or suffix not in STATIC_TYPES:
        raise Refused(404, "No such file.")
    try:
        body = resources.files("futoin_evt.console").joinpath("static", name).read_bytes()
    except (FileNotFoundError, OSError):
        raise Refused(404, "No such file.") from None
    headers = [("Cache-Control", "max-age=300"), *SECURITY_HEADERS]
    return ConsoleResponse(200, body, STATIC_TYPES[suffix], headers)


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


def _paged(items: list[Any], query: Mapping[str, str]) -> tuple[int, int, list[Any]]:
    page, pages = _page_of(query, len(items))
    return page, pages, items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]


def _page_of(query: Mapping[str, str], total: int) -> tuple[int, int]:
    """The page asked for (1 when it is not a number), within 1..pages."""
    pages = max(math.ceil(total / PAGE_SIZE), 1)
    text = query.get("page", "1")
    page = _number_in(text, 6) or 1
    return min(max(page, 1), pages), pages


def _number_in(text: str, digits: int) -> int | None:
    """``text`` as a number of at most ``digits`` ASCII digits, else None."""
    return int(text) if re.fullmatch(f"[0-9]{{1,{digits}}}", text) else None


def _iso_time(text: str) -> str:
    """``YYYY-MM-DDTHH:MM[:SS][Z]`` (UTC) as the store writes times."""
    match = _ISO_TIME.fullmatch(text.strip())
    if match is None:
        raise Refused(400, "A time is YYYY-MM-DDTHH:MM:SS in UTC.")
    day, minutes, seconds = match.groups()
    return f"{day}T{minutes}{seconds or ':00'}Z"


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _shorten(text: str) -> str:
    return text if len(text) <= DATA_CHARS else text[:DATA_CHARS] + "…"


def _age(ts: str | None, now: float) -> float | None:
    if ts is None:
        return None
    return max(now - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")), 0.0)


def _number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"
