"""The databases under the servers: SQL outside any store, a schema as an old release left it,
the PostgreSQL cluster itself."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Sequence
from typing import Any

from .waiting import until_blocking


def stored(db: str, table: str = "events") -> list[tuple[int, Any]]:
    """(id, data) of every event of ``table``, by id, read with SQL outside any store."""
    rows = execute_sql(db, f"SELECT id, data FROM {table} ORDER BY id")
    return [(int(event_id), json.loads(data)) for event_id, data in rows]


def pg_schema_at(url: str, version: int) -> None:
    """Make the empty database ``url`` as a release at schema ``version`` left it (the
    migration steps stay in the code)."""
    import psycopg

    from futoin_evt.storage.postgres.schema import MIGRATIONS

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for step in range(1, version + 1):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))


class PgCluster:
    """The PostgreSQL cluster (Debian's pg_ctlcluster) that serves the test database."""

    def __init__(self, version: str, name: str, host: str, port: int) -> None:
        self.version, self.name, self.host, self.port = version, name, host, port

    def control(self, action: str, *, check: bool = True) -> None:
        """``restart``, ``stop`` or ``start`` (fast mode: connections are cut); returns once
        the cluster answers again (or, for ``stop``, has stopped)."""
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action],
            check=check,
            capture_output=True,
            timeout=120,
        )
        if action != "stop":
            self.wait_ready()

    def is_ready(self) -> bool:
        ready = subprocess.run(
            ["pg_isready", "-q", "-h", self.host, "-p", str(self.port), "-t", "1"],
            check=False,
            timeout=30,
        )
        return ready.returncode == 0

    def wait_ready(self, seconds: float = 60.0) -> None:
        # each probe itself waits up to 1 s
        until_blocking(self.is_ready, f"PostgreSQL on port {self.port} ready", seconds)


def execute_sql(db: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the database outside any store (``?`` placeholders)."""
    if db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description is not None else []
    with sqlite3.connect(db, isolation_level=None) as conn:
        return conn.execute(sql, params).fetchall()
