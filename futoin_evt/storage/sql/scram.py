"""Users' SCRAM credentials (RFC 5802, RFC 7677: SCRAM-SHA-256 and SCRAM-SHA-512), for the Kafka
door's SASL logins (table ``user_scram``, schema version :data:`SCRAM_VERSION`): derived when a
password is set, never the password itself."""

from __future__ import annotations

from typing import Final

#: The schema version that adds ``user_scram`` (its number is kept here only).
SCRAM_VERSION: Final = 17


def scram_tables_sql(postgres: bool) -> tuple[str, ...]:
    """The statements of :data:`SCRAM_VERSION`."""
    user_id, blob = ("BIGINT", "BYTEA") if postgres else ("INTEGER", "BLOB")
    return (
        f"""CREATE TABLE IF NOT EXISTS user_scram (
            user_id {user_id} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            mechanism TEXT NOT NULL,     -- SCRAM-SHA-256 or SCRAM-SHA-512
            salt {blob} NOT NULL,
            iterations INTEGER NOT NULL,
            stored_key {blob} NOT NULL,
            server_key {blob} NOT NULL,
            PRIMARY KEY (user_id, mechanism)
        )""",
    )
