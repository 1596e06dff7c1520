"""What a process hears on PostgreSQL's channel (see :mod:`.store`): heads, claims of
consumers and of AMQP consumer groups, changes of the registry and of access; its LISTEN
connection restored after a loss, and what may have gone by meanwhile read again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Final

import psycopg

from ...domain.stream import UserId
from ..base import PoolLimits
from ..errors import StoreUnavailable
from ..sql.access import ACCESS_PAYLOAD_PREFIX
from ..sql.log import SqlPartitionLog
from .connect import Connection, connect
from .schema import CHANNEL, CLAIM_PAYLOAD, GROUP_CLAIM_PAYLOAD, STREAMS_PAYLOAD_PREFIX

logger = logging.getLogger(__name__)

#: Seconds between attempts to restore a lost LISTEN connection.
RELISTEN_SECONDS: Final = 1.0


class NotificationListener:
    """The store's listener of the channel."""

    url: str
    _limits: PoolLimits
    _closing: bool
    _listener: Connection
    _logs: Mapping[int, SqlPartitionLog]
    _streams_listeners: set[Callable[[int], None]]
    _access_listeners: set[Callable[[], None]]

    async def streams_version(self) -> int:
        raise NotImplementedError

    def listen_access(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when any process changes users, grants or schemas."""
        self._access_listeners.add(callback)
        return lambda: self._access_listeners.discard(callback)

    def _notified(self, payload: str) -> None:
        if payload.startswith(CLAIM_PAYLOAD):
            self._heard_claim(payload)
            return
        if payload.startswith(GROUP_CLAIM_PAYLOAD):
            self._heard_group_claim(payload)
            return
        if payload.startswith(ACCESS_PAYLOAD_PREFIX):
            for access_callback in list(self._access_listeners):
                access_callback()
            return
        key_text, _, id_text = payload.rpartition(":")
        with contextlib.suppress(ValueError):
            if key_text == STREAMS_PAYLOAD_PREFIX[:-1]:
                for callback in list(self._streams_listeners):
                    callback(int(id_text))
                return
            partition_log = self._logs.get(int(key_text) if key_text else 0)
            if partition_log is not None:
                partition_log.head.advance(int(id_text))

    def _heard_claim(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        word, dot, key_text = kind.partition(".")
        if word != CLAIM_PAYLOAD:
            return
        with contextlib.suppress(ValueError):  # not a claim this version sends
            partition_log = self._logs.get(int(key_text) if dot else 0)
            user_id, epoch, component = rest.split(" ", 2)
            if partition_log is not None:  # else no stream here holds it
                partition_log.claims.claimed(UserId(int(user_id)), component, int(epoch))

    def _heard_group_claim(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        word, dot, key_text = kind.partition(".")
        if word != GROUP_CLAIM_PAYLOAD:
            return
        with contextlib.suppress(ValueError):  # not a group claim this version sends
            partition_log = self._logs.get(int(key_text) if dot else 0)
            user_id, claim, epoch, group = rest.split(" ", 3)
            if partition_log is not None:  # else no link here holds it
                partition_log.claims.group_claimed(
                    UserId(int(user_id)), group, int(claim), int(epoch)
                )

    async def _listen(self) -> None:
        while not self._closing:
            try:
                async for notify in self._listener.notifies():
                    self._notified(notify.payload)
            except psycopg.Error as exc:
                if self._closing:
                    return
                logger.warning("lost the notification connection: %s", exc)
            await asyncio.sleep(RELISTEN_SECONDS)
            with contextlib.suppress(StoreUnavailable, psycopg.Error):
                await self._listener.close()
                self._listener = await connect(
                    self.url, autocommit=True, link_timeout=self._limits.link_timeout
                )
                await self._listener.execute(f"LISTEN {CHANNEL}")
                for partition_log in list(self._logs.values()):
                    partition_log.head.advance(await partition_log.newest_event_id())
                version = await self.streams_version()
                for callback in list(self._streams_listeners):
                    callback(version)
                for access_callback in list(self._access_listeners):
                    access_callback()  # a change may have gone by meanwhile
