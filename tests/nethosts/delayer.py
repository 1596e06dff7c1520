"""A packet delayer on a netfilter queue (NFQUEUE), for kernels without ``sch_netem``.

``python tests/nethosts/delayer.py --queue N --delay-ms D --loss P --seed S``, run inside a
network namespace whose iptables send packets to queue ``N`` (``-j NFQUEUE --queue-num N
--queue-bypass``): each packet is dropped with probability ``P``, else let through ``D``
milliseconds after it was queued, in order, as ``tc qdisc ... netem delay D loss P`` would.
Only the packet's metadata crosses to this process (copy mode ``META``): it never sees
contents. It speaks the queue's netlink protocol itself (``nfnetlink_queue``, Linux's
``include/uapi/linux/netfilter/nfnetlink_queue.h``), so it needs no C library; it stops on
SIGTERM, and the kernel lets the packets still queued through (``--queue-bypass`` lets
packets through while no delayer listens).
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from typing import Final

NETLINK_NETFILTER: Final = 12
NFNL_SUBSYS_QUEUE: Final = 3
NFQNL_MSG_PACKET: Final = 0
NFQNL_MSG_VERDICT: Final = 1
NFQNL_MSG_CONFIG: Final = 2
NLM_F_REQUEST: Final = 1
NLMSG_ERROR: Final = 2
NFQA_PACKET_HDR: Final = 1
NFQA_VERDICT_HDR: Final = 2
NFQA_CFG_CMD: Final = 1
NFQA_CFG_PARAMS: Final = 2
NFQA_CFG_QUEUE_MAXLEN: Final = 3
NFQNL_CFG_CMD_BIND: Final = 1
NFQNL_COPY_META: Final = 1
NF_DROP: Final = 0
NF_ACCEPT: Final = 1
#: Packets the kernel queues before it lets more through unqueued (--queue-bypass).
QUEUE_MAXLEN: Final = 65536
_HEADER = struct.Struct("=IHHII")


def _attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int = 0) -> bytes:
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    msg_type = (NFNL_SUBSYS_QUEUE << 8) | kind
    return _HEADER.pack(_HEADER.size + len(body), msg_type, NLM_F_REQUEST, seq, 0) + body


def verdict(queue: int, packet_id: int, accept: bool) -> bytes:
    return _message(
        NFQNL_MSG_VERDICT,
        queue,
        _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT if accept else NF_DROP, packet_id)),
    )


def bind(sock: socket.socket, queue: int) -> None:
    """Bind ``sock`` to ``queue``, packets' metadata only."""
    sock.send(
        _message(
            NFQNL_MSG_CONFIG,
            queue,
            _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0)),
            1,
        )
    )
    sock.send(
        _message(
            NFQNL_MSG_CONFIG,
            queue,
            _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
            2,
        )
    )


def packet_ids(data: bytes) -> list[int]:
    """The ids of the packets in one read (errors from the kernel raise OSError)."""
    ids: list[int] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, msg_type, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            break
        if msg_type == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, offset + _HEADER.size)[0]
            if code:
                raise OSError(code, f"nfqueue: {os.strerror(code)}")
        elif msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at = offset + _HEADER.size + 4  # after nfgenmsg
            end = offset + length
            while at + 4 <= end:
                size, kind = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if kind & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                at += (size + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def serve(queue: int, delay: float, loss: float, seed: int) -> None:
    """Hold and drop the queue's packets until SIGTERM."""
    rng = random.Random(seed)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
    sock.bind((0, 0))
    bind(sock, queue)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    held: deque[tuple[float, int]] = deque()
    print("ready", flush=True)
    while not stopping:
        now = time.monotonic()
        out = bytearray()
        while held and held[0][0] <= now:
            out += verdict(queue, held.popleft()[1], True)
        if out:
            sock.send(out)
        timeout = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([sock], [], [], timeout)
        except InterruptedError:
            continue
        if not readable:
            continue
        try:
            data = sock.recv(1 << 20)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # the kernel dropped notifications: go on
                continue
            raise
        arrived = time.monotonic()
        dropped = bytearray()
        for packet_id in packet_ids(data):
            if loss and rng.random() < loss:
                dropped += verdict(queue, packet_id, False)
            else:
                held.append((arrived + delay, packet_id))
        if dropped:
            sock.send(dropped)
    out = bytearray()
    for _due, packet_id in held:
        out += verdict(queue, packet_id, True)
    if out:
        sock.send(out)
    sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delayer.py", description=__doc__)
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    serve(args.queue, args.delay_ms / 1000, args.loss, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
