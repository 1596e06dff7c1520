"""The PostgreSQL schema, versioned like the SQLite one (table ``schema_version``).

Event data and timestamps are stored as the same text as in SQLite: data is the JSON text
sent to consumers as is (``jsonb`` would rewrite it), ts is ``YYYY-MM-DDTHH:MM:SSZ``.
"""

from __future__ import annotations

from typing import Final

import psycopg

from ..base import migrations_to_run

#: Advisory lock keys (one namespace for futoin-evt: the first key of the two-int form).
LOCK_NAMESPACE: Final = 0x46544E  # "FTN"
#: Held from id assignment to commit by every transaction that adds events.
APPEND_LOCK: Final = 1
#: Held while the schema is created or migrated.
MIGRATION_LOCK: Final = 2
#: Held by the one process that discards (per transaction).
RETENTION_LOCK: Final = 3

#: The channel that carries a new head id to every process, and the claims of consumers.
CHANNEL: Final = "futoin_evt_head"
#: A claim's payload is ``claim <user id> <epoch> <component>`` (a head's is only digits).
CLAIM_PAYLOAD: Final = "claim"

_VERSION_1: Final = (
    """CREATE TABLE IF NOT EXISTS events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- a sequence: never reused
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        ts TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS users (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        password_hash TEXT NOT NULL,
        is_admin BOOLEAN NOT NULL DEFAULT false,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS consumers (
        user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        component TEXT NOT NULL,
        position BIGINT NOT NULL DEFAULT 0,
        registered_at TEXT NOT NULL,
        last_seen_at TEXT NOT NULL,
        PRIMARY KEY (user_id, component)
    )""",
    "CREATE INDEX IF NOT EXISTS events_ts ON events (ts)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # Names this stream; 'last_deleted_id' keeps the newest id given when all are discarded.
    "INSERT INTO meta (key, value) VALUES ('stream_id', substr(md5(random()::text), 1, 16))"
    " ON CONFLICT DO NOTHING",
)

#: Migration steps by the version they make.
_VERSION_2: Final = (
    # Bumped by each push stream that claims the consumer; fences older streams' acks.
    "ALTER TABLE consumers ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0",
)

_VERSION_3: Final = (
    # Events appended through DCB. No foreign keys to events: a cascade would search
    # event_tags on every discard; these rows go with their events only when asked.
    """CREATE TABLE IF NOT EXISTS dcb_events (
        event_id BIGINT PRIMARY KEY,
        client_id TEXT UNIQUE,
        tags TEXT NOT NULL,
        is_bytes BOOLEAN NOT NULL DEFAULT false
    )""",
    # "C": tag ranges (key: up to key;) compare bytes, whatever the database's collation.
    """CREATE TABLE IF NOT EXISTS event_tags (
        tag TEXT COLLATE "C" NOT NULL,
        event_id BIGINT NOT NULL,
        PRIMARY KEY (tag, event_id)
    )""",
    "CREATE INDEX IF NOT EXISTS event_tags_by_event ON event_tags (event_id)",
    "CREATE INDEX IF NOT EXISTS events_by_type ON events (type, id)",
)

_VERSION_4: Final = (
    # The content type of the AMQP data section an event came as ('' for none); NULL else.
    "ALTER TABLE events ADD COLUMN IF NOT EXISTS content_type TEXT",
)

MIGRATIONS: Final = {1: _VERSION_1, 2: _VERSION_2, 3: _VERSION_3, 4: _VERSION_4}

INSERT_EVENT: Final = "INSERT INTO events (type, data, ts) VALUES (%s, %s, %s) RETURNING id"
TAKE_APPEND_LOCK: Final = f"SELECT pg_advisory_xact_lock({LOCK_NAMESPACE}, {APPEND_LOCK})"
#: After an insert: tell every process the newest id this transaction drew (sent on commit).
NOTIFY_HEAD: Final = (
    f"SELECT pg_notify('{CHANNEL}', currval(pg_get_serial_sequence('events', 'id'))::text)"
)


async def ensure_schema(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    """Create or migrate the tables in one transaction, one process at a time; refuse a
    newer schema with :class:`~futoin_evt.storage.base.SchemaTooNew`."""
    async with conn.transaction():
        await conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_NAMESPACE}, {MIGRATION_LOCK})")
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        cursor = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        row = await cursor.fetchone()
        assert row is not None
        steps = migrations_to_run(int(str(row[0])))
        for version in steps:
            for statement in MIGRATIONS[version]:
                await conn.execute(statement)
        if steps:
            await conn.execute("DELETE FROM schema_version")
            await conn.execute(
                "INSERT INTO schema_version (version) VALUES (%s)", (steps.stop - 1,)
            )
