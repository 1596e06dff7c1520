"""The Azure Event Hubs SDK against the AMQP door: SAS keys, connection strings, receiving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from azure.eventhub import EventHubConsumerClient
from proton import Message
from proton.utils import BlockingConnection

from futoin_evt.amqp import AmqpConfig
from futoin_evt.auth.sas import sas_key
from futoin_evt.server.app import EventServer

from .servers import ServerFactory

SECRET = b"a test secret of more than thirty-two characters"


async def key_of(server: EventServer, name: str) -> str:
    user = await server.store.get_user(name)
    assert user is not None
    return sas_key(SECRET, user)


def connection_string(server: EventServer, user: str, key: str, hub: str = "events") -> str:
    """To the event hub (stream) ``hub`` of ``server`` as ``user``."""
    assert server.amqp is not None
    return (
        f"Endpoint=sb://127.0.0.1:{server.amqp.port}/;SharedAccessKeyName={user};"
        f"SharedAccessKey={key};EntityPath={hub};UseDevelopmentEmulator=true"
    )


#: The partitioned event hub of :func:`hub`.
HUB = "orders"
PARTITIONS = 4


@pytest.fixture
async def hub(start_server: ServerFactory, store_db: str) -> EventServer:
    """A server with the AMQP door (SAS keys) and the stream :data:`HUB` of
    :data:`PARTITIONS` partitions, on each backend."""
    server = await start_server(db=store_db, amqp=AmqpConfig(port=0, sas_secret=SECRET))
    await server.store.add_stream(HUB, PARTITIONS)
    await server.streams.refresh()
    return server


#: EventHubConsumerClient options :func:`receive_from` gives the client.
CLIENT_OPTIONS = ("socket_timeout", "partition_ownership_expiration_interval")


def receive_from(conn_str: str, count: int, **options: Any) -> list[tuple[str, Any]]:
    """(partition id, event) until ``count`` came, with EventHubConsumerClient.receive;
    ``options``: those of receive, and the client's ``load_balancing_*`` and those of
    :data:`CLIENT_OPTIONS`."""
    client = EventHubConsumerClient.from_connection_string(
        conn_str,
        consumer_group="$Default",
        **{
            k: options.pop(k)
            for k in list(options)
            if k.startswith("load_balancing_") or k in CLIENT_OPTIONS
        },
    )
    received: list[tuple[str, Any]] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def on_event(context: Any, event: Any) -> None:
        if event is None:
            return
        with lock:
            received.append((context.partition_id, event))
            if len(received) == count:
                threading.Thread(target=client.close).start()

    def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)
        threading.Thread(target=client.close).start()

    with client:
        client.receive(on_event=on_event, on_error=on_error, **options)
    assert not errors, errors
    return received


@contextmanager
def anonymous(server: EventServer) -> Iterator[BlockingConnection]:
    assert server.amqp is not None
    conn = BlockingConnection(
        f"amqp://127.0.0.1:{server.amqp.port}", allowed_mechs="ANONYMOUS", timeout=30
    )
    try:
        yield conn
    finally:
        conn.close()


def put_token(conn: BlockingConnection, token: str, audience: str) -> tuple[int, str]:
    """One put-token request on ``$cbs``; (status code, description)."""
    replies = conn.create_receiver("$cbs", credit=1)
    requests = conn.create_sender("$cbs")
    request = Message(
        id=1,
        reply_to="$cbs",
        body=token,
        properties={
            "operation": "put-token",
            "type": "servicebus.windows.net:sastoken",
            "name": audience,
        },
    )
    requests.send(request)
    reply = replies.receive()
    requests.close()  # type: ignore[no-untyped-call]
    replies.close()  # type: ignore[no-untyped-call]
    assert reply.correlation_id == 1
    properties: dict[str, Any] = dict(reply.properties or {})
    return properties["status-code"], properties["status-description"]
