"""The brokers clients are told of: each ``serve`` process on a shared database is one, under a
node id it keeps while it lives (the workers of ``serve --workers`` share their address, so
they are one broker). Each renews its lease in the database every :data:`RENEW_SECONDS`; one
whose lease of :data:`LEASE_SECONDS` ran out is not listed any more. Any broker answers
Produce and Fetch for any partition; leadership is only spread over the live brokers so that
clients spread their connections. Without the database, this process is the one broker,
node 0.

Each broker also forgets, every :data:`FORGET_EVERY_SECONDS`, what the door keeps in the
database and nobody changed for :data:`IDLE_SECONDS`: idempotent producers' last batches
(their producers are gone, as Kafka expires producer ids) and groups (without members: a
member's session is an hour at most; their offsets are kept apart, as consumers')."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable
from typing import Final

from ..log.kafka import KafkaShared

logger = logging.getLogger(__name__)

#: Seconds between renewals of the lease, and the lease.
RENEW_SECONDS: Final = 3.0
LEASE_SECONDS: Final = 10.0
IDLE_SECONDS: Final = 7 * 86400.0
FORGET_EVERY_SECONDS: Final = 3600.0
#: This process's node id without a database to share.
ALONE: Final = 0


class Brokers:
    """This broker's node id and the live brokers, renewed while :meth:`start`-ed; ``keep_row``:
    leave the row to its lease on :meth:`close` (other workers answer at the same address)."""

    def __init__(
        self,
        address: Callable[[], tuple[str, int]],
        shared: KafkaShared | None = None,
        *,
        keep_row: bool = False,
    ) -> None:
        self._address = address
        self._shared = shared
        self._keep_row = keep_row
        self.node_id = ALONE
        #: (node id, host, port) of each live broker, by node id; this one among them.
        self._live: list[tuple[int, str, int]] = []
        self._renewing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register (once the address is known) and renew from now on."""
        if self._shared is None:
            return
        host, port = self._address()
        self.node_id = await self._shared.register_broker(host, port, LEASE_SECONDS)
        await self._renew()
        self._renewing = asyncio.get_running_loop().create_task(self._renew_rounds())

    async def close(self) -> None:
        if self._renewing is None:
            return
        self._renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._renewing
        self._renewing = None
        if self._shared is not None and not self._keep_row:
            try:
                await self._shared.drop_broker(self.node_id)
            except Exception as exc:  # its lease runs out all the same
                logger.warning("the Kafka broker %d stays listed until its lease ends: %s",
                               self.node_id, exc)  # fmt: skip

    def live(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of each live broker, by node id (this one at least)."""
        host, port = self._address()
        if not any(node == self.node_id for node, _, _ in self._live):
            return sorted([*self._live, (self.node_id, host, port)])
        return self._live

    def leader(self, topic: str, partition: int) -> int:
        """The node id that leads the topic's partition (stable while the brokers are)."""
        live = self.live()
        return live[(zlib.crc32(topic.encode()) + partition) % len(live)][0]

    async def _renew(self) -> None:
        assert self._shared is not None
        host, port = self._address()
        live = await self._shared.renew_broker(self.node_id, host, port, LEASE_SECONDS)
        if live is None:  # the row went (a pause longer than the lease): under a new id
            self.node_id = await self._shared.register_broker(host, port, LEASE_SECONDS)
            live = await self._shared.renew_broker(self.node_id, host, port, LEASE_SECONDS)
        self._live = live or []

    async def _renew_rounds(self) -> None:
        assert self._shared is not None
        loop = asyncio.get_running_loop()
        forget_at = loop.time()
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            try:
                await self._renew()
            except Exception as exc:  # the next round tries again
                logger.warning("the Kafka broker %d could not renew its lease: %s",
                               self.node_id, exc)  # fmt: skip
                continue
            if loop.time() >= forget_at:
                forget_at = loop.time() + FORGET_EVERY_SECONDS
                try:
                    await self._shared.forget_idle(IDLE_SECONDS)
                except Exception as exc:  # in an hour again
                    logger.warning("idle Kafka producers and groups stay: %s", exc)
