"""The web console: pages rendered here from Jinja2 templates, no wire in it.

:class:`Console` answers one :class:`ConsoleRequest` with one :class:`ConsoleResponse` (the
server's HTTP endpoint carries them). Every page but the login page needs a session; every
POST needs the session's CSRF token and, when the browser sends an ``Origin``, the console's
own. Per-partition data is read through the event logs (``log/``) of the partitions the
registry knows, as the user of the session, so a stream added by any process shows as soon as
the registry has it.

A user sees what their rights on streams allow, as at every door: the streams they hold a
right on (heads, rates and charts of those they may read), the events, DCB queries and live
tails of streams they may read, their own consumers there and, on streams they manage,
everyone's. Dropping or seeking a consumer needs read (their own) or manage (another's). A
refusal is the error page with status 403 and the sentence naming the right and the stream,
the same for a name that names no stream (unless the user holds some right on that name,
who gets 404). A live tail ends when the right it needs is revoked, when its stream is
dropped, and with its session.

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

from ..auth.users import Authenticator
from ..dcb.model import DcbInputError, parse_query
from ..dcb.service import DcbService, ReadRequest
from ..domain.management import ManagementBus
from ..domain.notification import Notification
from ..domain.partition import DEFAULT_PARTITION, Partition, check_stream_name
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.schemas import top_properties
from ..domain.sessions import ConsoleSessionStore, SessionLimits
from ..ftn3.errors import FTN3Error
from ..ftn18.push import PushService
from ..log.access import AccessDenied
from ..log.access import Refused as AccessRefused
from ..log.consumers import ConsumerRow
from ..log.eventlog import DamagedEvent, EventLog
from ..log.schemas import SchemaRegistry
from ..log.streams import StreamLogs, StreamRegistry
from ..notify.live import LiveStreams, Subscription, UnknownStream, management_visible_to
from ..notify.message import NotifyError, Transformation, real_message
from ..notify.selector import compile_selector
from ..stats import INSECURE_CHANNEL
from .config import ConsoleConfig
from .samples import Chart, HeadSamples, chart
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
#: A form's body larger than this is refused.
MAX_FORM_BYTES: Final = 16384
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
    "streams.html": "streams",
    "partition.html": "streams",
    "consumers.html": "consumers",
    "confirm.html": "consumers",
    "tail.html": "tail",
    "events.html": "events",
    "dcb.html": "dcb",
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
        self._pages: dict[tuple[str, str], Handler] = {
            ("GET", "/login"): self._login_page,
            ("POST", "/login"): self._login,
            ("POST", "/logout"): self._logout,
            ("GET", "/streams"): self._streams_page,
            ("GET", "/partition"): self._partition_page,
            ("GET", "/consumers"): self._consumers_page,
            ("GET", "/consumers/confirm"): self._confirm_page,
            ("POST", "/consumers/drop"): self._drop,
            ("POST", "/consumers/seek"): self._seek,
            ("GET", "/tail"): self._tail_page,
            ("GET", "/tail/stream"): self._tail_stream,
            ("GET", "/events"): self._events_page,
            ("GET", "/dcb"): self._dcb_page,
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
        """A POST's fields, once its origin and (past the login) its CSRF token are right."""
        origin = request.headers.get("origin")
        host = request.headers.get("host")
        if origin is not None and origin != "null" and urlsplit(origin).netloc != host:
            raise Refused(403, "The form was sent from another site.")
        if len(request.body) > MAX_FORM_BYTES:
            raise Refused(413, "The form is too large.")
        try:
            text = request.body.decode()
        except UnicodeDecodeError:
            raise Refused(400, "The form is not UTF-8.") from None
        form = {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
        if path != "/login" and (session is None or not session.csrf_matches(form.get("csrf"))):
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
        return self._page(None, "login.html", next=call.query.get("next", ""))

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
            return self._page(
                None,
                "login.html",
                status=401,
                next=nxt,
                user=name,
                message="Wrong user name or password.",
            )
        await self.sessions.end(call.token)
        token = await self.sessions.create(principal)
        secure = "; Secure" if request.tls else ""
        cookie = f"{COOKIE}={token}; Path={self.base}; HttpOnly; SameSite=Strict{secure}"
        return _redirect(self._next(nxt), [("Set-Cookie", cookie)])

    async def _logout(self, call: _Call) -> ConsoleResponse:
        await self.sessions.end(call.token)
        secure = "; Secure" if call.request.tls else ""
        cookie = f"{COOKIE}=; Path={self.base}; HttpOnly; SameSite=Strict; Max-Age=0{secure}"
        return _redirect(f"{self.base}/login", [("Set-Cookie", cookie)])

    def _next(self, target: str | None) -> str:
        """Where to go after the login: a page of the console, nowhere else."""
        if target and target.startswith(self.base + "/") and "//" not in target:
            return target
        return f"{self.base}/streams"

    # -- streams --------------------------------------------------------------------------

    def _partition(self, call: _Call, fields: Mapping[str, str]) -> Partition:
        """The partition ``fields`` name (a stream the caller may read when they name none),
        once the caller may read it: :class:`AccessDenied` when they may not, and for a name
        they hold no right on (whether a stream has it or not)."""
        who = call.principal
        name = fields.get("stream") or self._default_stream(who)
        number = fields.get("partition") or "0"
        index = _number_in(number, 5)
        try:
            check_stream_name(name)
        except ValueError:  # no stream can have it: nothing to hide
            info = None
        else:
            info = self._streams.reachable(who, name, Right.READ)
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
        lowest = await events.consumers.lowest(who) if limits.lowest_position else None
        return {
            "partition": partition,
            "readable": True,
            "head": max(limits.newest_id, events.head),
            "oldest": limits.oldest_id,
            "rate": self.samples.rate(partition),
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
        assert call.session is not None
        await self.sessions.set_notice(call.session, f"Dropped {user}/{component} of {partition}.")
        return _redirect(f"{self.base}/consumers")

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
        if not await events.consumers.seek(who, row.user_id, row.component, position):
            raise Refused(404, "No such consumer.")
        assert call.session is not None
        notice = f"{row.user}/{row.component} of {partition} is at {position} now."
        await self.sessions.set_notice(call.session, notice)
        return _redirect(f"{self.base}/consumers")

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
        rows = [] if message else await events.read_after(who, after, EVENTS_PER_PAGE)
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
            message=message,
            next_id=rows[-1].id + 1 if len(rows) == EVENTS_PER_PAGE else None,
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
    text = str(exc)
    return text[:1].upper() + text[1:] + "."


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
