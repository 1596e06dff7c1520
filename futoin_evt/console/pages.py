"""What every group of the console's pages shares: the templates a page is rendered from, the
notice a page shows after an action, the partition a request names (once the caller holds
the right it needs there) and the event types with a schema."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from jinja2 import Environment, PackageLoader, select_autoescape

from ..domain.partition import DEFAULT_PARTITION, Partition, check_stream_name
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.schemas import top_properties
from ..log.eventlog import EventLog
from ..log.schemas import SchemaRegistry
from ..log.streams import StreamLogs, StreamRegistry
from .config import ConsoleConfig
from .exchange import SECURITY_HEADERS, Call, ConsoleResponse, PageError, redirect
from .formatting import number, number_in
from .overview import size
from .sessions import Session, Sessions

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


class Pages:
    """The console's templates, sessions, streams and their logs, as every page group
    reaches them."""

    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        sessions: Sessions,
        config: ConsoleConfig,
        schemas: SchemaRegistry | None,
    ) -> None:
        self.logs = logs
        self.streams = streams
        self.sessions = sessions
        self.config = config
        self.base = config.path.rstrip("/")
        self._schemas = schemas
        self._env = Environment(
            loader=PackageLoader("futoin_evt.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            enable_async=False,
        )
        self._env.filters["number"] = number
        self._env.filters["size"] = size

    def page(
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

    async def noticed(self, call: Call, notice: str, page: str) -> ConsoleResponse:
        """After an action: to ``page`` (under the console's base), saying what was done."""
        assert call.session is not None
        await self.sessions.set_notice(call.session, notice)
        return redirect(f"{self.base}{page}")

    async def notice(self, call: Call) -> str | None:
        return await self.sessions.take_notice(call.session) if call.session else None

    def partition(
        self, call: Call, fields: Mapping[str, str], right: Right = Right.READ
    ) -> Partition:
        """The partition ``fields`` name (a stream the caller may read when they name none),
        once the caller holds ``right`` on it: :class:`AccessDenied` when they may not, and
        for a name they hold no right on (whether a stream has it or not)."""
        who = call.principal
        name = fields.get("stream") or self._default_stream(who)
        number = fields.get("partition") or "0"
        index = number_in(number, 5)
        try:
            check_stream_name(name)
        except ValueError:  # no stream can have it: nothing to hide
            info = None
        else:
            info = self.streams.reachable(who, name, right)
        partition = None
        if info is not None and index is not None:
            partition = self.streams.partition(name, index)
        if partition is None:
            raise PageError(404, f"No such stream and partition: {name[:60]}/{number[:10]}.")
        return partition

    def _default_stream(self, who: Principal) -> str:
        """``events`` when ``who`` may read it, else the first stream they may read."""
        access = self.streams.access
        if access.allows(who, Right.READ, DEFAULT_PARTITION.stream):
            return DEFAULT_PARTITION.stream
        readable = (s.name for s in self.streams if access.allows(who, Right.READ, s.name))
        return next(readable, DEFAULT_PARTITION.stream)

    def log(self, partition: Partition) -> EventLog:
        return self.logs.partition(partition)

    def typed(self, streams: list[str]) -> list[dict[str, Any]]:
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


def _heading(status: int) -> str:
    """The error page's heading: what went wrong in a few words."""
    fallback = "Cannot do that" if status < 500 else "The server failed"
    return _HEADINGS.get(status, fallback)
