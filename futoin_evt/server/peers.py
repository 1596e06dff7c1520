"""The in-machine channel between the worker processes of one server (``serve --workers``).

Each worker binds a Unix datagram socket in the group's private directory (made by the
supervisor, mode 0700), named after its slot, and sends to the others through sockets
connected to theirs. No polling: a datagram wakes the peer's event loop at once.

What goes over it, one line each, every line queued in one loop turn in one datagram:

- ``h KEY HEAD``: events up to ``HEAD`` of partition ``KEY`` are committed (the newest only);
- ``c KEY USER EPOCH "COMPONENT"``: a push stream claimed a consumer;
- ``s``: a stream was added, grown or dropped;
- ``m JSON``: a management event, ``[type, ts, attributes]``, for the peer's subscribers.

The first three are the news the database does not carry between processes
(:class:`~futoin_evt.storage.base.PeerNews`; PostgreSQL's own channel does). A peer whose
queue is full (the kernel holds a few datagrams per socket) gets the rest once its socket
polls writable again, heads and claims merged meanwhile. A peer that is gone (restarting)
loses what was meant for it: a new worker reads the heads from the database when it starts,
and a claim it missed is still fenced by the epoch at the next acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..domain.stream import UserId
from ..notify.management import ManagementBus, management_attributes, management_notification
from ..notify.message import Notification
from ..storage.base import PeerNews

log = logging.getLogger(__name__)

#: Bytes of lines per datagram (far below the socket buffer).
DATAGRAM_BYTES: Final = 32 * 1024
#: Management events kept for a peer that does not read; older ones are dropped.
MAX_PENDING_LINES: Final = 1000


@dataclass(frozen=True, slots=True)
class WorkerPlace:
    """This server is worker ``slot`` (from 0) of ``count`` in one group."""

    slot: int
    count: int
    #: The group's private directory, where the channel's sockets are.
    channel_dir: Path
    #: The supervisor's process id.
    supervisor: int = 0

    def socket_path(self, slot: int) -> str:
        return str(self.channel_dir / f"w{slot}.sock")


@dataclass(slots=True)
class _Peer:
    path: str
    sock: socket.socket | None = None
    heads: dict[int, int] = field(default_factory=dict)
    claims: dict[tuple[int, UserId, str], int] = field(default_factory=dict)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_LINES))
    #: Datagrams built but not taken yet (the peer's queue was full).
    unsent: deque[bytes] = field(default_factory=deque)

    def take_lines(self) -> list[str]:
        lines = [f"h {key} {head}" for key, head in self.heads.items()]
        lines += [
            f"c {key} {user} {epoch} {json.dumps(name)}"
            for (key, user, name), epoch in self.claims.items()
        ]
        lines += self.lines
        self.heads.clear()
        self.claims.clear()
        self.lines.clear()
        return lines

    def drop(self) -> None:
        """The peer is gone: what was meant for it is of no use to its successor."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.heads.clear()
        self.claims.clear()
        self.lines.clear()
        self.unsent.clear()


def _datagrams(lines: list[str]) -> list[bytes]:
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        data = line.encode()
        if chunk and size + len(data) + 1 > DATAGRAM_BYTES:
            out.append(b"\n".join(chunk))
            chunk, size = [], 0
        chunk.append(data)
        size += len(data) + 1
    if chunk:
        out.append(b"\n".join(chunk))
    return out


class PeerChannel:
    """This worker's end of the channel; as :class:`PeerNews`, what it tells the others.

    Bind it (the constructor does) before reading anything from the database, so nothing
    committed after that read goes unheard; :meth:`listen` once the store is open.
    """

    def __init__(self, place: WorkerPlace) -> None:
        self.place = place
        path = place.socket_path(place.slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this slot's previous worker
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._sock.bind(path)
        self._peers = [
            _Peer(place.socket_path(slot)) for slot in range(place.count) if slot != place.slot
        ]
        self._loop = asyncio.get_running_loop()
        self._flushing = False
        self._heard: PeerNews | None = None
        self._bus: ManagementBus | None = None
        self._closed = False

    def listen(self, heard: PeerNews | None, bus: ManagementBus) -> None:
        """Apply the news of the others to ``heard`` (the store's side) and ``bus``."""
        self._heard = heard
        self._bus = bus
        self._loop.add_reader(self._sock.fileno(), self._receive)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        for peer in self._peers:
            if peer.sock is not None:
                self._loop.remove_writer(peer.sock.fileno())
            peer.drop()
        self._sock.close()

    # -- telling the others (PeerNews, and management events) ---------------------------------

    def committed(self, key: int, head: int) -> None:
        for peer in self._peers:
            if peer.heads.get(key, 0) < head:
                peer.heads[key] = head
        self._soon()

    def claimed(self, key: int, user_id: UserId, component: str, epoch: int) -> None:
        for peer in self._peers:
            peer.claims[(key, user_id, component)] = epoch
        self._soon()

    def streams_changed(self) -> None:
        self._add_line("s")

    def management(self, notification: Notification) -> None:
        """A management event published here, for the others' subscribers."""
        attributes = management_attributes(notification)
        self._add_line("m " + json.dumps([notification.type, notification.ts, attributes]))

    def _add_line(self, line: str) -> None:
        for peer in self._peers:
            peer.lines.append(line)
        self._soon()

    def _soon(self) -> None:
        if not self._flushing and not self._closed:
            self._flushing = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._closed:
            return
        for peer in self._peers:
            if not peer.unsent:  # else it waits for the peer's socket to poll writable
                self._send(peer)

    def _send(self, peer: _Peer) -> None:
        if peer.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            try:
                sock.connect(peer.path)
            except OSError:  # not started yet, or restarting
                sock.close()
                peer.drop()
                return
            peer.sock = sock
        peer.unsent.extend(_datagrams(peer.take_lines()))
        while peer.unsent:
            try:
                peer.sock.send(peer.unsent[0])
            except BlockingIOError:
                self._loop.add_writer(peer.sock.fileno(), self._writable, peer)
                return
            except OSError:  # the peer is gone (ECONNREFUSED): its successor starts afresh
                peer.drop()
                return
            peer.unsent.popleft()

    def _writable(self, peer: _Peer) -> None:
        if peer.sock is not None:
            self._loop.remove_writer(peer.sock.fileno())
        self._send(peer)

    # -- hearing the others -------------------------------------------------------------------

    def _receive(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("reading the workers' channel failed: %s", exc)
                return
            for line in data.decode().split("\n"):
                try:
                    self._apply(line)
                except (ValueError, TypeError, KeyError, IndexError) as exc:
                    log.warning("a bad line on the workers' channel: %r (%s)", line[:200], exc)

    def _apply(self, line: str) -> None:
        kind = line[:1]
        heard = self._heard
        if kind == "h":
            if heard is not None:
                _, key, head = line.split(" ")
                heard.committed(int(key), int(head))
        elif kind == "c":
            if heard is not None:
                _, key, user, epoch, component = line.split(" ", 4)
                heard.claimed(int(key), UserId(int(user)), str(json.loads(component)), int(epoch))
        elif kind == "s":
            if heard is not None:
                heard.streams_changed()
        elif kind == "m":
            event_type, ts, attributes = json.loads(line[2:])
            if self._bus is not None:
                self._bus.deliver(
                    management_notification(str(event_type), str(ts), dict(attributes))
                )
        else:
            raise ValueError("unknown kind")
