"""What the Kafka door keeps in the database, for every process on it (schema version
:data:`KAFKA_VERSION`): producer ids and the last batches of each idempotent producer per
partition, the brokers (the ``serve`` processes) with their leases, and the consumer groups'
state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from .calls import SqlCalls

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
            created_at DOUBLE PRECISION NOT NULL
        )""",
        # an idempotent producer's last batches on a partition (JSON), with its epoch
        """CREATE TABLE IF NOT EXISTS kafka_sequences (
            producer_id BIGINT NOT NULL,
            partition_key BIGINT NOT NULL REFERENCES partitions(key) ON DELETE CASCADE,
            epoch INTEGER NOT NULL,
            batches TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (producer_id, partition_key)
        )""",
        # the serve processes that answer Kafka clients, while their lease runs
        """CREATE TABLE IF NOT EXISTS kafka_brokers (
            node_id INTEGER PRIMARY KEY,
            host TEXT NOT NULL,
            port INTEGER NOT NULL,
            lease_until DOUBLE PRECISION NOT NULL,
            UNIQUE (host, port)
        )""",
        # a consumer group's state (JSON), changed by compare-and-set of its version
        """CREATE TABLE IF NOT EXISTS kafka_groups (
            group_id TEXT PRIMARY KEY,
            version BIGINT NOT NULL,
            state TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
    )


#: A kept batch of an idempotent producer: (first sequence, last sequence, base offset).
KeptBatch = tuple[int, int, int]
#: A broker while its lease runs: (node id, host, port).
BrokerRow = tuple[int, str, int]
#: Seconds a broker's row stays after its lease ran out (its node id is not given again
#: meanwhile: a process that paused that long comes back under a new one).
_BROKER_GRACE: Final = 60.0
#: Tries of a broker's registration that lost a race for a node id to another process.
_REGISTER_TRIES: Final = 5


class KafkaTables(SqlCalls):
    """The calls of :class:`~futoin_evt.storage.base.KafkaState` (each one transaction)."""

    async def new_producer_id(self) -> int:
        sql = (
            f"INSERT INTO kafka_producers (created_at) VALUES ({self.dialect.now})"
            " RETURNING producer_id"
        )
        (rows,) = await self._run([(sql, ())])
        return int(rows[0][0])

    async def producer_batches(
        self, producer_id: int, partition_key: int
    ) -> tuple[int, list[KeptBatch]] | None:
        m = self.dialect.mark
        rows = await self._fetch(
            "SELECT epoch, batches FROM kafka_sequences"
            f" WHERE producer_id = {m} AND partition_key = {m}",
            (producer_id, partition_key),
        )
        if not rows:
            return None
        epoch, batches = rows[0]
        return int(epoch), [(int(a), int(b), int(c)) for a, b, c in json.loads(batches)]

    async def keep_producer_batches(
        self, kept: Sequence[tuple[int, int, int, Sequence[KeptBatch]]]
    ) -> None:
        m, now = self.dialect.mark, self.dialect.now
        sql = (
            "INSERT INTO kafka_sequences (producer_id, partition_key, epoch, batches, updated_at)"
            f" SELECT {m}, key, {m}, {m}, {now} FROM partitions WHERE key = {m}"
            " ON CONFLICT (producer_id, partition_key) DO UPDATE"
            " SET epoch = excluded.epoch, batches = excluded.batches,"
            " updated_at = excluded.updated_at"
        )
        if kept:
            await self._run(
                [
                    (sql, (producer_id, epoch, json.dumps([list(b) for b in batches]), key))
                    for producer_id, key, epoch, batches in kept
                ]
            )

    async def register_broker(self, host: str, port: int, lease: float) -> int:
        m, now = self.dialect.mark, self.dialect.now
        forget = f"DELETE FROM kafka_brokers WHERE lease_until < {now} - {m}"
        insert = (
            "INSERT INTO kafka_brokers (node_id, host, port, lease_until)"
            f" SELECT COALESCE(MAX(node_id) + 1, 0), {m}, {m}, {now} + {m} FROM kafka_brokers"
            " WHERE 1 = 1 ON CONFLICT (host, port) DO UPDATE"
            " SET lease_until = excluded.lease_until RETURNING node_id"
        )
        for tries_left in range(_REGISTER_TRIES - 1, -1, -1):
            try:
                _, rows = await self._run(
                    [(forget, (_BROKER_GRACE,)), (insert, (host, port, lease))]
                )
            except Exception:  # another process took that node id meanwhile
                if not tries_left:
                    raise
                continue
            return int(rows[0][0])
        raise AssertionError("unreachable")

    async def renew_broker(
        self, node_id: int, host: str, port: int, lease: float
    ) -> list[BrokerRow] | None:
        m, now = self.dialect.mark, self.dialect.now
        renew = (
            f"UPDATE kafka_brokers SET lease_until = {now} + {m}"
            f" WHERE node_id = {m} AND host = {m} AND port = {m} RETURNING node_id"
        )
        live = (
            "SELECT node_id, host, port FROM kafka_brokers"
            f" WHERE lease_until > {now} ORDER BY node_id"
        )
        renewed, rows = await self._run([(renew, (lease, node_id, host, port)), (live, ())])
        if not renewed:
            return None
        return [(int(node), str(name), int(number)) for node, name, number in rows]

    async def drop_broker(self, node_id: int) -> None:
        m = self.dialect.mark
        await self._run([(f"DELETE FROM kafka_brokers WHERE node_id = {m}", (node_id,))])

    async def group_state(self, group_id: str) -> tuple[int, str] | None:
        m = self.dialect.mark
        rows = await self._fetch(
            f"SELECT version, state FROM kafka_groups WHERE group_id = {m}", (group_id,)
        )
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    async def put_group_state(self, group_id: str, version: int, state: str) -> bool:
        m, now = self.dialect.mark, self.dialect.now
        if version == 0:
            sql = (
                "INSERT INTO kafka_groups (group_id, version, state, updated_at)"
                f" VALUES ({m}, 1, {m}, {now}) ON CONFLICT (group_id) DO NOTHING RETURNING version"
            )
            params: tuple[object, ...] = (group_id, state)
        else:
            sql = (
                f"UPDATE kafka_groups SET version = version + 1, state = {m}, updated_at = {now}"
                f" WHERE group_id = {m} AND version = {m} RETURNING version"
            )
            params = (state, group_id, version)
        (rows,) = await self._run([(sql, params)])
        return bool(rows)

    async def forget_idle_kafka_state(self, idle_seconds: float) -> int:
        m, now = self.dialect.mark, self.dialect.now
        producers, groups = await self._run(
            [
                (
                    f"DELETE FROM kafka_sequences WHERE updated_at < {now} - {m}"
                    " RETURNING producer_id",
                    (idle_seconds,),
                ),
                (
                    f"DELETE FROM kafka_groups WHERE updated_at < {now} - {m} RETURNING group_id",
                    (idle_seconds,),
                ),
            ]
        )
        return len(producers) + len(groups)

    async def group_ids(self) -> list[str]:
        rows = await self._fetch("SELECT group_id FROM kafka_groups ORDER BY group_id")
        return [str(row[0]) for row in rows]
