"""A checkpoint store for the Azure Event Hubs SDK that keeps partition ownership and
checkpoints in this server, so that several ``EventHubConsumerClient`` processes share a
consumer group's partitions and resume where they stopped with nothing but futoin-evt::

    store = FutoinCheckpointStore.from_connection_string(conn_str)
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$Default", checkpoint_store=store
    )

The store talks to the server's ``$management`` node over the SDK's own AMQP client, with
the same connection string (the same user); ownership and checkpoints are the user's own.
It keeps one connection open for its requests: the SDK opens a connection for each
management request of its own and sleeps 50 ms for each frame it reads while opening it
(about 0.4 s a request), which a store that checkpoints each event cannot afford. Requests
from several threads take turns on it; a request that fails drops the connection, and the
next opens a new one. :mod:`futoin_evt.eventhubs.aio` has the twin for the asynchronous
client. Needs ``azure-eventhub`` (5.11 or later: its built-in AMQP client).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from typing import Any, Final

from azure.eventhub import CheckpointStore, EventHubProducerClient

from . import _requests as r

__all__ = ["FutoinCheckpointStore"]

#: How long opening the management connection may take before it counts as failed.
OPEN_TIMEOUT_SECONDS: Final = 60.0
#: How long a request may wait for its answer before the connection counts as lost.
ANSWER_TIMEOUT_SECONDS: Final = 60.0
#: The SDK's names of the answer's status properties, and the operation of every request.
STATUS_CODE: Final = b"status-code"
STATUS_DESCRIPTION: Final = b"status-description"
READ: Final = b"READ"


class ManagementRequestError(Exception):
    """The server answered a request with an error status (not a reason to reconnect)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class FutoinCheckpointStore(CheckpointStore):
    """The SDK's ``CheckpointStore``, kept in a futoin-evt server."""

    def __init__(self, client: EventHubProducerClient) -> None:
        #: Carries the requests (its address, credentials, retry policy and AMQP transport).
        self._client = client
        self._lock = threading.Lock()
        self._connection: Any = None  # the SDK's AMQPClient, open and authenticated
        self._auth: Any = None

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> FutoinCheckpointStore:
        """The connection string the SDK takes (``EntityPath`` or ``eventhub_name=``)."""
        return cls(EventHubProducerClient.from_connection_string(conn_str, **kwargs))

    def _open(self) -> Any:
        client = self._client
        if self._connection is None:
            self._auth = client._create_auth()
            self._connection = client._amqp_transport.create_mgmt_client(
                client._address, mgmt_auth=self._auth, config=client._config
            )
            self._connection.open()
        deadline = time.monotonic() + OPEN_TIMEOUT_SECONDS
        # each call reads one frame, blocking on the socket: no sleep between them
        while not self._connection.client_ready():
            if time.monotonic() > deadline:
                raise TimeoutError("the management connection did not open in time")
        return self._connection

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        amqp = connection._connection
        with contextlib.suppress(Exception):  # it is being thrown away
            connection.close()
        # the SDK leaves the socket open when the server had closed the connection
        with contextlib.suppress(Exception):
            amqp._transport.close()

    def _send(self, request: r.Request) -> Any:
        transport = self._client._amqp_transport
        connection = self._open()
        message = transport.build_message(
            application_properties=request.application_properties, value=request.body
        )
        message.application_properties["security_token"] = transport.get_updated_token(self._auth)
        status, description, response = transport.mgmt_client_request(
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

    def _answer(self, request: r.Request) -> Any:
        """The answer to one request, retried by the client's retry policy."""
        client = self._client
        with self._lock:
            retried = 0
            while True:
                try:
                    return self._send(request)
                except Exception as exc:  # mapped to the SDK's errors below
                    if isinstance(exc, ManagementRequestError):
                        exc = exc.error
                    else:
                        self._drop()
                    error = client._amqp_transport._handle_exception(exc, client, is_consumer=True)
                    if retried >= client._config.max_retries:
                        raise error from None
                    client._backoff(retried_times=retried, last_exception=error)
                    retried += 1

    def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        call = r.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group)
        return r.drive(call, self._answer)

    def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **_: Any
    ) -> Iterable[dict[str, Any]]:
        return r.drive(r.claim_ownership(ownership_list), self._answer)

    def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        r.drive(r.update_checkpoint(checkpoint), self._answer)

    def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        call = r.list_checkpoints(fully_qualified_namespace, eventhub_name, consumer_group)
        return r.drive(call, self._answer)

    def close(self) -> None:
        with self._lock:
            self._drop()
        self._client.close()

    def __enter__(self) -> FutoinCheckpointStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
