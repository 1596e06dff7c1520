"""``futoin-evt check`` on PostgreSQL: every event against its checksum
(:mod:`..sql.scrub`), with the cluster's own page checksums as a note."""

from __future__ import annotations

from typing import Final

import psycopg

from ..base import DEFAULT_POOL
from ..sql.scrub import PARTITIONS_SQL, CheckReport, check_chunk, chunk_sql, partitions_of
from ..tables import Tables
from .connect import connect, safe_url

#: Whether a table has a column (parameters: table, column).
_HAS_COLUMN: Final = (
    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
    " AND table_name = %s AND column_name = %s"
)


async def scrub_postgres(url: str) -> CheckReport:
    """Scrub the database (reads only). Raises :class:`~..errors.StoreUnavailable` when it
    cannot be reached."""
    report = CheckReport(safe_url(url))
    conn = await connect(url, autocommit=True, link_timeout=DEFAULT_POOL.link_timeout)
    try:
        cursor = await conn.execute("SHOW data_checksums")
        row = await cursor.fetchone()
        setting = str(row[0]) if row is not None else "unknown"
        report.notes.append(
            f"PostgreSQL's own page checksums (data_checksums): {setting}"
            + ("" if setting == "on" else " (damage outside the events' content may go unnoticed)")
        )
        cursor = await conn.execute(PARTITIONS_SQL)
        for partition in partitions_of(await cursor.fetchall()):
            table = Tables.of(partition.key).events
            after: int | None = 0
            try:
                cursor = await conn.execute(_HAS_COLUMN, (table, "checksum"))
                if await cursor.fetchone() is None:  # before checksums (an old schema)
                    cursor = await conn.execute(f"SELECT count(*) FROM {table}")
                    counted = await cursor.fetchone()
                    report.unchecked += int(counted[0]) if counted is not None else 0
                    continue
                cursor = await conn.execute(_HAS_COLUMN, (table, "attrs"))
                with_attrs = await cursor.fetchone() is not None
                while after is not None:
                    cursor = await conn.execute(*chunk_sql(partition, after, "%s", with_attrs))
                    after = check_chunk(report, partition, await cursor.fetchall())
            except psycopg.Error as exc:
                report.unreadable.append((partition, str(exc).strip().splitlines()[0]))
    finally:
        await conn.close()
    return report
