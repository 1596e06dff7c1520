"""A checkpoint store for the Azure Event Hubs SDK that keeps partition ownership and
checkpoints in this server, so that several ``EventHubConsumerClient`` processes share a
consumer group's partitions and resume where they stopped with nothing but futoin-evt::

    store = FutoinCheckpointStore.from_connection_string(conn_str)
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$Default", checkpoint_store=store
    )

The store talks to the server's ``$management`` node over the SDK's own AMQP client, with
the same connection string (the same user); ownership and checkpoints are the user's own.
:mod:`futoin_evt.eventhubs.aio` has the twin for the asynchronous client. Needs
``azure-eventhub`` (5.11 or later: its built-in AMQP client).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from azure.eventhub import CheckpointStore, EventHubProducerClient

from . import _requests as r

__all__ = ["FutoinCheckpointStore"]


class FutoinCheckpointStore(CheckpointStore):
    """The SDK's ``CheckpointStore``, kept in a futoin-evt server."""

    def __init__(self, client: EventHubProducerClient) -> None:
        #: Carries the requests (its management link, retries and credentials).
        self._client = client

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> FutoinCheckpointStore:
        """The connection string the SDK takes (``EntityPath`` or ``eventhub_name=``)."""
        return cls(EventHubProducerClient.from_connection_string(conn_str, **kwargs))

    def _request(self, kind: bytes, hub: str, group: str, body: Any = None) -> Any:
        message = self._client._amqp_transport.build_message(
            application_properties=r.properties(hub, group), value=body
        )
        response = self._client._management_request(message, op_type=kind)
        return r.plain(response.value)

    def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        scope = r.scope(fully_qualified_namespace, eventhub_name, consumer_group)
        rows = self._request(r.LIST_OWNERSHIP, eventhub_name, consumer_group)
        return [{**scope, **row} for row in rows or ()]

    def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **_: Any
    ) -> Iterable[dict[str, Any]]:
        claimed: list[dict[str, Any]] = []
        for (namespace, hub, group), claims in r.by_group(ownership_list).items():
            rows = self._request(r.CLAIM_OWNERSHIP, hub, group, claims)
            claimed += [{**r.scope(namespace, hub, group), **row} for row in rows or ()]
        return claimed

    def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        hub, group = checkpoint["eventhub_name"], checkpoint["consumer_group"]
        self._request(r.UPDATE_CHECKPOINT, hub, group, r.checkpoint_body(checkpoint))

    def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        scope = r.scope(fully_qualified_namespace, eventhub_name, consumer_group)
        rows = self._request(r.LIST_CHECKPOINTS, eventhub_name, consumer_group)
        return [{**scope, **row} for row in rows or ()]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> FutoinCheckpointStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
