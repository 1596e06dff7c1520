"""``python -m bench.console [--views N] [--rounds N] [--pg URL] [--before DIR] [--workers N]``:
the latency of a console page view, as a browser's request sees it (one kept-alive
connection, the session's cookie, one request at a time), on SQLite at ``--durability full``
and, with ``--pg``, on a new PostgreSQL database.

With ``--before DIR`` (another source tree: an earlier version) both servers run in the
same run, their views taken in alternate rounds on the same machine, each on a database of
its own (each version makes its own schema). The pages: ``streams`` (every partition's
head, rate and chart) and ``consumers`` (every consumer's position and lag), of a database
with 4 streams of 2 partitions and a consumer on each partition, and ``login`` with a live
session (answered 303 to the streams page: the session's lookup and little else). Beside
the latency, the server's CPU time per view (``/proc``, the server's processes), which a
busy shared machine blurs less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx

from .postgres import database
from .systems import group_cpu_seconds

USER: Final = "bench"
PASSWORD: Final = "bench-pw"
#: Page -> the status it answers a logged-in browser.
PAGES: Final = {"streams": 200, "consumers": 200, "login": 303}


@dataclass
class Server:
    name: str
    process: asyncio.subprocess.Process
    console: str
    http: httpx.AsyncClient = field(init=False)
    times: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PAGES})
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PAGES, 0.0))


async def _run(source: Path | None, *argv: str, stdin: bytes | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "futoin_evt", *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        env=_env(source), cwd=source,
    )  # fmt: skip
    await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"futoin-evt {' '.join(argv)} failed")


def _env(source: Path | None) -> dict[str, str]:
    """Run ``source``'s futoin-evt (the working directory is set to it too: ``python -m``
    looks there first)."""
    return {**os.environ, **({"PYTHONPATH": str(source)} if source is not None else {})}


async def _prepare(db: str, source: Path | None) -> None:
    """The user (an admin: every page shows everything), 4 streams of 2 partitions, and
    a consumer on each partition, through the command line of the version measured."""
    await _run(source, "user", "add", USER, "--admin", "--password-stdin", "--db", db,
               stdin=f"{PASSWORD}\n".encode())  # fmt: skip
    for n in range(4):
        await _run(source, "stream", "add", f"s{n}", "--partitions", "2", "--db", db)


@contextlib.asynccontextmanager
async def _server(name: str, db: str, source: Path | None, workers: int) -> AsyncIterator[Server]:
    await _prepare(db, source)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "futoin_evt", "--log-level", "warning", "serve", "--db", db,
        "--port", "0", "--console", "--workers", str(workers),
        stdout=asyncio.subprocess.PIPE, env=_env(source), cwd=source,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        words = (await proc.stdout.readline()).decode().split()
        console = next(word for word in words if "/console/" in word)
        server = Server(name, proc, console)
        async with httpx.AsyncClient(base_url=console, timeout=30) as http:
            server.http = http
            form = {"user": USER, "password": PASSWORD}
            # the login form's token (bound to the page's pre-session cookie), when it has one
            token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("login")).text)
            form.update({"csrf": token.group(1)} if token is not None else {})
            if (await http.post("login", data=form)).status_code != 303:
                raise RuntimeError(f"{name}: the login failed")
            for n in range(8):  # a consumer per partition, through the FTN3 door
                await _consumer(server, f"s{n // 2}", n % 2)
            yield server
    finally:
        proc.terminate()
        await proc.wait()


async def _consumer(server: Server, stream: str, partition: int) -> None:
    from futoin_evt.client.aio import EventStreamClient

    url = server.console.replace("http", "ws", 1).removesuffix("console/") + f"{stream}/{partition}"
    async with await EventStreamClient.connect(url, credentials=f"{USER}:{PASSWORD}") as client:
        await client.register_consumer("BENCH")
        await client.add_event("BENCH_EVENT", {"n": partition})


async def _views(server: Server, count: int) -> None:
    for page, status in PAGES.items():
        times = server.times[page]
        cpu = group_cpu_seconds(server.process.pid)
        for _ in range(count):
            started = time.perf_counter()
            reply = await server.http.get(page)
            times.append(time.perf_counter() - started)
            if reply.status_code != status:
                raise RuntimeError(f"{server.name}: {page} answered {reply.status_code}")
        server.cpu[page] += group_cpu_seconds(server.process.pid) - cpu


async def measure(
    db_of: dict[str, str], sources: dict[str, Path | None], args: argparse.Namespace
) -> list[Server]:
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(_server(name, db_of[name], source, args.workers))
            for name, source in sources.items()
        ]
        for server in servers:  # warm-up: templates compiled, connections pooled
            await _views(server, 20)
            server.times = {p: [] for p in PAGES}
            server.cpu = dict.fromkeys(PAGES, 0.0)
        for _ in range(args.rounds):
            for server in servers:
                await _views(server, args.views)
        return servers


def _report(title: str, servers: list[Server]) -> None:
    print(title)
    for server in servers:
        for page, samples in server.times.items():
            ordered = sorted(samples)
            p50 = statistics.median(ordered) * 1e3
            p90 = ordered[int(len(ordered) * 0.9)] * 1e3
            cpu = server.cpu[page] * 1e6 / len(ordered)
            print(
                f"  {server.name:<7} {page:<10} p50 {p50:6.2f} ms  p90 {p90:6.2f} ms"
                f"  server CPU {cpu:6.0f} µs per view  ({len(ordered)} views)"
            )


async def main_async(args: argparse.Namespace) -> None:
    sources: dict[str, Path | None] = {"after": None}
    if args.before is not None:
        sources = {"before": args.before.resolve(), **sources}
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {name: str(Path(tmp) / f"{name}.sqlite") for name in sources}
        _report("SQLite (--durability full)", await measure(dbs, sources, args))
    if args.pg is not None:
        async with contextlib.AsyncExitStack() as stack:
            dbs = {name: await stack.enter_async_context(database(args.pg)) for name in sources}
            _report("PostgreSQL", await measure(dbs, sources, args))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console")
    parser.add_argument("--views", type=int, default=50, help="views of each page per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pg", metavar="URL", help="also on a new database of this server")
    parser.add_argument("--before", type=Path, metavar="DIR", help="an earlier source tree")
    parser.add_argument("--workers", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
