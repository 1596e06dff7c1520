"""A listener's connection slots: sockets still in their handshake have a budget of their own.

A socket takes a *handshake* slot when it opens. When a new socket finds every handshake slot
taken, the oldest unfinished handshake is cut to make room, and so is the oldest one of the
same peer address when that address holds ``per_address`` of them already (IPv6: per /64).
Peers that never finish their handshake (slowloris) only ever displace one another, and a
client that finishes its handshake soon after connecting gets through however many of them
keep arriving.

A finished handshake moves the socket to an *established* slot, of which there are
``max_established``; past that the door refuses it in its own way (HTTP 503, SASL sys-temp).
Established sockets are never cut to make room. A socket frees exactly its one slot when it
closes, at whatever stage.

Refusals and evictions are logged as warnings at most every 10 seconds, with their counts.

The limits are the server's, however many workers (``serve --workers N``) share the port. The
handshake budget and the cap per address are split evenly between the workers (rounded up):
the kernel spreads new sockets evenly too, and a handshake slot is cut locally. Established
slots are counted in a :class:`SharedCount`, one cell per worker in a file all of them map:
a worker admits a connection while the cells add up to less than the limit. Reading them is a
few memory loads, with no lock and no message; two workers that admit at the same moment may
each take the last slot, so the server may hold one connection more per other worker.
"""

from __future__ import annotations

import ipaddress
import logging
import mmap
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

TOO_MANY_CONNECTIONS: Final = "too many connections"
#: A connection closed by the server while its peer is still sending reads and drops up to
#: this much more (within a few seconds) before it is cut: a socket closed with input unread
#: is reset by the kernel, and the peer would get the reset instead of the server's last word.
LINGER_BYTES: Final = 8 * 1024 * 1024
LINGER_SECONDS: Final = 5.0


class HalfClosable(Protocol):
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def half_close(transport: HalfClosable) -> bool:
    """Send EOF once what is written has gone, and keep reading: True when the caller is now
    to drop the peer's input (up to ``LINGER_BYTES``) until it closes too. False when the
    transport was closed instead (TLS has no half-close) or cut (the peer is gone already)."""
    if not transport.can_write_eof():
        transport.close()
        return False
    try:
        transport.write_eof()
    except OSError:
        transport.abort()
        return False
    return True


#: The default handshake budget is this fraction of the connection limit ...
HANDSHAKE_FRACTION: Final = 4
#: ... but at least this many.
MIN_HANDSHAKES: Final = 8
#: The default cap per address is this fraction of the handshake budget ...
ADDRESS_FRACTION: Final = 8
#: ... but at least this many (or the whole budget when it is smaller).
MIN_PER_ADDRESS: Final = 4


class Socket(Protocol):
    def abort(self) -> None:
        """Close at once, without waiting for anything to be sent."""


S = TypeVar("S", bound=Socket)


def default_handshakes(max_connections: int) -> int:
    """The handshake budget when none is configured."""
    return max(max_connections // HANDSHAKE_FRACTION, MIN_HANDSHAKES)


def address_of(peer: str) -> str:
    """What the per-address cap counts by: the host of ``host:port``, an IPv6 host's /64."""
    host = peer.rpartition(":")[0].strip("[]") or peer
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return host


class RateLimitedWarning:
    """A warning at most every ``interval`` seconds, with the count since the last one, so
    that a flood of peers cannot flood the log. ``template`` takes the count, then the
    peer."""

    def __init__(self, template: str, interval: float = 10.0) -> None:
        self._template = template
        self._interval = interval
        self._next = 0.0
        self._count = 0

    def note(self, peer: str) -> None:
        self._count += 1
        now = time.monotonic()
        if now >= self._next:
            logger.warning(self._template, self._count, peer)
            self._count = 0
            self._next = now + self._interval


#: The file of a group's established counts, in its private directory.
COUNTS_FILE: Final = "connections"
#: The cell of each door in a worker's line of that file.
WEBSOCKET_CELL: Final = 0
AMQP_CELL: Final = 1
KAFKA_CELL: Final = 2
#: A worker's line: 8 cells of 8 bytes, a cache line, so that no two workers write one line.
_CELLS_PER_WORKER: Final = 8
_LINE_BYTES: Final = _CELLS_PER_WORKER * 8


def create_counts(path: Path, workers: int) -> None:
    """The count file of a group of ``workers``, every cell 0 (before the workers start)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, workers * _LINE_BYTES)
    finally:
        os.close(fd)


def clear_counts(path: Path, slot: int) -> None:
    """Worker ``slot`` has exited: its connections are gone, and so are its counts."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.pwrite(fd, bytes(_LINE_BYTES), slot * _LINE_BYTES)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class GroupShare:
    """This server is worker ``slot`` of ``workers``, whose connections are counted together in
    ``counts`` (made by :func:`create_counts`): the limits are the whole group's."""

    counts: Path
    slot: int
    workers: int


class SharedCount:
    """One door's established connections in every worker of a group: each worker writes its
    own cell of the mapped count file, and reads them all to admit a connection."""

    def __init__(self, share: GroupShare, cell: int) -> None:
        self.workers = share.workers
        self._slot = share.slot
        fd = os.open(share.counts, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, share.workers * _LINE_BYTES)
        finally:
            os.close(fd)
        #: Every worker's cell of this door.
        self._cells = memoryview(self._map).cast("q")[cell::_CELLS_PER_WORKER]
        self.set(0)

    def set(self, count: int) -> None:
        """This worker holds ``count`` established connections now."""
        self._cells[self._slot] = count

    def total(self) -> int:
        """The established connections of every worker, as they last wrote them."""
        return sum(self._cells)


class Slots(Generic[S]):
    """The slots of one listener (see the module's docstring); ``shared``: the count of the
    group this worker belongs to, whose limits these are."""

    def __init__(
        self,
        door: str,
        max_established: int,
        max_handshakes: int | None = None,
        per_address: int | None = None,
        shared: SharedCount | None = None,
    ) -> None:
        self.max_established = max_established
        budget = default_handshakes(max_established) if max_handshakes is None else max_handshakes
        if per_address is None:
            per_address = max(budget // ADDRESS_FRACTION, MIN_PER_ADDRESS)
        workers = 1 if shared is None else shared.workers
        #: This worker's share of the server's handshake budget and of its cap per address.
        self.max_handshakes = -(-budget // workers)
        self.per_address = -(-min(per_address, budget) // workers)
        self._shared = shared
        #: Unfinished handshakes, oldest first, with their peers and addresses.
        self._handshakes: OrderedDict[S, tuple[str, str]] = OrderedDict()
        #: The unfinished handshakes of each address, oldest first.
        self._by_address: dict[str, dict[S, None]] = {}
        self._established: set[S] = set()
        self._watchers: set[Callable[[], None]] = set()
        #: Established sockets refused at the limit, handshakes cut to make room (metrics).
        self.refused = 0
        self.evicted = 0
        self._refusals = RateLimitedWarning(
            f"{door}: refused %d connection(s) at the limit, the last from %s"
        )
        self._evictions = RateLimitedWarning(
            f"{door}: closed %d unfinished handshake(s) to make room, the last from %s"
        )

    @property
    def handshakes(self) -> int:
        return len(self._handshakes)

    @property
    def established(self) -> int:
        return len(self._established)

    def established_sockets(self) -> list[S]:
        """The sockets past their handshake (a copy)."""
        return list(self._established)

    def __len__(self) -> int:
        return len(self._handshakes) + len(self._established)

    def __iter__(self) -> Iterator[S]:
        """Every socket that holds a slot (a copy: closing them while iterating is fine)."""
        return iter([*self._handshakes, *self._established])

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after every change of the counts; returns what stops it."""
        self._watchers.add(callback)
        return lambda: self._watchers.discard(callback)

    def _changed(self) -> None:
        for callback in list(self._watchers):
            callback()

    def open(self, socket: S, peer: str) -> None:
        """A new socket takes a handshake slot, cutting an older handshake if it must."""
        address = address_of(peer)
        same_address = self._by_address.setdefault(address, {})
        if len(same_address) >= self.per_address:
            self._evict(next(iter(same_address)))
        if len(self._handshakes) >= self.max_handshakes and self._handshakes:
            self._evict(next(iter(self._handshakes)))
        self._handshakes[socket] = (peer, address)
        self._by_address.setdefault(address, {})[socket] = None
        if self._watchers:
            self._changed()

    def establish(self, socket: S) -> bool:
        """The socket finished its handshake: True when it holds an established slot now (or
        did already); False when they are all taken (the door refuses it, and it keeps its
        handshake slot until it closes)."""
        if socket in self._established:
            return True
        if socket not in self._handshakes:
            return False  # cut already, and closing
        shared = self._shared
        held = len(self._established) if shared is None else shared.total()
        if held >= self.max_established:
            self.refused += 1
            self._refusals.note(self._handshakes[socket][0])
            return False
        self._forget_handshake(socket)
        self._established.add(socket)
        if shared is not None:
            shared.set(len(self._established))
        if self._watchers:
            self._changed()
        return True

    def close(self, socket: S) -> None:
        """The socket is gone: its slot, whichever it was, is free (again calls do nothing)."""
        if socket in self._established:
            self._established.remove(socket)
            if self._shared is not None:
                self._shared.set(len(self._established))
        elif socket in self._handshakes:
            self._forget_handshake(socket)
        else:
            return
        if self._watchers:
            self._changed()

    def _evict(self, socket: S) -> None:
        self.evicted += 1
        self._evictions.note(self._forget_handshake(socket))
        socket.abort()
        if self._watchers:
            self._changed()

    def _forget_handshake(self, socket: S) -> str:
        """Free the socket's handshake slot; returns its peer."""
        peer, address = self._handshakes.pop(socket)
        same_address = self._by_address[address]
        del same_address[socket]
        if not same_address:
            del self._by_address[address]
        return peer
