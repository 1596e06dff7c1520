"""What the Kafka door keeps in the database, for every process on it (schema version
:data:`KAFKA_VERSION`): producer ids and the last batches of each idempotent producer per
partition, the brokers (the ``serve`` processes) with their leases, and the consumer groups'
state."""

from __future__ import annotations

from typing import Final

#: The schema version that adds the Kafka door's tables (its number is kept here only).
KAFKA_VERSION: Final = 18


def kafka_tables_sql(postgres: bool) -> tuple[str, ...]:
    """The statements of :data:`KAFKA_VERSION`."""
    identity = (
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        if postgres
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    return (
        # producer ids are never given twice: AUTOINCREMENT, a sequence
        f"""CREATE TABLE IF NOT EXISTS kafka_producers (
            producer_id {identity},
            created_at TEXT NOT NULL
        )""",
        # an idempotent producer's last batches on a partition (JSON), with its epoch
        """CREATE TABLE IF NOT EXISTS kafka_sequences (
            producer_id BIGINT NOT NULL,
            partition_key BIGINT NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
            epoch INTEGER NOT NULL,
            batches TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (producer_id, partition_key)
        )""",
        # the serve processes that answer Kafka clients, while their lease runs
        """CREATE TABLE IF NOT EXISTS kafka_brokers (
            node_id INTEGER PRIMARY KEY,
            host TEXT NOT NULL,
            port INTEGER NOT NULL,
            lease_until DOUBLE PRECISION NOT NULL
        )""",
        # a consumer group's state (JSON), changed by compare-and-set of its version
        """CREATE TABLE IF NOT EXISTS kafka_groups (
            group_id TEXT PRIMARY KEY,
            version BIGINT NOT NULL,
            state TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
    )
