"""The AMQP listener: a TCP (or TLS) server whose connections serve the event log node and the
nodes beside it (``$cbs``, ``$management``, ``$events``), through the node table it builds."""

from __future__ import annotations

import asyncio
import logging

from ..auth.sas import SasVerifier
from ..auth.users import Authenticator
from ..domain.management import CONNECTION_CLOSED, CONNECTION_OPENED, ManagementBus
from ..log.access import Access
from ..log.checkpoints import HubCheckpoints
from ..log.connections import Connections
from ..slots import AMQP_CELL, SharedCount, Slots
from .cbs import CBS, CbsNode
from .config import AmqpConfig
from .connection import AmqpConnection
from .engine.conditions import FORCED as SHUTDOWN
from .management import MANAGEMENT, ManagementNode
from .node import EventLogNode
from .notify import EVENTS_SOURCE, NotificationNode
from .table import NodeTable

logger = logging.getLogger(__name__)


class AmqpListener:
    """``await listener.start()``, then ``await listener.close()``."""

    def __init__(
        self,
        node: EventLogNode,
        authenticator: Authenticator,
        config: AmqpConfig,
        *,
        access: Access,
        sas: SasVerifier | None = None,
        notifications: NotificationNode | None = None,
        checkpoints: HubCheckpoints | None = None,
    ) -> None:
        """``access`` says who may read and write which stream (a link is refused without
        its right, and detached once it is revoked); ``sas`` checks the tokens put to
        ``$cbs`` (None: every token is refused); ``notifications`` serves ``$events`` and
        GET-EVENTS; ``checkpoints``, the Event Hubs checkpoint store at ``$management``."""
        self.node = node
        self.access = access
        event_types = notifications.event_types if notifications is not None else None
        #: Where each link goes: ``$cbs`` (before a login too), ``$management``, ``$events``
        #: and below, else the event log node.
        self.table = NodeTable(
            node,
            nodes={
                CBS: CbsNode(sas),
                MANAGEMENT: ManagementNode(node.hubs, event_types, checkpoints),
            },
            trees={EVENTS_SOURCE: notifications} if notifications is not None else {},
            public={CBS},
        )
        self.authenticator = authenticator
        self.config = config
        self._server: asyncio.Server | None = None
        limits = config.limits
        group = config.group
        #: Every open connection: in a handshake slot until it has a user (SASL PLAIN, or a
        #: token put to ``$cbs`` after SASL ANONYMOUS), then in an established one.
        self.slots: Slots[AmqpConnection] = Slots(
            "AMQP",
            limits.max_connections,
            limits.max_handshakes,
            shared=SharedCount(group, AMQP_CELL) if group is not None else None,
        )
        #: Told of connections opening and closing (management events), when set.
        self.notices: ManagementBus | None = None
        #: Where connections are listed once their user is known (the console's), when set.
        self.connections: Connections | None = None

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: AmqpConnection(self),
            self.config.host,
            self.config.port,
            ssl=self.config.tls,
            reuse_port=self.config.reuse_port or None,
        )

    @property
    def serving(self) -> bool:
        """The port accepts connections."""
        return self._server is not None and self._server.is_serving()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        scheme = "amqps" if self.config.tls is not None else "amqp"
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}"

    def opened(self, connection: AmqpConnection) -> None:
        """A new connection takes a handshake slot (an older handshake may be cut for it)."""
        self.slots.open(connection, connection.peer_name)
        if self.notices is not None:
            self.notices.publish(
                CONNECTION_OPENED, transport="amqp", peer=connection.peer_name, user=None
            )

    def forget(self, connection: AmqpConnection) -> None:
        self.slots.close(connection)
        if self.notices is not None:
            principal = connection.principal
            self.notices.publish(
                CONNECTION_CLOSED,
                transport="amqp",
                peer=connection.peer_name,
                user=principal.name if principal is not None else None,
                reason=None,
            )

    async def close(self) -> None:
        """Stop listening and close every connection with ``amqp:connection:forced``; the
        consumer groups of their links are released."""
        if self._server is not None:
            self._server.close()
        connections = list(self.slots)
        for connection in connections:
            connection.close(SHUTDOWN, "the server is shutting down")
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=5)
        await self.node.close()
        if self._server is not None:
            await self._server.wait_closed()
