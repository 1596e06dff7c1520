"""Users' SCRAM credentials (RFC 5802, RFC 7677: SCRAM-SHA-256 and SCRAM-SHA-512), for the Kafka
door's SASL logins (table ``user_scram``, schema version :data:`SCRAM_VERSION`): derived when a
password is set, never the password itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ...domain.stream import UserId
from ..user_roles import ScramCredential
from .calls import SqlCalls, Statement

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


def store_scram_sql(
    mark: str, name: str, password_hash: str, scram: Sequence[ScramCredential]
) -> list[Statement]:
    """Replace the SCRAM credentials of the user named ``name`` with ``scram``: statements
    for the transaction that sets their password to ``password_hash``, which touch no user
    whose hash is another (a name that was taken already)."""
    user = f"SELECT id FROM users WHERE name = {mark} AND password_hash = {mark}"
    statements: list[Statement] = [
        (f"DELETE FROM user_scram WHERE user_id IN ({user})", (name, password_hash))
    ]
    statements += [
        (
            "INSERT INTO user_scram"
            " (user_id, mechanism, salt, iterations, stored_key, server_key)"
            f" SELECT id, {mark}, {mark}, {mark}, {mark}, {mark} FROM users"
            f" WHERE name = {mark} AND password_hash = {mark}",
            (c.mechanism, c.salt, c.iterations, c.stored_key, c.server_key, name, password_hash),
        )
        for c in scram
    ]
    return statements


class ScramTables(SqlCalls):
    """The SCRAM credentials' reads (:class:`~futoin_evt.storage.base.ScramSource`)."""

    async def scram_credential(self, user_id: UserId, mechanism: str) -> ScramCredential | None:
        m = self.dialect.mark
        rows = await self._fetch(
            "SELECT salt, iterations, stored_key, server_key FROM user_scram"
            f" WHERE user_id = {m} AND mechanism = {m}",
            (user_id, mechanism),
        )
        for salt, iterations, stored_key, server_key in rows:
            return ScramCredential(
                mechanism, bytes(salt), int(iterations), bytes(stored_key), bytes(server_key)
            )
        return None
