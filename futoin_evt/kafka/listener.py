"""The Kafka listener: a TCP (or TLS) server whose connections the broker answers."""

from __future__ import annotations

import asyncio
import logging

from ..auth.sasl_logins import ConnectionStringLogins, ScramLogins
from ..auth.users import Authenticator
from ..domain.management import CONNECTION_CLOSED, CONNECTION_OPENED, ManagementBus
from ..log.kafka import KafkaShared
from ..log.streams import StreamLogs, StreamRegistry
from ..slots import KAFKA_CELL, SharedCount, Slots
from .broker import Broker, SchemaTypeOf
from .config import KafkaConfig
from .connection import KafkaConnection
from .coordinator import GroupCoordinator
from .shared_groups import LocalGroups, SharedGroups

logger = logging.getLogger(__name__)


class KafkaListener:
    """``await listener.start()``, then ``await listener.close()``."""

    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        authenticator: Authenticator,
        config: KafkaConfig,
        schemas: SchemaTypeOf | None = None,
        shared: KafkaShared | None = None,
    ) -> None:
        """``shared``: what the processes on the database share (without it: this process
        keeps the door's state on its own)."""
        self.config = config
        self.authenticator = authenticator
        #: SCRAM logins and Event Hubs connection strings (None: not taken), as the server
        #: sets them.
        self.scram: ScramLogins | None = None
        self.connection_strings: ConnectionStringLogins | None = None
        self.broker = Broker(
            logs,
            streams,
            SharedGroups(shared) if shared is not None else LocalGroups(GroupCoordinator()),
            config,
            self.advertised,
            schemas=schemas,
            shared=shared,
        )
        self._server: asyncio.Server | None = None
        limits = config.limits
        group = config.group
        #: Every open connection: in a handshake slot until its SASL login, then in an
        #: established one.
        self.slots: Slots[KafkaConnection] = Slots(
            "Kafka",
            limits.max_connections,
            limits.max_handshakes,
            shared=SharedCount(group, KAFKA_CELL) if group is not None else None,
        )
        #: Told of connections opening and closing (management events), when set.
        self.notices: ManagementBus | None = None

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: KafkaConnection(self),
            self.config.host,
            self.config.port,
            ssl=self.config.tls,
            reuse_port=self.config.reuse_port or None,
        )
        try:
            await self.broker.start()
        except BaseException:
            self._server.close()
            raise

    @property
    def serving(self) -> bool:
        """The port accepts connections."""
        return self._server is not None and self._server.is_serving()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def advertised(self) -> tuple[str, int]:
        """Where clients are told to connect: ``--kafka-advertise``, else the listening
        address."""
        if self.config.advertise is not None:
            return self.config.advertise
        return self.config.host, self.port

    @property
    def url(self) -> str:
        host, port = self.config.host, self.port
        if ":" in host:
            host = f"[{host}]"
        return f"kafka://{host}:{port}"

    def opened(self, connection: KafkaConnection) -> None:
        self.slots.open(connection, connection.peer)
        if self.notices is not None:
            self.notices.publish(
                CONNECTION_OPENED, transport="kafka", peer=connection.peer, user=None
            )

    def logged_in(self, connection: KafkaConnection) -> None:
        """A connection logged in (it holds an established slot now)."""

    def forget(self, connection: KafkaConnection) -> None:
        self.slots.close(connection)
        if self.notices is not None:
            principal = connection.principal
            self.notices.publish(
                CONNECTION_CLOSED,
                transport="kafka",
                peer=connection.peer,
                user=principal.name if principal is not None else None,
                reason=None,
            )

    async def close(self) -> None:
        """Stop listening and close every connection; pending group joins are answered
        COORDINATOR_NOT_AVAILABLE."""
        if self._server is not None:
            self._server.close()
        await self.broker.close()
        connections = list(self.slots)
        for connection in connections:
            connection.close()
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
