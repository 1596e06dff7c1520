"""SQLite's side of ``futoin-evt check`` (:mod:`..sql.scrub`) and its check at start
(``serve``): a scrub adds ``PRAGMA integrity_check``, what the file's own structure says
(b-trees, free pages, indexes), which the checksums do not cover.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Final

from ..errors import StoreDamaged, StoreUnavailable
from ..sql.scrub import PARTITIONS_SQL, CheckReport, check_chunk, chunk_sql, partitions_of
from ..tables import Tables

#: Lines of ``PRAGMA integrity_check`` kept.
INTEGRITY_LINES: Final = 100


#: SQLite's names of the errors that mean a damaged file.
_DAMAGE_ERRORS: Final = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})


def _open_read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise StoreUnavailable(f"there is no database file {path}")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        conn.close()
        raise _refusal(path, exc) from None
    return conn


def _refusal(path: Path, exc: sqlite3.Error) -> StoreDamaged | StoreUnavailable:
    """A damaged file (:class:`StoreDamaged`), or one that cannot be read now."""
    if getattr(exc, "sqlite_errorname", "") in _DAMAGE_ERRORS:
        return _damaged_file(path, exc)
    return StoreUnavailable(f"cannot read the database {path}: {exc}")


def _damaged_file(path: Path, problem: object) -> StoreDamaged:
    # one line: SQLite's report opens with "*** in database main ***" on a line of its own
    lines = [line.strip() for line in str(problem).splitlines()]
    problem = "; ".join(line for line in lines if line and not line.startswith("***"))
    return StoreDamaged(
        f"the database file {path} is damaged ({problem}): restore it from a backup, or copy"
        " what can still be read with the sqlite3 shell's .recover"
    )


def scrub_sqlite(path: Path) -> CheckReport:
    """Scrub the SQLite file (read only). Raises :class:`StoreUnavailable` when there is no
    such file, :class:`StoreDamaged` when SQLite cannot read its schema."""
    conn = _open_read_only(path)
    report = CheckReport(str(path))
    try:
        try:
            report.integrity = [
                str(row[0])
                for row in conn.execute(f"PRAGMA integrity_check({INTEGRITY_LINES})").fetchall()
            ]
        except sqlite3.DatabaseError as exc:
            report.integrity = [str(exc)]
        tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}
        if "events" not in tables:  # an empty file, or another program's database
            raise StoreUnavailable(f"{path} holds no futoin-evt data (it has no events table)")
        listed = conn.execute(PARTITIONS_SQL).fetchall() if "partitions" in tables else []
        for partition in partitions_of(listed):
            table = Tables.of(partition.key).events
            columns = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}
            try:
                if "checksum" not in columns:  # before checksums (an old schema)
                    report.unchecked += conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                else:
                    after: int | None = 0
                    while after is not None:
                        chunk = chunk_sql(partition, after, "?", "attrs" in columns)
                        rows = conn.execute(*chunk).fetchall()
                        after = check_chunk(report, partition, rows)
            except sqlite3.DatabaseError as exc:
                report.unreadable.append((partition, str(exc)))
    finally:
        conn.close()
    return report


def quick_check_sqlite(path: Path, seconds: float) -> bool:
    """``PRAGMA quick_check`` of the file, stopped after ``seconds``: True when it ran to its
    end, False when the time ran out first (a large file: part of it was checked). Raises
    :class:`StoreDamaged` when the file is malformed; a file that does not exist yet (a new
    database) passes."""
    if not path.exists():
        return True
    conn = _open_read_only(path)
    timer = threading.Timer(seconds, conn.interrupt)
    try:
        timer.start()
        try:
            rows = conn.execute("PRAGMA quick_check(1)").fetchall()
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_INTERRUPT":
                return False
            raise _refusal(path, exc) from None
        if [str(row[0]) for row in rows] != ["ok"]:
            raise _damaged_file(path, f"SQLite's quick check: {rows[0][0]}")
        return True
    finally:
        timer.cancel()
        conn.close()
