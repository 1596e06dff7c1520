"""A filesystem that loses power on command, for the fault tests and ``python -m bench.faults``.

:class:`FaultFS` mounts a FUSE filesystem (:mod:`tests.faultfs.daemon`, in a process of its
own) at ``ROOT/mnt`` over ``ROOT/disk``. Programs use ``ROOT/mnt`` as a disk; what they have
not made durable (``fsync`` of the file for its data, of the directory for its names) is kept
apart, and :meth:`FaultFS.cut` drops it, so ``ROOT/disk`` is the disk as found after a power
loss. A cut, then :meth:`FaultFS.remount`, is a power failure and a reboot::

    with FaultFS(tmp_path) as fs:
        ...  # a server with its database under fs.mountpoint
        fs.cut()  # the power goes: nothing more lands, unsynced writes are gone
        ...  # SIGKILL the server (it died with the power)
        fs.remount()  # the machine comes back with what the disk held

Needs ``/dev/fuse``, ``fusermount3`` (Debian's ``fuse3``) and ``mfusepy``:
:func:`unavailable` says which is missing.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

DAEMON: Final = Path(__file__).resolve().parent / "daemon.py"
#: Seconds to wait for a mount, an answer or an unmount.
TIMEOUT: Final = 30.0


class FaultFSError(RuntimeError):
    """The filesystem could not be mounted, or stopped answering."""


def unavailable() -> str | None:
    """Why the filesystem cannot run here, in one line; None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (FUSE is needed for the power-loss filesystem)"
    if shutil.which("fusermount3") is None or ctypes.util.find_library("fuse3") is None:
        return "Debian's fuse3 is not installed (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (pip install -e '.[test]')"
    return None


class FaultFS:
    """The power-loss filesystem over ``root/disk``, mounted at ``root/mnt``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.disk = root / "disk"
        self.orphans = root / "orphans"
        self.mountpoint = root / "mnt"
        for path in (self.disk, self.orphans, self.mountpoint):
            path.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        #: Mounts so far (1 after the first).
        self.mounts = 0

    def __enter__(self) -> FaultFS:
        self.mount()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.unmount()

    def mount(self) -> None:
        """Start the filesystem on what ``disk`` holds; returns once it answers."""
        if self._proc is not None:
            raise FaultFSError("mounted already")
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed at unmount)
        self._proc = subprocess.Popen(
            [sys.executable, str(DAEMON), str(self.disk), str(self.orphans), str(self.mountpoint)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        try:
            if not self._answer().get("mounted"):
                raise FaultFSError("the filesystem did not say it was mounted")
        except BaseException:
            self._end()
            raise
        self.mounts += 1

    def cut(self, keep: float = 0.0, seed: int = 0) -> dict[str, Any]:
        """The power goes: every operation fails from now on and what was not made durable
        is dropped (each unsynced block persists with probability ``keep``, and then a random
        prefix of the unsynced name changes: a disk that had written some of it back). The
        filesystem's count of what it held, what it dropped, and which files had unsynced
        blocks (``dirty_files``: name to blocks)."""
        return self._ask(f"cut {keep} {seed}")

    def arm(self, name: str, nth: int, keep: float = 0.0, seed: int = 0) -> None:
        """Cut as :meth:`cut` does, during the ``nth`` write to the file ``name`` (in the top
        directory) from now on; :meth:`stats` tells whether it happened (``cut``)."""
        self._ask(f"arm {name} {nth} {keep} {seed}")

    def stats(self) -> dict[str, Any]:
        """File and directory syncs so far, unsynced blocks and name changes now, and once
        the power is off, what the cut did (``cut``)."""
        return self._ask("stats")

    def remount(self) -> None:
        """Unmount (after :meth:`cut`, once the programs on it are gone) and mount again."""
        self.unmount()
        self.mount()

    def unmount(self) -> None:
        """End the mount (lazily if a dead program's descriptors still hold it)."""
        if self._proc is None:
            return
        done = subprocess.run(
            ["fusermount3", "-u", str(self.mountpoint)], capture_output=True, text=True
        )
        if done.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        self._end()

    def logged(self) -> str:
        """What the filesystem's process wrote on its standard error (the last mount)."""
        if self._log is None or self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read()

    def _end(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._log is not None:
            self._log.close()

    def _ask(self, command: str) -> dict[str, Any]:
        if self._proc is None or self._proc.stdin is None:
            raise FaultFSError("not mounted")
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self._proc is not None
        assert self._proc.stdout is not None
        deadline = time.monotonic() + TIMEOUT
        while True:
            ready, _, _ = select.select([self._proc.stdout], [], [], 0.1)
            if ready:
                line = self._proc.stdout.readline()
                if line:
                    answer: dict[str, Any] = json.loads(line)
                    return answer
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise FaultFSError(f"the filesystem did not answer: {self.logged().strip()}")
