"""The in-machine channel between the worker processes of one server (``serve --workers``).

Each worker binds a Unix datagram socket in the group's private directory (made by the
supervisor, mode 0700), named after its slot, and sends to the others through sockets
connected to theirs. No polling: a datagram wakes the peer's event loop at once.

What goes over it, one line each, every line queued in one loop turn in one datagram:

- ``h KEY HEAD``: events up to ``HEAD`` of partition ``KEY`` are committed (the newest only);
- ``c KEY USER EPOCH "COMPONENT"``: a push stream claimed a consumer;
- ``g KEY USER CLAIM EPOCH "GROUP"``: an AMQP link took a consumer group;
- ``s``: a stream was added, grown or dropped;
- ``m JSON``: a management event, ``[type, ts, attributes]``, for the peer's subscribers;
- ``p SLOT 1|0 KEY USER "COMPONENT"``: worker ``SLOT`` holds (1) or no longer holds (0) the
  reliable push stream of that consumer (``listConsumers`` shows it connected on every worker);
- ``x KEY USER "COMPONENT"``: stop that push stream (an operator's seek or drop);
- ``r SLOT``: worker ``SLOT`` (re)started: forget what it held, and tell it what you hold;
- ``a SLOT SEQ``: grants changed (through the ops iface) on worker ``SLOT``: reload them now,
  not at the next poll, and answer ``A SLOT SEQ`` (naming yourself) once they are in use, so
  that the change's call returns once every worker checks calls against it;
- ``q SLOT SEQ KEY``: worker ``SLOT`` asks the discarding worker (:data:`DISCARDING_SLOT`)
  what it discarded and expired on partition ``KEY``, answered by ``Q SEQ JSON``
  (``[discarded, [[user, component], ...]]``): ``streamInfo`` is the server's on every worker.

The first four are the news the database does not carry between processes
(:class:`~futoin_evt.storage.base.PeerNews`; PostgreSQL's own channel does). A peer whose
queue is full (the kernel holds a few datagrams per socket) gets the rest once its socket
polls writable again, heads and claims merged meanwhile. A peer that is gone (restarting)
loses what was meant for it: a new worker reads the heads from the database when it starts,
and a claim it missed is still fenced by the epoch (a group's by its claim number) at the
next acknowledgement; its ``r`` brings it the others' push streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..domain.management import ManagementBus, management_attributes, management_notification
from ..domain.notification import Notification
from ..domain.partition import Partition
from ..domain.stream import UserId
from ..ftn18.push import PushService, StreamKey
from ..log.retention import Discarder, DiscardRecord
from ..storage.base import PeerNews

logger = logging.getLogger(__name__)

#: Bytes of lines per datagram (far below the socket buffer).
DATAGRAM_BYTES: Final = 32 * 1024
#: Management events kept for a peer that does not read; older ones are dropped.
MAX_PENDING_LINES: Final = 1000
#: The longest a change of grants waits for the other workers to have it in use (one that
#: does not answer, restarting say, reads the grants when it starts or at its next reload).
GRANTS_WAIT_SECONDS: Final = 5.0
#: The worker that discards and expires consumers; the others ask it what it did.
DISCARDING_SLOT: Final = 0
#: The longest a worker waits for the discarding worker's record (then it answers alone).
RECORD_WAIT_SECONDS: Final = 5.0


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
    #: Consumer groups taken: (claim, epoch) of the newest claim.
    group_claims: dict[tuple[int, UserId, str], tuple[int, int]] = field(default_factory=dict)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_LINES))
    #: Push streams of this worker that started (True) or ended (False), the newest only.
    pushes: dict[StreamKey, bool] = field(default_factory=dict)
    #: Datagrams built but not taken yet (the peer's queue was full).
    unsent: deque[bytes] = field(default_factory=deque)

    def take_lines(self, slot: int) -> list[str]:
        lines = [f"h {key} {head}" for key, head in self.heads.items()]
        lines += [
            f"c {key} {user} {epoch} {json.dumps(name)}"
            for (key, user, name), epoch in self.claims.items()
        ]
        lines += [
            f"g {key} {user} {claim} {epoch} {json.dumps(group)}"
            for (key, user, group), (claim, epoch) in self.group_claims.items()
        ]
        lines += self.lines
        lines += [
            f"p {slot} {int(held)} {key} {user} {json.dumps(name)}"
            for (key, user, name), held in self.pushes.items()
        ]
        self.heads.clear()
        self.claims.clear()
        self.group_claims.clear()
        self.lines.clear()
        self.pushes.clear()
        return lines

    def drop(self) -> None:
        """The peer is gone: what was meant for it is of no use to its successor."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.heads.clear()
        self.claims.clear()
        self.group_claims.clear()
        self.lines.clear()
        self.pushes.clear()
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
        self._by_slot = {
            slot: _Peer(place.socket_path(slot))
            for slot in range(place.count)
            if slot != place.slot
        }
        self._peers = list(self._by_slot.values())
        self._loop = asyncio.get_running_loop()
        self._flushing = False
        self._heard: PeerNews | None = None
        self._bus: ManagementBus | None = None
        self._closed = False
        self._push: PushService | None = None
        self._grants_changed: Callable[[], Awaitable[None]] | None = None
        #: Changes of grants made here: sequence -> (done once in use elsewhere, the slots
        #: yet to say so, the timer that gives up on them).
        self._grant_waits: dict[int, tuple[asyncio.Future[None], set[int], asyncio.TimerHandle]]
        self._grant_waits = {}
        self._grant_seqs = itertools.count(1)
        self._reloads: set[asyncio.Task[None]] = set()
        #: This worker's reliable push streams as last told to the others.
        self._told: set[StreamKey] = set()
        self._pushes_changed = False
        #: The reliable push streams of the others, by their slot.
        self._elsewhere: dict[int, set[StreamKey]] = {}
        self._discarder: Discarder | None = None
        #: Records asked of the discarding worker: sequence -> the answer (None: none came).
        self._records: dict[int, asyncio.Future[DiscardRecord | None]] = {}
        self._record_seqs = itertools.count(1)

    def listen(self, heard: PeerNews | None, bus: ManagementBus) -> None:
        """Apply the news of the others to ``heard`` (the store's side) and ``bus``."""
        self._heard = heard
        self._bus = bus
        self._loop.add_reader(self._sock.fileno(), self._receive)
        self._add_line(f"r {self.place.slot}")

    def serve_access(self, on_changed: Callable[[], Awaitable[None]]) -> None:
        """Await ``on_changed()`` when another worker says grants (or schemas) changed (it
        returns once they are in use), then tell that worker."""
        self._grants_changed = on_changed

    def grants_changed(self) -> asyncio.Future[None]:
        """Grants (or schemas) changed here: the others reload theirs. The future is done
        once each has them in use, is gone, or :data:`GRANTS_WAIT_SECONDS` have passed."""
        seq = next(self._grant_seqs)
        done: asyncio.Future[None] = self._loop.create_future()
        waiting = set(self._by_slot)
        timer = self._loop.call_later(GRANTS_WAIT_SECONDS, self._grants_in_use, seq, None)
        self._grant_waits[seq] = (done, waiting, timer)
        self._add_line(f"a {self.place.slot} {seq}")
        return done

    def _grants_in_use(self, seq: int, slot: int | None) -> None:
        """Worker ``slot`` has the change ``seq`` in use, or is gone (None: stop waiting)."""
        wait = self._grant_waits.get(seq)
        if wait is None:
            return
        done, waiting, timer = wait
        if slot is not None:
            waiting.discard(slot)
        if slot is None or not waiting:
            del self._grant_waits[seq]
            timer.cancel()
            if not done.done():
                done.set_result(None)

    def _reload_grants(self, slot: int, seq: int) -> None:
        """Another worker changed grants: use them, then tell it."""
        changed = self._grants_changed
        reload = asyncio.ensure_future(changed() if changed is not None else asyncio.sleep(0))
        self._reloads.add(reload)

        def answer(task: asyncio.Future[None]) -> None:
            self._reloads.discard(reload)
            if not task.cancelled() and task.exception() is None and not self._closed:
                peer = self._by_slot.get(slot)
                if peer is not None:
                    peer.lines.append(f"A {self.place.slot} {seq}")
                    self._soon()

        reload.add_done_callback(answer)

    def serve_retention(self, discarder: Discarder) -> None:
        """Answer the others' questions of ``discarder``'s record on the discarding worker;
        on the others, make ``discarder`` ask it."""
        self._discarder = discarder
        if self.place.slot != DISCARDING_SLOT:
            discarder.peers = self

    async def record_of(self, partition: Partition) -> DiscardRecord | None:
        """What the discarding worker discarded and expired on ``partition``; None when it
        does not answer within :data:`RECORD_WAIT_SECONDS` or is gone (restarting)."""
        peer = self._by_slot.get(DISCARDING_SLOT)
        if peer is None or self._closed:
            return None
        seq = next(self._record_seqs)
        answer: asyncio.Future[DiscardRecord | None] = self._loop.create_future()
        self._records[seq] = answer
        peer.lines.append(f"q {self.place.slot} {seq} {partition.key}")
        self._soon()
        try:
            async with asyncio.timeout(RECORD_WAIT_SECONDS):
                return await answer
        except TimeoutError:
            return None
        finally:
            self._records.pop(seq, None)

    def _answer_records(self, record: DiscardRecord | None, seq: int | None = None) -> None:
        """Give the question ``seq`` (None: every one still waiting) its answer."""
        for waiting in list(self._records) if seq is None else [seq]:
            answer = self._records.get(waiting)
            if answer is not None and not answer.done():
                answer.set_result(record)

    def serve_push(self, push: PushService) -> None:
        """Tell the others of ``push``'s reliable streams, and it of theirs."""
        self._push = push
        push.peers = self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        for seq in list(self._grant_waits):
            self._grants_in_use(seq, None)
        self._answer_records(None)
        for reload in self._reloads:
            reload.cancel()
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

    def group_claimed(self, key: int, user_id: UserId, group: str, claim: int, epoch: int) -> None:
        for peer in self._peers:
            known = peer.group_claims.get((key, user_id, group))
            if known is None or known[0] < claim:
                peer.group_claims[(key, user_id, group)] = (claim, epoch)
        self._soon()

    def streams_changed(self) -> None:
        self._add_line("s")

    def management(self, notification: Notification) -> None:
        """A management event published here, for the others' subscribers."""
        attributes = management_attributes(notification)
        self._add_line("m " + json.dumps([notification.type, notification.ts, attributes]))

    def pushes_changed(self) -> None:
        self._pushes_changed = True
        self._soon()

    def pushing_elsewhere(self) -> set[StreamKey]:
        return set().union(*self._elsewhere.values())

    def stop_elsewhere(self, key: StreamKey) -> None:
        partition_key, user_id, component = key
        self._add_line(f"x {partition_key} {user_id} {json.dumps(component)}")

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
        if self._pushes_changed and self._push is not None:
            self._pushes_changed = False
            now = self._push.reliable_keys()
            changes = dict.fromkeys(now - self._told, True) | dict.fromkeys(self._told - now, False)
            self._told = now
            for peer in self._peers:
                peer.pushes.update(changes)
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
                self._forget(peer)
                return
            peer.sock = sock
        peer.unsent.extend(_datagrams(peer.take_lines(self.place.slot)))
        while peer.unsent:
            try:
                peer.sock.send(peer.unsent[0])
            except BlockingIOError:
                self._loop.add_writer(peer.sock.fileno(), self._writable, peer)
                return
            except OSError:  # the peer is gone (ECONNREFUSED): its successor starts afresh
                peer.drop()
                self._forget(peer)
                return
            peer.unsent.popleft()

    def _forget(self, gone: _Peer) -> None:
        """``gone`` holds no push streams any more (its successor tells what it holds), and
        will not answer for grants (its successor reads them when it starts)."""
        for slot, peer in self._by_slot.items():
            if peer is gone:
                self._elsewhere.pop(slot, None)
                for seq in list(self._grant_waits):
                    self._grants_in_use(seq, slot)
                if slot == DISCARDING_SLOT:
                    self._answer_records(None)

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
                logger.debug("reading the workers' channel failed: %s", exc)
                return
            for line in data.decode().split("\n"):
                try:
                    self._apply(line)
                except (ValueError, TypeError, KeyError, IndexError) as exc:
                    logger.warning("a bad line on the workers' channel: %r (%s)", line[:200], exc)

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
        elif kind == "g":
            if heard is not None:
                _, key, user, claim, epoch, group = line.split(" ", 5)
                heard.group_claimed(
                    int(key), UserId(int(user)), str(json.loads(group)), int(claim), int(epoch)
                )
        elif kind == "s":
            if heard is not None:
                heard.streams_changed()
        elif kind == "p":
            _, slot, held, key, user, component = line.split(" ", 5)
            stream = (int(key), UserId(int(user)), str(json.loads(component)))
            streams = self._elsewhere.setdefault(int(slot), set())
            if held == "1":
                streams.add(stream)
            else:
                streams.discard(stream)
        elif kind == "x":
            _, key, user, component = line.split(" ", 3)
            if self._push is not None:
                self._push.stop_here((int(key), UserId(int(user)), str(json.loads(component))))
        elif kind == "r":
            sender = int(line[2:])
            self._elsewhere.pop(sender, None)
            if sender == DISCARDING_SLOT:  # what was asked of its predecessor is lost
                self._answer_records(None)
            peer = self._by_slot[sender]
            if peer.sock is not None:  # connected to its predecessor: never send there again
                self._loop.remove_writer(peer.sock.fileno())
                peer.sock.close()
                peer.sock = None
            peer.pushes.update(dict.fromkeys(self._told, True))
            self._send(peer)
        elif kind == "a":
            _, slot, seq = line.split(" ")
            self._reload_grants(int(slot), int(seq))
        elif kind == "A":
            _, slot, seq = line.split(" ")
            self._grants_in_use(int(seq), int(slot))
        elif kind == "q":
            _, slot, seq, key = line.split(" ")
            asking = self._by_slot.get(int(slot))
            if asking is not None and self._discarder is not None:
                record = self._discarder.record(int(key))
                asking.lines.append(
                    f"Q {int(seq)} {json.dumps([record.discarded, record.expired])}"
                )
                self._soon()
        elif kind == "Q":
            _, seq, answer = line.split(" ", 2)
            discarded, expired = json.loads(answer)
            record = DiscardRecord(int(discarded), tuple((str(u), str(c)) for u, c in expired))
            self._answer_records(record, int(seq))
        elif kind == "m":
            event_type, ts, attributes = json.loads(line[2:])
            if self._bus is not None:
                self._bus.deliver(
                    management_notification(str(event_type), str(ts), dict(attributes))
                )
        else:
            raise ValueError("unknown kind")
