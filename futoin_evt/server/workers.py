"""The supervisor of ``serve --workers N``: N server processes on the same ports.

The supervisor reserves each port once (a socket bound with SO_REUSEPORT that never
listens, so port 0 becomes one port for all), then starts the workers; each listens on the
same ports with SO_REUSEPORT and the kernel spreads new connections over them. A worker's
first line on stdout says it is ready. A worker that exits unasked is started again after
a back-off (doubling from :data:`FIRST_RESTART_DELAY` while it keeps dying young). SIGTERM
to the supervisor stops the workers gracefully (each closes as a single server does); the
workers also get SIGTERM when the supervisor dies (Linux's parent-death signal).

The workers' channel lives in a private directory under the temporary directory, beside the
file where they count their connections (:mod:`futoin_evt.slots`; the supervisor zeroes the
counts of a worker that exited). The supervisor removes the directory when it stops, a worker
when it outlives its supervisor. While the supervisor lives it holds a lock on a file there;
a supervisor that starts removes the directories whose lock nobody holds (left when a whole
group was killed with SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

#: Seconds before the first restart of a worker that died; doubled while it keeps dying.
FIRST_RESTART_DELAY: Final = 0.2
MAX_RESTART_DELAY: Final = 30.0
#: A worker that ran this long counts as healthy: its next restart waits the first delay.
HEALTHY_SECONDS: Final = 30.0
#: After SIGTERM, a worker gets this long to finish before SIGKILL.
STOP_SECONDS: Final = 60.0

_PR_SET_PDEATHSIG: Final = 1


class WorkerFailed(Exception):
    """A worker exited before it was ready (its reason is on stderr)."""

    def __init__(self, slot: int, returncode: int) -> None:
        super().__init__(f"worker {slot} exited with status {returncode} before it was ready")
        self.slot = slot
        self.returncode = returncode


def reserve_port(host: str, port: int) -> tuple[int, list[socket.socket]]:
    """Bind (never listen) SO_REUSEPORT sockets on every address of ``host``: the port is
    then the group's; returns it (the one port 0 picked) and the sockets to keep open.
    OSError when the port is in use by a listener that does not share it, or when something
    already listens there (another server that shares ports the same way)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses = list(dict.fromkeys((info[0], info[4][:2]) for info in infos))
    if port:
        for family, address in addresses:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                if probe.connect_ex(address) == 0:
                    raise OSError(98, "Address already in use")
    held: list[socket.socket] = []
    try:
        for family, (addr, _) in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
            port = sock.getsockname()[1]
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return port, held


def die_with_parent(parent: int) -> None:
    """In a worker: SIGTERM when the supervisor ``parent`` dies (Linux); exit at once when it
    is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(1)


#: What the names of the groups' channel directories start with.
CHANNEL_PREFIX: Final = "futoin-evt-"
#: The file of a channel directory whose lock the group's supervisor holds while it lives.
OWNER_LOCK: Final = "supervisor.lock"


def channel_dir(parent: Path | None = None) -> tuple[Path, int]:
    """A private directory (mode 0700) for the workers' channel, under ``parent`` (the
    temporary directory), and the descriptor that holds its owner lock: close it after
    removing the directory. Stale directories go first (:func:`remove_stale_channels`)."""
    remove_stale_channels(parent)
    path = Path(tempfile.mkdtemp(prefix=CHANNEL_PREFIX, dir=parent))
    # locked before it takes its name: no other supervisor ever finds it unlocked
    claiming = path / (OWNER_LOCK + ".new")
    fd = os.open(claiming, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(claiming, path / OWNER_LOCK)
    return path, fd


def remove_stale_channels(parent: Path | None = None) -> list[Path]:
    """Remove this user's channel directories under ``parent`` whose owner lock nobody
    holds (their supervisor died, and no worker was left to tidy up); returns them.
    Directories without the lock file (being made, or not ours) stay."""
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    removed: list[Path] = []
    with os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(CHANNEL_PREFIX):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                fd = os.open(
                    os.path.join(entry.path, OWNER_LOCK),
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                )
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its supervisor lives
            else:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
                logger.info("removed %s, left by a group that was killed", entry.path)
            finally:
                os.close(fd)
    return removed


class Supervisor:
    """Starts ``count`` workers, each ``command(slot)``, keeps them running, stops them;
    ``on_exit(slot)`` runs each time a worker exits unasked, before it starts again."""

    def __init__(
        self,
        count: int,
        command: Callable[[int], Sequence[str]],
        workdir: Path,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.count = count
        self._command = command
        self._workdir = workdir
        self._on_exit = on_exit
        self._procs: list[asyncio.subprocess.Process | None] = [None] * count
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._copies: set[asyncio.Task[None]] = set()
        #: Restarts of each slot (for the logs and tests).
        self.restarts = [0] * count

    @property
    def pids(self) -> list[int | None]:
        return [proc.pid if proc is not None else None for proc in self._procs]

    async def start(self) -> str:
        """Start every worker; once all are ready, the ready line of worker 0. Raises
        :class:`WorkerFailed` (the others stopped) when one exits before it is ready."""
        starts = [asyncio.create_task(self._start(slot)) for slot in range(self.count)]
        try:
            lines = await asyncio.gather(*starts)
        except BaseException:
            for task in starts:
                task.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            await self.close()
            raise
        self._keepers = [
            asyncio.create_task(self._keep(slot), name=f"futoin-evt-worker-{slot}")
            for slot in range(self.count)
        ]
        return lines[0]

    async def _start(self, slot: int) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self._command(slot), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
        )
        self._procs[slot] = proc
        assert proc.stdout is not None
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise WorkerFailed(slot, await proc.wait())
        logger.info("worker %d ready (pid %d)", slot, proc.pid)
        copy = asyncio.create_task(_copy_rest(proc.stdout))
        self._copies.add(copy)
        copy.add_done_callback(self._copies.discard)
        return line.rstrip("\n")

    async def _keep(self, slot: int) -> None:
        """Start the worker again each time it exits unasked, after a back-off."""
        delay = FIRST_RESTART_DELAY
        started = time.monotonic()
        while True:
            proc = self._procs[slot]
            assert proc is not None
            status = await proc.wait()
            if self._stopping:
                return
            if self._on_exit is not None:
                try:
                    self._on_exit(slot)
                except OSError as exc:
                    logger.warning("after worker %d exited: %s", slot, exc)
            if time.monotonic() - started >= HEALTHY_SECONDS:
                delay = FIRST_RESTART_DELAY
            logger.warning("worker %d (pid %d) exited with status %d; starting it again in %.1fs",
                        slot, proc.pid, status, delay)  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RESTART_DELAY)
            if self._stopping:
                return
            started = time.monotonic()
            self.restarts[slot] += 1
            try:
                await self._start(slot)
            except WorkerFailed as exc:
                logger.error("%s", exc)

    async def close(self) -> None:
        """SIGTERM to every worker; wait for them (SIGKILL after :data:`STOP_SECONDS`)."""
        self._stopping = True
        for task in self._keepers:
            task.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        running = [p for p in self._procs if p is not None and p.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                async with asyncio.timeout(STOP_SECONDS):
                    await proc.wait()
            except TimeoutError:
                logger.error("worker (pid %d) did not stop in time; killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        shutil.rmtree(self._workdir, ignore_errors=True)


async def _copy_rest(stream: asyncio.StreamReader) -> None:
    """A worker's later output goes on to the supervisor's stdout (its pipe is never full)."""
    while line := await stream.readline():
        sys.stdout.write(line.decode())
        sys.stdout.flush()
