"""The SQLite schema, shared by the server's store and the native transactional API.

Versioned like the PostgreSQL one: table ``schema_version`` holds the version, and step ``n``
of :data:`MIGRATIONS` turns version ``n - 1`` into ``n``. Files written before the table
existed carry their version in ``PRAGMA user_version``.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..base import migrations_to_run
from ..checksums import add_attrs_sql, add_column_sql
from ..dedup import KEYED_ROWS_VERSION, TABLE, key_index_sql, keyed_rows_sql
from ..sql.grants import GRANTS_VERSION, UPGRADE_GRANTS, log_upgrade_grants
from ..sql.kafka import kafka_tables_sql
from ..sql.migrations import EVERY_EVENTS_TABLE, events_table_sql, migrations
from ..sql.schemas import tables_sql
from ..sql.scram import scram_tables_sql
from ..tables import Tables

_VERSION_1: Final = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused
    type TEXT NOT NULL,
    data TEXT NOT NULL,                    -- JSON text, sent to consumers as stored
    ts TEXT NOT NULL                       -- YYYY-MM-DDTHH:MM:SSZ
);
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS consumers (
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    component TEXT NOT NULL,
    position INTEGER NOT NULL DEFAULT 0,   -- highest acknowledged event id
    registered_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    PRIMARY KEY (user_id, component)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
-- Names this stream: HTTP feed clients learn of a new database (ids start again) by it.
INSERT OR IGNORE INTO meta (key, value) VALUES ('stream_id', lower(hex(randomblob(8))));
"""

#: Version 3: events appended through DCB (tags, client ids) and lookups by type.
_VERSION_3: Final = """
-- No foreign keys to events: a cascade would search event_tags on every discard. Rows here
-- go with their events only when the operator lets the discarder take DCB events.
CREATE TABLE IF NOT EXISTS dcb_events (
    event_id INTEGER PRIMARY KEY,
    client_id TEXT UNIQUE,                 -- the appender's id: makes a retry idempotent
    tags TEXT NOT NULL,                    -- JSON list, as given
    is_bytes INTEGER NOT NULL DEFAULT 0    -- data is a JSON string of base64 bytes
);
CREATE TABLE IF NOT EXISTS event_tags (
    tag TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    PRIMARY KEY (tag, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS event_tags_by_event ON event_tags (event_id);
CREATE INDEX IF NOT EXISTS events_by_type ON events (type, id);
"""

INSERT_EVENT: Final = "INSERT INTO events (type, data, ts, checksum) VALUES (?, ?, ?, ?)"


#: Migration steps by the version they make.
_VERSION_2: Final = """
-- Bumped by each push stream that claims the consumer: older streams' acks are fenced off.
ALTER TABLE consumers ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0
"""

#: Version 4: an event that came as an AMQP ``data`` section keeps its content type ('' for
#: none), so it goes back out as it came; NULL for every other event.
_VERSION_4: Final = """
ALTER TABLE events ADD COLUMN content_type TEXT
"""

#: Version 5: named streams of partitions. The log so far is ``events``/0 (key 0) and keeps
#: its tables; consumers are registered per partition (the small table is rebuilt, positions
#: and epochs kept). ``streams_version`` moves on with every add, grow and drop.
_VERSION_5: Final = """
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    aggregate_of TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partitions (
    key INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a dropped stream's tables go too
    stream TEXT NOT NULL REFERENCES streams(name) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    UNIQUE (stream, number)
);
INSERT OR IGNORE INTO streams (name, created_at) VALUES ('events', strftime('%Y-%m-%dT%H:%M:%SZ'));
INSERT OR IGNORE INTO partitions (key, stream, number) VALUES (0, 'events', 0);
CREATE TABLE consumers_v5 (
    partition_key INTEGER NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    component TEXT NOT NULL,
    position INTEGER NOT NULL DEFAULT 0,
    registered_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_key, user_id, component)
) WITHOUT ROWID;
INSERT INTO consumers_v5 (partition_key, user_id, component, position, registered_at,
    last_seen_at, epoch)
    SELECT 0, user_id, component, position, registered_at, last_seen_at, epoch FROM consumers;
DROP TABLE consumers;
ALTER TABLE consumers_v5 RENAME TO consumers;
CREATE INDEX IF NOT EXISTS consumers_by_user ON consumers (user_id);
INSERT OR IGNORE INTO meta (key, value) VALUES ('streams_version', '0')
"""

#: Version 6: aggregated streams. Each row of ``aggregate_sources`` is one source partition
#: of an aggregate partition and how far it is copied (the position moves in the copy's
#: transaction); ``aggregate_leases`` names the one process that copies into an aggregate.
_VERSION_6: Final = """
CREATE TABLE aggregate_sources (
    aggregate_key INTEGER NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
    source_key INTEGER NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
    position INTEGER NOT NULL DEFAULT 0,   -- the newest source id copied
    PRIMARY KEY (aggregate_key, source_key)
) WITHOUT ROWID;
CREATE INDEX aggregate_sources_by_source ON aggregate_sources (source_key);
CREATE TABLE aggregate_leases (
    aggregate_key INTEGER PRIMARY KEY REFERENCES partitions(key) ON DELETE CASCADE,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL               -- seconds since the epoch
)
"""

#: Version 7: what Event Hubs consumer processes share through the server's checkpoint store,
#: per user, hub (a stream's name), consumer group and partition id: who owns a partition (its
#: etag changes with every claim) and the checkpoint to resume from.
_VERSION_7: Final = """
CREATE TABLE IF NOT EXISTS eventhub_ownership (
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,                -- '' once released
    etag TEXT NOT NULL,
    modified_at REAL NOT NULL,             -- seconds since the epoch, as the SDK counts
    PRIMARY KEY (user_id, hub, consumer_group, partition_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS eventhub_checkpoints (
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    "offset" TEXT,
    sequence_number INTEGER,
    modified_at REAL NOT NULL,
    PRIMARY KEY (user_id, hub, consumer_group, partition_id)
) WITHOUT ROWID
"""

#: Version 8: which link holds each AMQP consumer group, per partition, user and group, for
#: every process on the database: its epoch (owner level), a claim number every new holder
#: bumps (it fences the older holder), and until when the hold lasts unless renewed.
_VERSION_8: Final = """
CREATE TABLE IF NOT EXISTS amqp_groups (
    partition_key INTEGER NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    consumer_group TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    claim INTEGER NOT NULL,
    held_until REAL NOT NULL,              -- seconds since the epoch, 0 once released
    PRIMARY KEY (partition_key, user_id, consumer_group)
) WITHOUT ROWID
"""

#: Version 9: rights per user on the streams a pattern covers (a name, ``prefix*`` or ``*``),
#: as a bit mask: read 1, write 2, manage 4. Users from before get read and write on ``*``.
_VERSION_9: Final = f"""
CREATE TABLE IF NOT EXISTS grants (
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    pattern TEXT NOT NULL,
    rights INTEGER NOT NULL,
    PRIMARY KEY (user_id, pattern)
) WITHOUT ROWID;
{UPGRADE_GRANTS}
"""

#: Kept AMQP link termini (:mod:`..sql.termini`), per user, peer container and link name: the
#: partition and consumer group of the link, what it had sent and not settled (packed ids),
#: and until when it is kept (seconds since the epoch). ``id`` orders them by keeping.
_TERMINI: Final = """
CREATE TABLE IF NOT EXISTS amqp_termini (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a user's oldest go first
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    container TEXT NOT NULL,
    link_name TEXT NOT NULL,
    partition_key INTEGER NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
    consumer_group TEXT,
    durable INTEGER NOT NULL,
    unsettled TEXT NOT NULL,
    incomplete INTEGER NOT NULL,
    after_id INTEGER NOT NULL,
    held TEXT NOT NULL,
    acked INTEGER NOT NULL,
    timeout REAL NOT NULL,
    expires_at REAL NOT NULL,
    UNIQUE (user_id, container, link_name)
);
CREATE INDEX IF NOT EXISTS amqp_termini_by_expiry ON amqp_termini (expires_at);
CREATE INDEX IF NOT EXISTS amqp_termini_by_partition ON amqp_termini (partition_key)
"""

#: The web console's sessions, for every process on the database: the SHA-256 digest of
#: the session's token (never the token), its user, created and last used (seconds since the
#: epoch), the notice its next page shows once.
_CONSOLE_SESSIONS: Final = """
CREATE TABLE IF NOT EXISTS console_sessions (
    digest BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created REAL NOT NULL,
    used REAL NOT NULL,
    notice TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS console_sessions_by_used ON console_sessions (used);
CREATE INDEX IF NOT EXISTS console_sessions_by_user ON console_sessions (user_id)
"""

#: Producers' keys of events (:mod:`..dedup`), per partition: the first event's
#: id and when it was stored (ms since the epoch), forgotten after the dedup window, oldest
#: first (by rowid: see :mod:`.keys`). Keys of a dropped stream's partitions go the
#: same way (partition keys are never reused).
_KEYS: Final = """
CREATE TABLE IF NOT EXISTS dedup_keys (
    partition_key INTEGER NOT NULL,
    key TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    at INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS dedup_keys_by_key ON dedup_keys (partition_key, key)
"""

#: Each key is its writer's (:mod:`..dedup`): the user id joins the unique index, between the
#: partition and the key, so one lookup still decides. The keys stored before are dropped
#: (events do not say who wrote them; see :data:`..dedup.WRITER_KEYS_VERSION`).
_WRITER_KEYS: Final = """
DROP TABLE dedup_keys;
CREATE TABLE dedup_keys (
    partition_key INTEGER NOT NULL,
    user_id INTEGER NOT NULL,
    key TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    at INTEGER NOT NULL
);
CREATE UNIQUE INDEX dedup_keys_by_key ON dedup_keys (partition_key, user_id, key)
"""

MIGRATIONS: Final = migrations(
    [_VERSION_1, _VERSION_2, _VERSION_3, _VERSION_4, _VERSION_5]  # noqa: RUF005 (one line is too long)
    + [_VERSION_6, _VERSION_7, _VERSION_8, _VERSION_9],
    termini=_TERMINI,
    schemas=";\n".join(tables_sql(postgres=False)),
    sessions=_CONSOLE_SESSIONS,
    keys=_KEYS,
    # events/0's column here, the other partitions' by ensure_schema
    checksums=add_column_sql("events"),
    writer_keys=_WRITER_KEYS,
    attrs=add_attrs_sql("events"),
    scram=";\n".join(scram_tables_sql(postgres=False)),
    kafka=";\n".join(kafka_tables_sql(postgres=False)),
    # every partition's events table by ensure_schema (_keys_into_rows)
    keyed_rows="",
)


def partition_tables_sql(key: int) -> list[str]:
    """The statements that create the tables of partition ``key`` (> 0): those of ``events``/0
    as the migrations left them, every column included."""
    return [
        events_table_sql(key, "INTEGER PRIMARY KEY AUTOINCREMENT"),
        f"CREATE INDEX events_{key}_by_type ON events_{key} (type, id)",
        key_index_sql(f"events_{key}"),
        f"""CREATE TABLE dcb_events_{key} (
            event_id INTEGER PRIMARY KEY,
            client_id TEXT UNIQUE,
            tags TEXT NOT NULL,
            is_bytes INTEGER NOT NULL DEFAULT 0
        )""",
        f"""CREATE TABLE event_tags_{key} (
            tag TEXT NOT NULL,
            event_id INTEGER NOT NULL,
            PRIMARY KEY (tag, event_id)
        ) WITHOUT ROWID""",
        f"CREATE INDEX event_tags_{key}_by_event ON event_tags_{key} (event_id)",
    ]


def drop_partition_tables_sql(key: int) -> list[str]:
    return [f"DROP TABLE IF EXISTS {t}_{key}" for t in ("events", "dcb_events", "event_tags")]


def _keys_into_rows(conn: sqlite3.Connection) -> None:
    """The step of :data:`..dedup.KEYED_ROWS_VERSION`: each partition's events table gets its
    keys (those of ``dedup_keys`` whose events are stored), then ``dedup_keys`` goes."""
    partitions = conn.execute("SELECT key FROM partitions WHERE key > 0").fetchall()
    for key in [0, *(int(k) for (k,) in partitions)]:
        for statement in keyed_rows_sql(Tables.of(key).events, key, postgres=False):
            conn.execute(statement)
    conn.execute(f"DROP TABLE {TABLE}")


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create or migrate the tables (in the caller's transaction); refuse a database written
    by a newer futoin-evt with :class:`~futoin_evt.storage.errors.SchemaTooNew`."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    current = row[0] if row[0] is not None else conn.execute("PRAGMA user_version").fetchone()[0]
    steps = migrations_to_run(current)
    # Statement by statement: executescript() would commit the caller's transaction.
    for version in steps:
        for statement in MIGRATIONS[version].split(";"):
            if statement.strip():
                conn.execute(statement)
        add_column = EVERY_EVENTS_TABLE.get(version)
        if add_column is not None:
            for (key,) in conn.execute("SELECT key FROM partitions WHERE key > 0").fetchall():
                conn.execute(add_column(Tables.of(int(key)).events))
        if version == KEYED_ROWS_VERSION:
            _keys_into_rows(conn)
    if current and GRANTS_VERSION in steps:
        log_upgrade_grants(conn.execute("SELECT count(*) FROM grants").fetchone()[0])
    if steps or row[0] is None:
        conn.execute("DELETE FROM schema_version")
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (steps.stop - 1,))
