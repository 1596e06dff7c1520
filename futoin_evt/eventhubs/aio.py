"""The checkpoint store of :mod:`futoin_evt.eventhubs` for the SDK's asynchronous client
(``azure.eventhub.aio.EventHubConsumerClient``): the same calls and the same kept
connection, with tasks taking turns on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from azure.eventhub.aio import CheckpointStore, EventHubProducerClient

from . import (
    ANSWER_TIMEOUT_SECONDS,
    OPEN_TIMEOUT_SECONDS,
    READ,
    STATUS_CODE,
    STATUS_DESCRIPTION,
    ManagementRequestError,
)
from . import _requests as r

__all__ = ["FutoinCheckpointStore"]

T = TypeVar("T")


async def drive(call: r.Call[T], answer: Callable[[r.Request], Awaitable[Any]]) -> T:
    """:func:`futoin_evt.eventhubs._requests.drive`, awaiting each answer."""
    try:
        request = next(call)
        while True:
            request = call.send(await answer(request))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class FutoinCheckpointStore(CheckpointStore):
    """The SDK's asynchronous ``CheckpointStore``, kept in a futoin-evt server."""

    def __init__(self, client: EventHubProducerClient) -> None:
        self._client = client
        self._lock = asyncio.Lock()
        self._connection: Any = None  # the SDK's AMQPClientAsync, open and authenticated
        self._auth: Any = None

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> FutoinCheckpointStore:
        return cls(EventHubProducerClient.from_connection_string(conn_str, **kwargs))

    async def _open(self) -> Any:
        client = self._client
        if self._connection is None:
            self._auth = await client._create_auth_async()
            self._connection = client._amqp_transport.create_mgmt_client(
                client._address, mgmt_auth=self._auth, config=client._config
            )
            await self._connection.open_async()
        async with asyncio.timeout(OPEN_TIMEOUT_SECONDS):
            while not await self._connection.client_ready_async():
                pass  # each call awaits one frame
        return self._connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        amqp = connection._connection
        with contextlib.suppress(Exception):  # it is being thrown away
            await connection.close_async()
        # the SDK leaves the socket open when the server had closed the connection
        with contextlib.suppress(Exception):
            await amqp._transport.close()

    async def _send(self, request: r.Request) -> Any:
        transport = self._client._amqp_transport
        connection = await self._open()
        message = transport.build_message(
            application_properties=request.application_properties, value=request.body
        )
        token = await transport.get_updated_token_async(self._auth)
        message.application_properties["security_token"] = token
        status, description, response = await transport.mgmt_client_request_async(
            connection,
            message,
            operation=READ,
            operation_type=request.kind,
            status_code_field=STATUS_CODE,
            description_fields=STATUS_DESCRIPTION,
            timeout=ANSWER_TIMEOUT_SECONDS,
        )
        if int(status) >= 400:
            if isinstance(description, bytes):
                description = description.decode()
            raise ManagementRequestError(transport.get_error(int(status), description))
        return r.plain(response.value)

    async def _answer(self, request: r.Request) -> Any:
        client = self._client
        async with self._lock:
            retried = 0
            while True:
                try:
                    return await self._send(request)
                except Exception as exc:  # mapped to the SDK's errors below
                    if isinstance(exc, ManagementRequestError):
                        exc = exc.error
                    else:
                        await self._drop()
                    transport = client._amqp_transport
                    error = await transport._handle_exception_async(exc, client, is_consumer=True)
                    if retried >= client._config.max_retries:
                        raise error from None
                    await client._backoff_async(retried_times=retried, last_exception=error)
                    retried += 1

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        call = r.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group)
        return await drive(call, self._answer)

    async def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **_: Any
    ) -> Iterable[dict[str, Any]]:
        return await drive(r.claim_ownership(ownership_list), self._answer)

    async def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        await drive(r.update_checkpoint(checkpoint), self._answer)

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        call = r.list_checkpoints(fully_qualified_namespace, eventhub_name, consumer_group)
        return await drive(call, self._answer)

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
        await self._client.close()

    async def __aenter__(self) -> FutoinCheckpointStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
