"""The built-in archiver: a reliable consumer that copies events to an archive SQLite file.

FTN18 treats the archive as one more reliable consumer (2.3.1). The archive file has the same
event shape (id, type, data, ts) and remembers the last archived id in the same transaction
as the events, so after a crash it resumes exactly where it stopped: events the server sends
again are left out, and each event is in the archive once. An archive ahead of the newest id
the database ever gave holds another database's events (or a restored database's lost ones):
archiving stops (logged) and the archive's consumer keeps the events, rather than skip them
as archived, also once the database's ids catch up.

It runs inside the server (``serve --archive PATH``: a consumer ``ARCHIVE`` of the built-in
user ``_archive``, reading the store directly) or as its own process against a remote server
(``futoin-evt archive --out PATH``: a push receiver with the given credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ..client.aio import Event
from ..client.receiver import ReliableReceiver
from ..domain.stream import MAX_EVENTS_PER_CALL, UserId
from ..ftn3.messages import encode_json
from ..storage.base import Store
from ..storage.errors import DamagedEvent
from ..storage.head import HeadWatch
from .consumers import PositionPastHead, check_given

logger = logging.getLogger(__name__)

ARCHIVE_COMPONENT: Final = "ARCHIVE"
#: How often the archiver tries again to read past a damaged event (an operator's repair).
_DAMAGED_RETRY_SECONDS: Final = 10.0
ARCHIVE_USER: Final = "_archive"
#: A stored hash no password matches: the built-in user cannot log in.
NO_LOGIN: Final = "!"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS events ("
    " id INTEGER PRIMARY KEY, type TEXT NOT NULL, data TEXT NOT NULL, ts TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS archive_position (one INTEGER PRIMARY KEY CHECK (one = 1),"
    " last_id INTEGER NOT NULL)",
)


class ArchiveFile:
    """The archive database. Blocking calls: run them in a thread from async code. A new
    file is readable by its owner only (SQLite gives its ``-wal`` and ``-shm`` the same
    mode): it holds every event."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(OSError):  # exists, or cannot be: sqlite3 says it best
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        for statement in _SCHEMA:
            self._conn.execute(statement)

    def last_id(self) -> int:
        row = self._conn.execute("SELECT last_id FROM archive_position").fetchone()
        return int(row[0]) if row else 0

    def append(self, events: Sequence[tuple[int, str, str, str]]) -> int:
        """Store (id, type, data JSON, ts) rows after the last archived id, with the new
        position, in one transaction; returns the position."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            last = self.last_id()
            fresh = [e for e in events if e[0] > last]
            if fresh:
                self._conn.executemany(
                    "INSERT INTO events (id, type, data, ts) VALUES (?, ?, ?, ?)", fresh
                )
                last = fresh[-1][0]
                self._conn.execute(
                    "INSERT INTO archive_position (one, last_id) VALUES (1, ?)"
                    " ON CONFLICT (one) DO UPDATE SET last_id = excluded.last_id",
                    (last,),
                )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return last

    def close(self) -> None:
        self._conn.close()


class InProcessArchiver:
    """Copies the server's own store into an archive file (``serve --archive PATH``)."""

    def __init__(self, store: Store, path: Path) -> None:
        self._store = store
        self._file = ArchiveFile(path)
        self._task: asyncio.Task[None] | None = None
        #: The newest archived id, to wait on.
        self.archived_to = HeadWatch()
        #: Events archived since the start (metrics).
        self.archived_total = 0

    async def start(self) -> None:
        user = await self._store.get_user(ARCHIVE_USER)
        user_id = (
            user.id if user is not None else await self._store.add_user(ARCHIVE_USER, NO_LOGIN)
        )
        await self._store.register_consumer(user_id, ARCHIVE_COMPONENT)
        self._task = asyncio.create_task(self._run(user_id), name="futoin-evt-archiver")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._file.close()

    async def _run(self, user_id: UserId) -> None:
        store = self._store
        archived_to = await asyncio.to_thread(self._file.last_id)
        while True:
            try:
                # The archive is the truth: after a crash it may be ahead of the position,
                # never of the ids given (else it is another database's: nothing is skipped).
                await check_given(store, archived_to, "the archive's last id")
                position = await store.acknowledge(user_id, ARCHIVE_COMPONENT, archived_to)
                if position is None:  # dropped by an operator: come back
                    await store.register_consumer(user_id, ARCHIVE_COMPONENT)
                    continue
                self.archived_to.advance(archived_to)
                after = max(position, archived_to)
                rows = await store.read_rows(after, limit=MAX_EVENTS_PER_CALL)
                if not rows:
                    await store.head.wait_beyond(after)
                    continue
                archived = [row[:4] for row in rows]  # the archive keeps FTN18 events
                archived_to = await asyncio.to_thread(self._file.append, archived)
                self.archived_total += len(archived)
            except asyncio.CancelledError:
                raise
            except DamagedEvent:  # logged once by the store: the archive waits at it
                await asyncio.sleep(_DAMAGED_RETRY_SECONDS)
            except PositionPastHead as exc:  # its ids mean other events: none is skipped
                logger.error(
                    "archiving to %s stopped: %s, so the archive holds another database's"
                    " events; the events stay until it is moved aside and the server restarted",
                    self._file.path, exc,
                )  # fmt: skip
                return
            except Exception:
                logger.exception("archiving failed; trying again")
                await asyncio.sleep(1.0)


class RemoteArchiver:
    """Archives from a remote server as a push receiver (``futoin-evt archive``)."""

    def __init__(self, url: str, credentials: str, out: Path, component: str) -> None:
        self._archive = ArchiveFile(out)
        self.receiver = ReliableReceiver(
            url, credentials=credentials, component=component, on_events=self._store
        )

    async def _store(self, events: list[Event]) -> None:
        rows = [(e.id, e.type, encode_json(e.data), e.ts) for e in events]
        await asyncio.to_thread(self._archive.append, rows)

    async def run(self) -> None:
        """Until :meth:`stop`; events the archive has already are left out."""
        self.receiver.last_id = await asyncio.to_thread(self._archive.last_id)
        try:
            await self.receiver.run()
        finally:
            self._archive.close()

    def stop(self) -> None:
        self.receiver.stop()
