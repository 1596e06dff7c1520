"""The checkpoint store of :mod:`futoin_evt.eventhubs` for the SDK's asynchronous client
(``azure.eventhub.aio.EventHubConsumerClient``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from azure.eventhub.aio import CheckpointStore, EventHubProducerClient

from . import _requests as r

__all__ = ["FutoinCheckpointStore"]


class FutoinCheckpointStore(CheckpointStore):
    """The SDK's asynchronous ``CheckpointStore``, kept in a futoin-evt server."""

    def __init__(self, client: EventHubProducerClient) -> None:
        self._client = client

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> FutoinCheckpointStore:
        return cls(EventHubProducerClient.from_connection_string(conn_str, **kwargs))

    async def _request(self, kind: bytes, hub: str, group: str, body: Any = None) -> Any:
        message = self._client._amqp_transport.build_message(
            application_properties=r.properties(hub, group), value=body
        )
        response = await self._client._management_request_async(message, op_type=kind)
        return r.plain(response.value)

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        scope = r.scope(fully_qualified_namespace, eventhub_name, consumer_group)
        rows = await self._request(r.LIST_OWNERSHIP, eventhub_name, consumer_group)
        return [{**scope, **row} for row in rows or ()]

    async def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **_: Any
    ) -> Iterable[dict[str, Any]]:
        claimed: list[dict[str, Any]] = []
        for (namespace, hub, group), claims in r.by_group(ownership_list).items():
            rows = await self._request(r.CLAIM_OWNERSHIP, hub, group, claims)
            claimed += [{**r.scope(namespace, hub, group), **row} for row in rows or ()]
        return claimed

    async def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        hub, group = checkpoint["eventhub_name"], checkpoint["consumer_group"]
        await self._request(r.UPDATE_CHECKPOINT, hub, group, r.checkpoint_body(checkpoint))

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        scope = r.scope(fully_qualified_namespace, eventhub_name, consumer_group)
        rows = await self._request(r.LIST_CHECKPOINTS, eventhub_name, consumer_group)
        return [{**scope, **row} for row in rows or ()]

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> FutoinCheckpointStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
