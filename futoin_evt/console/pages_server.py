"""The server as a whole: the overview (version, uptime, workers, doors, the events and bytes
per second of the streams a user may read) and the open connections (everyone's to admins,
who may close one, through :class:`~futoin_evt.log.connections.Connections`; anyone else
sees their own)."""

from __future__ import annotations

import time

from ..domain.rights import Right
from ..log.connections import Connections
from .exchange import Call, ConsoleResponse, PageError, Routes
from .formatting import total
from .overview import ServerFacts, about, uptime
from .pages import Pages
from .samples import HISTORY_SECONDS, HeadSamples, chart


class ServerPages:
    def __init__(self, pages: Pages, samples: HeadSamples) -> None:
        self._pages = pages
        self._streams = pages.streams
        self._samples = samples
        self._about = about(time.time())
        #: The server's doors and workers (None: the overview omits them).
        self.facts: ServerFacts | None = None
        #: This process's open connections (None: the page lists none).
        self.connections: Connections | None = None

    def routes(self) -> Routes:
        return {
            ("GET", "/overview"): self._overview_page,
            ("GET", "/connections"): self._connections_page,
            ("POST", "/connections/close"): self._close_connection,
        }

    async def _overview_page(self, call: Call) -> ConsoleResponse:
        """Version, build, uptime, workers and doors; events and bytes per second of the
        streams the caller may read (connections per door are shown to admins only: they
        tell of others' activity)."""
        who, access, samples = call.principal, self._streams.access, self._samples
        partitions = [
            p
            for info in self._streams
            if access.allows(who, Right.READ, info.name)
            for p in info.partitions
        ]
        rates = [samples.rate(p) for p in partitions]
        byte_rates = [samples.bytes_rate(p) for p in partitions]
        events_hour, bytes_hour = samples.total_rates(partitions)
        kib_hour = [(at, rate / 1024) for at, rate in bytes_hour]  # its axis fits KiB/s
        now, shortest = time.time(), 30 * samples.interval
        facts = self.facts
        return self._pages.page(
            call.session,
            "overview.html",
            about=self._about,
            workers=facts.workers() if facts is not None else None,
            doors=facts.doors() if facts is not None else [],
            events_rate=total(rates),
            bytes_rate=total(byte_rates),
            events_chart=chart(events_hour, 720, 120, now, shortest, HISTORY_SECONDS),
            bytes_chart=chart(kib_hour, 720, 120, now, shortest, HISTORY_SECONDS, "KiB/s"),
            partitions=len(partitions),
            streams=len({p.stream for p in partitions}),
            interval=samples.interval,
            principal=who,
        )

    async def _connections_page(self, call: Call) -> ConsoleResponse:
        """The open connections of this process: every one for an admin (who may close
        one), the caller's own for anyone else."""
        who, facts = call.principal, self.facts
        listed = self.connections.visible_to(who) if self.connections is not None else []
        now = time.time()
        return self._pages.page(
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
            notice=await self._pages.notice(call),
            principal=who,
        )

    async def _close_connection(self, call: Call) -> ConsoleResponse:
        key = call.form.get("id", "")
        connections = self.connections
        closed = connections.close(call.principal, key) if connections is not None else None
        if closed is None:
            raise PageError(
                404, "No such connection here: it has closed, or another worker has it."
            )
        notice = f"Closed the {closed.door} connection of {closed.user} from {closed.peer}."
        return await self._pages.noticed(call, notice, "/connections")
