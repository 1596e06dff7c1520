"""Servers under test and who uses them: ``futoin-evt serve`` as a process, the tests' users,
free ports."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Final

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.domain.rights import Right
from futoin_evt.domain.stream import UserId
from futoin_evt.server.app import EventServer
from futoin_evt.storage.base import Store

from .waiting import Deadline

#: The repository.
ROOT = Path(__file__).resolve().parents[2]


#: The users every server of the tests has, and their passwords.
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
#: alice's credentials as the clients take them (``user:password``).
ALICE = f"alice:{USERS['alice']}"


#: What the tests' users may do unless a test says otherwise: what every user could do before
#: rights per stream (tests of rights grant their own).
TEST_RIGHTS: Final = Right.READ | Right.WRITE


async def add_user(
    store: Store, name: str, password_hash: str, *, is_admin: bool = False
) -> UserId:
    """A user with :data:`TEST_RIGHTS` on every stream."""
    user_id = await store.add_user(name, password_hash, is_admin=is_admin)
    await store.grant(user_id, "*", int(TEST_RIGHTS))
    return user_id


ServerFactory = Callable[..., Awaitable[EventServer]]


ClientFactory = Callable[..., Awaitable[EventStreamClient]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``futoin-evt serve`` as its own process, as an operator runs it, in a session of its
    own: :meth:`kill` kills the supervisor and its workers at once. ``workers``: the
    ``--workers`` option (default: ``$FUTOIN_EVT_WORKERS``)."""

    def __init__(
        self,
        db: str | Path,
        port: int = 0,
        *extra: str,
        log_level: str = "warning",
        workers: int | None = None,
    ) -> None:
        self.db = db
        if workers is not None:
            extra = ("--workers", str(workers), *extra)
        # The log goes to a file: a pipe nobody reads would stop the server once it is full.
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "futoin_evt", "--log-level", log_level, "serve",
             "--db", str(db), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"ws://\S+", line)
        if match is None:
            self.proc.communicate(timeout=30)
            raise AssertionError(f"no URL in {line!r}; stderr: {self.logged()}")
        self.line = line
        self.url = match.group(0)
        try:
            self.port = int(self.url.rsplit(":", 1)[1].strip("/"))
        except ValueError:
            self.kill()  # not left running when the start-up line is not understood
            raise
        amqp = re.search(r"amqps?://\S+", line)
        self.amqp_url = amqp.group(0) if amqp else None
        kafka = re.search(r"kafka://(\S+)", line)
        #: ``HOST:PORT`` of the Kafka door (None when it is off).
        self.kafka_address = kafka.group(1) if kafka else None

    def logged(self) -> str:
        """What the server logged so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        """SIGTERM, as an operator stops it; returns the exit code."""
        return self.stop_and_read_log(timeout=30)[0]

    def stop_and_read_log(self, timeout: float) -> tuple[int, str]:
        """SIGTERM; the exit code and everything the server logged."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=timeout)  # also closes the pipes
        logged = self.logged()
        self.log.close()
        return self.proc.returncode, logged

    def kill(self) -> None:
        """SIGKILL to the process and its workers at once: a crash of the whole server."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=30)
        self.log.close()


def run_without(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The command line, run with ``module`` missing (as if it were not installed)."""
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from futoin_evt.cli import main\n"
        f"sys.exit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


class Serving:
    """``futoin-evt serve`` with info logs, read line by line on a thread, in a session of
    its own (its workers, if it has any, are killed with it)."""

    def __init__(self, db: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "futoin_evt", "--log-level", "info", "serve", "--db", db,
             "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.pipes = [self.proc.stdout, self.proc.stderr]
        self.readers = []
        for pipe in self.pipes:
            assert pipe is not None
            reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
            reader.start()
            self.readers.append(reader)
        self.wait_for_line(re.compile(r"ws://"), 60)

    def holds(self, holder: object) -> bool:
        """A lease's holder (``host:pid:...``) is this server or one of its workers."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = [self.proc.pid, *map(int, children.read_text().split())]
        return any(f":{pid}:" in str(holder) for pid in pids)

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.put(line)

    def wait_for_line(self, pattern: re.Pattern[str], seconds: float) -> str:
        deadline = Deadline(seconds)
        while True:
            deadline.check(f"a line matching {pattern.pattern}")
            try:
                line = self.lines.get(timeout=deadline.left())
            except queue.Empty:
                continue
            if pattern.search(line):
                return line

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        for reader, pipe in zip(self.readers, self.pipes, strict=True):
            reader.join(timeout=30)  # the pipe is at its end: the process is gone
            assert pipe is not None
            pipe.close()
