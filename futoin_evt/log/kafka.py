"""What the Kafka door keeps in the database for every process on it: idempotent producers'
ids and last batches, the brokers (processes answering Kafka clients) with their leases, and
the consumer groups' state (:class:`~futoin_evt.storage.base.KafkaState`).

No call takes an acting user: the door checks the rights on the topics and groups a request
names before it calls (a producer id or a broker's row holds nothing of a stream)."""

from __future__ import annotations

from collections.abc import Sequence

from ..storage.base import KafkaState


class KafkaShared:
    """:class:`~futoin_evt.storage.base.KafkaState`'s calls (each one transaction)."""

    def __init__(self, store: KafkaState) -> None:
        self._store = store

    async def new_producer_id(self) -> int:
        """A producer id no process was given before."""
        return await self._store.new_producer_id()

    async def producer_batches(
        self, producer_id: int, partition_key: int
    ) -> tuple[int, list[tuple[int, int, int]]] | None:
        """(epoch, [(first sequence, last sequence, base offset)]) kept of a producer on a
        partition, oldest batch first; None when none are."""
        return await self._store.producer_batches(producer_id, partition_key)

    async def keep_producer_batches(
        self, kept: Sequence[tuple[int, int, int, Sequence[tuple[int, int, int]]]]
    ) -> None:
        """Keep (producer id, partition key, epoch, batches) each."""
        await self._store.keep_producer_batches(kept)

    async def register_broker(self, host: str, port: int, lease: float) -> int:
        """This broker's node id (the one of its address while that row lasts)."""
        return await self._store.register_broker(host, port, lease)

    async def renew_broker(
        self, node_id: int, host: str, port: int, lease: float
    ) -> list[tuple[int, str, int]] | None:
        """The live brokers (node id, host, port), or None when the lease was lost."""
        return await self._store.renew_broker(node_id, host, port, lease)

    async def drop_broker(self, node_id: int) -> None:
        await self._store.drop_broker(node_id)

    async def group_state(self, group_id: str) -> tuple[int, str] | None:
        """(version, state) of a consumer group, None when none is kept."""
        return await self._store.group_state(group_id)

    async def put_group_state(self, group_id: str, version: int, state: str) -> bool:
        """Compare-and-set: False when the group's version is not ``version`` any more."""
        return await self._store.put_group_state(group_id, version, state)

    async def group_ids(self) -> list[str]:
        return await self._store.group_ids()

    async def forget_idle(self, idle_seconds: float) -> int:
        """Forget producers' batches and groups not changed for ``idle_seconds``."""
        return await self._store.forget_idle_kafka_state(idle_seconds)
