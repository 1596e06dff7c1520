"""The primitives the shared calls of :mod:`futoin_evt.storage.sql` run over; each backend
gives them, and its :class:`~.dialect.Dialect`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..tables import Tables
from .dialect import Dialect

#: One statement: (SQL, parameters).
Statement = tuple[str, Sequence[Any]]
#: A run of statements for one transaction.
Statements = list[Statement]
#: Rows as a backend's driver returns them.
Rows = list[tuple[Any, ...]]


class SqlCalls:
    """What a backend gives the shared calls: its dialect, a read, a write of one statement,
    and several statements in one transaction."""

    dialect: ClassVar[Dialect]

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """The rows of a read (no write, no lock held after it)."""
        raise NotImplementedError

    async def _write(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """The rows of one statement that writes, committed once it returns."""
        raise NotImplementedError

    async def _run(self, statements: Statements) -> list[Rows]:
        """Run ``statements`` in one transaction; the rows each returned."""
        raise NotImplementedError


class PartitionCalls(SqlCalls):
    """The primitives, for calls about one partition: its key and tables."""

    _key: int
    _tables: Tables
    #: Reads the newest id ever given to one of its events, even if that event is discarded.
    _last_given: str
    #: Reads the newest id of its events (0: none).
    _newest: str
