"""How one backend spells the SQL that differs between SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Dialect:
    """The parts of a statement that a backend spells its own way; everything else in
    :mod:`futoin_evt.storage.sql` is the same text on both."""

    #: The parameter placeholder.
    mark: str
    #: The current time in seconds since the epoch, as a REAL/double expression.
    now: str
    #: The function of two or more values that gives the largest.
    greatest: str
    #: True: a list is one array parameter (``= ANY(mark)``); False: ``IN (mark, ...)``.
    arrays: bool
    #: The clause that locks the rows a SELECT reads until the transaction ends ("" when the
    #: backend's writer is serial anyway).
    lock_rows: str
    #: The clause that keeps the rows read from changing (shared lock), "" where serial.
    share_rows: str

    def marks(self, count: int) -> str:
        """``count`` placeholders separated by commas."""
        return ", ".join([self.mark] * count)

    def one_of(self, column: str, count: int) -> str:
        """``column`` equal to one of ``count`` values: the parameters are the list itself
        (arrays) or its items (see :meth:`one_of_params`)."""
        if self.arrays:
            return f"{column} = ANY({self.mark})"
        return f"{column} IN ({self.marks(count)})"

    def one_of_params(self, values: list[object]) -> list[object]:
        """The parameters for :meth:`one_of`."""
        return [values] if self.arrays else values


SQLITE: Final = Dialect(
    mark="?",
    now="((julianday('now') - 2440587.5) * 86400.0)",
    greatest="MAX",
    arrays=False,
    lock_rows="",
    share_rows="",
)

POSTGRES: Final = Dialect(
    mark="%s",
    now="extract(epoch FROM clock_timestamp())",
    greatest="GREATEST",
    arrays=True,
    lock_rows=" FOR UPDATE",
    share_rows=" FOR SHARE",
)
