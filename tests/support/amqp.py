"""AMQP 1.0 clients (Qpid Proton) of the AMQP door."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from proton import (
    Described,
    Message,
    symbol,
    ulong,
)
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection

from .servers import USERS

T = TypeVar("T")


ANNOTATIONS_FILTER = ulong(0x200)


class LinkProperties(LinkOption):
    def __init__(self, **properties: Any) -> None:
        self.properties = {symbol(k.replace("_", "-")): v for k, v in properties.items()}

    def apply(self, link: Any) -> None:
        link.properties = self.properties


def annotations_filter(**values: Any) -> Filter:
    described = {symbol(f"event-streams-{k}"): v for k, v in values.items()}
    return Filter({symbol("offset"): Described(ANNOTATIONS_FILTER, cast(Any, described))})


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Blocking clients run beside the server's loop."""
    return await asyncio.to_thread(fn, *args)


@contextmanager
def connected(
    url: str, user: str = "alice", password: str | None = None, **kw: Any
) -> Iterator[BlockingConnection]:
    conn = BlockingConnection(
        url,
        user=user,
        password=USERS[user] if password is None else password,
        allowed_mechs="PLAIN",
        timeout=30,
        **kw,
    )
    try:
        yield conn
    finally:
        conn.close()


def produce(url: str, bodies: list[Any], event_type: str = "T") -> None:
    with connected(url) as conn:
        sender = conn.create_sender("events")
        for body in bodies:
            sender.send(Message(subject=event_type, body=body))


def send_outcome(sender: Any, message: Message) -> tuple[int, str | None]:
    """Send and wait for the server's outcome: (state, error condition)."""
    delivery = sender.link.send(message)
    sender.connection.wait(lambda: delivery.remote_state != 0)
    condition = delivery.remote.condition
    return delivery.remote_state, condition.name if condition is not None else None


class ReplyTarget(LinkOption):
    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: Any) -> None:
        link.target.address = self.address


def management_requests(url: str, requests: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """(application properties, body) of each reply, asked as Event Hubs clients ask."""
    with connected(url) as conn:
        sender = conn.create_sender("$management")
        receiver = conn.create_receiver("$management", credit=10, options=ReplyTarget("me-1"))
        replies = []
        for n, properties in enumerate(requests):
            request = Message(id=f"req-{n}", reply_to="me-1", properties=properties, body={})
            sender.send(request)
            reply = receiver.receive()  # settled by the server as it is sent
            assert reply.correlation_id == f"req-{n}"
            replies.append((reply.properties, reply.body))
        return replies
