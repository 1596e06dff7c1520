"""Start and stop the systems under test, each as its own process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from futoin_evt.auth.users import hash_password
from futoin_evt.domain.rights import Right
from futoin_evt.domain.schemas import parse_schema
from futoin_evt.domain.stream import utc_timestamp
from futoin_evt.storage import open_store
from futoin_evt.storage.checksums import event_checksum
from futoin_evt.storage.sql.grants import grant_sql
from futoin_evt.storage.sqlite.schema import ensure_schema
from futoin_evt.storage.sqlite.writer import create_private

BENCH_DIR: Final = Path(__file__).resolve().parent
JS_DIR: Final = BENCH_DIR / "js"
NPM_CACHE: Final = BENCH_DIR.parent / ".cache" / "npm"
USER: Final = "bench"
PASSWORD: Final = "bench-pw"


def payload(i: int) -> dict[str, object]:
    """About 100 bytes of JSON per event."""
    return {
        "order": i,
        "customer": f"c-{i % 100000:06d}",
        "amount": "123.45",
        "currency": "EUR",
        "note": "benchmark payload",
    }


@dataclass
class System:
    name: str
    url: str
    credentials: str
    #: The iface:version a consumer polls through (the reference serves push 1.1 only).
    poll_iface: str
    db_path: Path
    process: asyncio.subprocess.Process
    #: ``amqp://host:port`` when the AMQP listener is on.
    amqp_url: str | None = None

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                async with asyncio.timeout(30):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    def cpu_seconds(self) -> float:
        """User plus system CPU time the server has used so far (Linux): the process, and
        its workers when it supervises some (``serve --workers N``)."""
        return group_cpu_seconds(self.process.pid)

    def rss_kib(self) -> int:
        """Resident memory of the server (Linux): the process and its workers."""
        return sum(_rss_kib(pid) for pid in [self.process.pid, *children(self.process.pid)])


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from ``/proc/PID/stat`` (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a supervisor's workers)."""
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def group_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server: the supervisor and its workers (or the one process)."""
    return sum(process_cpu_seconds(p) for p in [pid, *children(pid)])


def print_figures(title: str, figures: dict[str, float]) -> None:
    width = max(len(k) for k in figures)
    print(title)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:>12,.1f}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prefill_rows(count: int) -> list[tuple[str, str, str, int]]:
    """Events as the server stores them: type, data, time and checksum."""
    ts = utc_timestamp()
    rows = []
    for i in range(count):
        data = json.dumps(payload(i), separators=(",", ":"))
        rows.append(("ORDER", data, ts, event_checksum("ORDER", data, ts)))
    return rows


# -- futoin-evt ----------------------------------------------------------------------------------


def prepare_futoin_evt_db(path: Path, prefill: int) -> None:
    create_private(path)  # as the server makes its files: it warns about others
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        ensure_schema(conn)
        user = conn.execute(
            "INSERT INTO users (name, password_hash, created_at) VALUES (?, ?, ?)",
            (USER, hash_password(PASSWORD), utc_timestamp()),
        ).lastrowid
        # read and write on every stream (the check is on every call, as for any user)
        conn.execute(grant_sql("?"), (user, "*", int(Right.READ | Right.WRITE)))
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (type, data, ts, checksum) VALUES (?, ?, ?, ?)",
            prefill_rows(prefill),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


#: :func:`prepare_futoin_evt_db` of another source tree, run in that tree.
_PREPARE: Final = (
    "import sys; from pathlib import Path; from bench.systems import prepare_futoin_evt_db;"
    " prepare_futoin_evt_db(Path(sys.argv[1]), int(sys.argv[2]))"
)


async def start_futoin_evt(
    workdir: Path,
    *extra: str,
    prefill: int = 0,
    durability: str = "full",
    source: Path | None = None,
    launcher: tuple[str, ...] = ("-m", "futoin_evt"),
    streams: dict[str, int] | None = None,
    schemas: dict[str, str] | None = None,
) -> System:
    """``extra``: more ``serve`` options (``--amqp 127.0.0.1:0``, say); ``source``: run the
    server from this source tree instead of the installed package; ``launcher``: what
    ``python`` runs, given the command line of ``futoin-evt`` after it; ``streams``: streams
    to add beside ``events``, by name, with their partition counts; ``schemas``: schema
    texts to register first, by subject (``events-TYPE``)."""
    db = workdir / "futoin-evt.sqlite"
    if source is None:
        prepare_futoin_evt_db(db, prefill)
    else:  # as that tree makes it: its schema may be older than this one's
        made = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-c", _PREPARE, str(db), str(prefill)),
            cwd=source,
            env={**os.environ, "PYTHONPATH": str(source)},
        )
        if await made.wait():
            raise RuntimeError(f"could not make the database of {source}")
    if streams or schemas:
        async with await open_store(db) as store:
            for name, partitions in (streams or {}).items():
                await store.add_stream(name, partitions)
            for subject, text in (schemas or {}).items():
                schema = parse_schema(text)
                stream = subject.rpartition("-")[0]
                await store.add_schema_version(
                    stream, subject, schema.text, schema.fingerprint, after=0
                )
    name = "futoin-evt" if durability == "full" else f"futoin-evt {durability}"
    return await serve(
        db, "--durability", durability, *extra, name=name, source=source, launcher=launcher
    )


async def serve(
    db: Path | str,
    *extra: str,
    name: str = "futoin-evt",
    source: Path | None = None,
    launcher: tuple[str, ...] = ("-m", "futoin_evt"),
) -> System:
    """One ``futoin-evt serve`` process on ``db`` (a SQLite file, or a PostgreSQL URL: then
    the system's ``db_path`` is empty) on a free port, its user :data:`USER`, once it is
    listening; ``extra``, ``source`` and ``launcher`` as :func:`start_futoin_evt` takes
    them. Every server of the benchmarks is started here."""
    # -P: the installed futoin_evt, never a source tree's where the benchmark runs (that would
    # stand in for a compiled build); a launcher of the benchmarks' own needs their tree
    installed = ("-P",) if source is None and launcher == ("-m", "futoin_evt") else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *installed,
        *launcher,
        "--log-level",
        "warning",
        "serve",
        "--db",
        str(db),
        "--port",
        "0",
        # Consumers of earlier runs would let read events go; each run drains the same
        # prefilled backlog (discarding is measured on its own: python -m bench.discard).
        "--discard-interval",
        "86400",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        cwd=source,
        env=None if source is None else {**os.environ, "PYTHONPATH": str(source)},
    )
    assert proc.stdout is not None
    words = (await proc.stdout.readline()).decode().split()
    url = next(word for word in words if word.startswith("ws://"))
    amqp_url = next((word for word in words if word.startswith("amqp://")), None)
    db_path = db if isinstance(db, Path) else Path()
    credentials = f"{USER}:{PASSWORD}"
    return System(name, url, credentials, "futoin.evt.poll:1.1", db_path, proc, amqp_url)


# -- the official reference ----------------------------------------------------------------------


def install_reference() -> None:
    """npm packages of the reference server, once (sqlite3 compiles from source: minutes)."""
    stamp = JS_DIR / "node_modules" / ".installed-from"
    wanted = (JS_DIR / "package.json").read_text()
    if stamp.exists() and stamp.read_text() == wanted:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to run the reference server")
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--cache", str(NPM_CACHE)],
        cwd=JS_DIR,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stamp.write_text(wanted)


def prepare_reference_db(path: Path, prefill: int) -> None:
    schema = (
        JS_DIR
        / "node_modules"
        / "futoin-eventstream"
        / "sql"
        / "active"
        / "sqlite"
        / "V18.1__Tables.sql"
    )
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(schema.read_text())
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO evt_queue (type, data, ts) VALUES (?, ?, ?)",
            [(t, d, ts.replace("T", " ").rstrip("Z")) for t, d, ts, _ in prefill_rows(prefill)],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def start_reference(workdir: Path, *, prefill: int = 0) -> System:
    install_reference()
    db = workdir / "reference.sqlite"
    prepare_reference_db(db, prefill)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "node",
        "reference_server.js",
        str(db),
        str(port),
        USER,
        PASSWORD,
        cwd=JS_DIR,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode().strip()
    if line != "READY":
        await proc.wait()
        raise RuntimeError(f"the reference server did not start: {line!r}")
    return System(
        "reference",
        f"ws://127.0.0.1:{port}/",
        f"{USER}:{PASSWORD}",
        "futoin.evt.push:1.1",
        db,
        proc,
    )


@contextlib.asynccontextmanager
async def running(system: System) -> AsyncIterator[System]:
    try:
        yield system
    finally:
        await system.stop()
