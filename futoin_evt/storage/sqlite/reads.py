"""The SQLite store's reads: its own read-only connection on a thread of its own.

Each read is one job on the thread (:class:`~.thread.WorkerThread`): the statement runs there
and its rows become what the caller gets (an :class:`~.base.EventPage`, typed rows) there too,
so a page costs one hop to the thread and one back, none per row. A page is built from the
rows as they come, 128 at a time: most rows past a full page are never fetched, and the statement is
reset before the job returns, so no read keeps a snapshot open (WAL: a read never waits for
the writer, and sees only committed transactions).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..base import EventPage
from ..errors import StoreClosed
from ..page_rows import page_from_rows
from ..thread import WorkerThread

T = TypeVar("T")

#: Rows fetched at a time for a conversion on the thread.
_CHUNK_ROWS = 128
#: SQLite's busy timeout of the read connection (ms): a read waits out a WAL recovery.
_BUSY_TIMEOUT_MS = 10_000


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only=1")
    except BaseException:
        conn.close()
        raise
    return conn


class SqliteReader:
    """Read-only statements on one connection and thread, in the order they were asked for.
    Create with :meth:`open`; after :meth:`close`, every read fails with :class:`StoreClosed`."""

    def __init__(self, thread: WorkerThread, conn: sqlite3.Connection) -> None:
        self._thread = thread
        self._conn = conn
        self._closed = False

    @classmethod
    async def open(cls, path: Path) -> SqliteReader:
        thread = WorkerThread("futoin-evt-reader")
        try:
            conn = await thread.run(_open, path)
        except BaseException:
            thread.stop()
            raise
        return cls(thread, conn)

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> asyncio.Future[list[Any]]:
        """All rows of ``sql``."""
        return self._run(_fetchall, sql, params)

    def rows(
        self, convert: Callable[[Iterable[Sequence[Any]]], T], sql: str, params: Sequence[Any]
    ) -> asyncio.Future[T]:
        """``convert(rows)``, run on the thread; the rows it leaves unread are not fetched."""
        return self._run(_convert, convert, sql, params)

    def page(
        self, sql: str, params: Sequence[Any], max_bytes: int, data_as_text: bool = False
    ) -> asyncio.Future[EventPage | None]:
        """:func:`~.pages.page_from_rows` of a page statement, built on the thread."""
        return self.rows(lambda rows: page_from_rows(rows, max_bytes, data_as_text), sql, params)

    def _run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        if self._closed:
            future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            future.set_exception(StoreClosed("the event store is closed"))
            return future
        return self._thread.run(fn, self._conn, *args)

    async def close(self) -> None:
        """Refuse new reads, let those asked for finish, then close the connection."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._thread.run(self._conn.close)
        finally:
            self._thread.stop()


def _fetchall(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _convert(
    conn: sqlite3.Connection,
    convert: Callable[[Iterable[Sequence[Any]]], T],
    sql: str,
    params: Sequence[Any],
) -> T:
    cursor = conn.execute(sql, params)
    try:
        # rows by chunks: as cheap as fetchall (a cursor's own iteration costs 10% more),
        # and a page cut short by its size leaves the rest of the rows unfetched
        chunks = iter(functools.partial(cursor.fetchmany, _CHUNK_ROWS), [])
        return convert(itertools.chain.from_iterable(chunks))
    finally:
        cursor.close()  # resets the statement: its read transaction ends here
