"""``python -m bench.amqp [--produce N] [--catch-up N] [--partitions N] [--source DIR]``: the AMQP
door beside FTN3.

- produce: one link, 1000 messages unsettled at a time, until N are accepted (durable);
  beside it FTN3 addEvent with 1000 calls in flight on one connection;
- catch-up: a new consumer reads a prefilled log of N events from ``@earliest`` with 1000
  credit (auto-accepted), on the plain node and on the Event Hubs address; beside it an
  FTN3 push consumer catching up on the same log;
- partitions (``--partitions N``): producing N events with 64 partition keys to a stream of 4
  partitions, and catching up over all of them with one link and with one Event Hubs SDK
  consumer client, each beside the same on ``events`` (one partition);
- raw limit: the same proton client against a proton echo node in a process of its own
  (accepts every message at once; sends ready-made event messages as credit allows).

``--client rhea``: instead, rhea (npm) in a node process of its own produces and consumes
against futoin-evt (this tree, and the tree ``--before`` names when given) and RabbitMQ's
AMQP 1.0 plugin (guest/guest on 5672, a durable queue, durable messages; the plugin is
enabled here, or the rows say why not), with the server CPU per message of each.

``--profile``: instead, py-spy samples of the server while the proton producer and the
consumer run, to ``bench/profiles/amqp-produce.*`` and ``amqp-consume.*``.

The proton clients are reactor-driven (``proton.reactor.Container``), as a real AMQP
application's would be; the server is a process of its own, started with ``--amqp``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from proton import Delivery, Described, Message, symbol, timestamp, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter

from futoin_evt.auth.sas import load_secret, sas_key
from futoin_evt.domain.stream import UserId
from futoin_evt.storage.user_roles import User

from . import workloads
from .profile import OUT, summary
from .systems import (
    PASSWORD,
    USER,
    System,
    free_port,
    payload,
    print_figures,
    running,
    start_futoin_evt,
)

WINDOW = 1000
RAW_PRODUCE = "raw: proton produce to proton echo, window 1000 (msg/s)"
RAW_CONSUME = "raw: proton consume from proton echo, credit 1000 (msg/s)"
#: What the Event Hubs SDK attaches to (there, JSON data goes out as a ``data`` section).
EVENT_HUBS = "events/ConsumerGroups/$Default/Partitions/0"
PARTITION_KEY = symbol("x-opt-partition-key")
#: A stream of 4 partitions beside ``events`` (one).
PARTITIONED = "orders"
EARLIEST = Filter(
    {symbol("f"): Described(ulong(0x200), {symbol("event-streams-offset"): symbol("@earliest")})}
)


class Producer(MessagingHandler):
    """Sends ``count`` messages keeping ``window`` unsettled; times until all are accepted.

    The messages are encoded before the clock starts: the figure is the node's, not the
    client's encoder's.
    """

    def __init__(
        self,
        url: str,
        count: int,
        window: int = WINDOW,
        address: str = "events",
        keys: int = 0,
        **login: Any,
    ) -> None:
        """``keys``: that many partition keys (``x-opt-partition-key``), taken in turn."""
        super().__init__()
        self.url, self.count, self.window, self.login = url, count, window, login
        self.address = address
        self.sent = self.accepted = 0
        self.encoded = [
            Message(
                subject="ORDER",
                body=payload(i),
                annotations={PARTITION_KEY: f"customer-{i % keys}"} if keys else None,
            ).encode()
            for i in range(count)
        ]
        self.started = self.elapsed = 0.0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, **self.login)
        event.container.create_sender(conn, self.address)
        self.started = time.perf_counter()

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < self.count and self.sent - self.accepted < self.window:
            sender.delivery(str(self.sent))
            sender.send(self.encoded[self.sent])
            sender.advance()
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.elapsed = time.perf_counter() - self.started
            event.connection.close()
        else:
            self.on_sendable(event)

    def on_rejected(self, event: Any) -> None:
        raise RuntimeError("a message was rejected")


class Consumer(MessagingHandler):
    """Receives ``count`` messages from the earliest with ``credit`` outstanding; accepts each
    without decoding it (the figure is the node's, not the client's decoder's)."""

    def __init__(
        self,
        url: str,
        count: int,
        credit: int = WINDOW,
        address: str = "events",
        **login: Any,
    ) -> None:
        super().__init__(prefetch=credit)
        self.url, self.count, self.address, self.login = url, count, address, login
        self.received = 0
        self.started = self.elapsed = 0.0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, **self.login)
        event.container.create_receiver(conn, self.address, options=EARLIEST)
        self.started = time.perf_counter()

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.partial:
            return
        link = delivery.link
        link.recv(delivery.pending)
        link.advance()
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        self.received += 1
        if self.received == self.count:
            self.elapsed = time.perf_counter() - self.started
            event.connection.close()


def run(handler: Producer | Consumer) -> float:
    """Messages/s of one client run."""
    Container(handler).run()
    return handler.count / handler.elapsed


def _login() -> dict[str, Any]:
    return {"user": USER, "password": PASSWORD, "allowed_mechs": "PLAIN"}


# -- the raw limit: a proton echo node ----------------------------------------------------------


class EchoNode(MessagingHandler):
    """Accepts whatever it is sent; sends ready-made event messages as long as credit lasts."""

    def __init__(self, url: str) -> None:
        super().__init__(auto_accept=True)
        self.url = url
        self.sent = 0
        self.template = Message(subject="ORDER", body=payload(0))
        self.template.annotations = {symbol("x-opt-sequence-number"): 0}

    def on_start(self, event: Any) -> None:
        event.container.listen(self.url)

    def on_link_opening(self, event: Any) -> None:
        link = event.link
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit:
            self.sent += 1
            message = self.template
            message.instructions = {
                symbol("event-streams-offset"): symbol(f"{self.sent:020d}"),
                symbol("event-streams-timestamp"): timestamp(int(time.time() * 1000)),
            }
            sender.send(message)


def _serve_echo(url: str) -> None:
    Container(EchoNode(url)).run()


def raw_limits(produce: int, catch_up: int) -> dict[str, float]:
    url = f"amqp://127.0.0.1:{free_port()}"
    echo = multiprocessing.get_context("spawn").Process(target=_serve_echo, args=(url,))
    echo.start()
    try:
        for _ in range(100):  # until it listens
            try:
                return {
                    RAW_PRODUCE: run(Producer(url, produce, sasl_enabled=False)),
                    RAW_CONSUME: run(Consumer(url, catch_up, sasl_enabled=False)),
                }
            except Exception:  # the echo node is still starting
                time.sleep(0.1)
        raise RuntimeError("the proton echo node did not start")
    finally:
        echo.terminate()
        echo.join()


# -- futoin-evt ----------------------------------------------------------------------------------


async def measure(produce: int, catch_up: int, source: Path | None = None) -> dict[str, float]:
    """Each workload's rate, and the server's CPU time per event it took (``/proc``);
    ``source``: the server from that source tree (an earlier version, say)."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
        system = await start_futoin_evt(
            Path(tmp), "--amqp", "127.0.0.1:0", prefill=catch_up, source=source
        )
        async with running(system):
            url = system.amqp_url
            assert url is not None

            async def timed(row: str, events: int, workload: Awaitable[float]) -> None:
                before = system.cpu_seconds()
                figures[f"{row} (events/s)"] = await workload
                cpu = (system.cpu_seconds() - before) / events * 1e6
                figures[f"{row}: server CPU (µs/event)"] = cpu

            await timed(
                "AMQP consume catch-up, credit 1000",
                catch_up,
                asyncio.to_thread(run, Consumer(url, catch_up, **_login())),
            )
            await timed(
                "AMQP consume catch-up, Event Hubs address, credit 1000",
                catch_up,
                asyncio.to_thread(run, Consumer(url, catch_up, address=EVENT_HUBS, **_login())),
            )
            await timed("FTN3 push catch-up", catch_up, workloads.push_catch_up(system, catch_up))
            await timed(
                "AMQP produce, 1 link, 1000 unsettled",
                produce,
                asyncio.to_thread(run, Producer(url, produce, **_login())),
            )
            await timed(
                "FTN3 addEvent, 1000 in flight on 1 connection",
                produce,
                workloads.add_in_flight(system, produce, window=WINDOW),
            )
    return figures


async def profile(
    produce: int, catch_up: int, source: Path | None = None, client: str = "proton"
) -> None:
    """py-spy samples of the server while the consumer, then the producer, run (``client``:
    proton's reactor, or rhea in a node process)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if client == "rhea":
        _install_rhea()
    with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
        system = await start_futoin_evt(
            Path(tmp), "--amqp", "127.0.0.1:0", prefill=catch_up, source=source
        )
        async with running(system):
            url = system.amqp_url
            assert url is not None
            port = int(url.rpartition(":")[2])
            rhea_login = {"host": "127.0.0.1", "port": port, "user": USER,
                          "password": PASSWORD, "address": "events", "window": WINDOW}  # fmt: skip
            workloads_: list[tuple[str, int, Callable[[], Awaitable[float]]]] = []
            if client == "rhea":
                workloads_ += [
                    ("amqp-consume", catch_up,
                     lambda: _rhea(mode="consume", earliest=True, count=catch_up, **rhea_login)),
                    ("amqp-produce", produce,
                     lambda: _rhea(mode="produce", count=produce, **rhea_login)),
                ]  # fmt: skip
            else:
                workloads_ += [
                    ("amqp-consume", catch_up,
                     lambda: asyncio.to_thread(run, Consumer(url, catch_up, **_login()))),
                    ("amqp-produce", produce,
                     lambda: asyncio.to_thread(run, Producer(url, produce, **_login()))),
                ]  # fmt: skip
            for name, count, workload in workloads_:
                folded = OUT / f"{name}.folded"
                spy = await asyncio.create_subprocess_exec(
                    py_spy, "record", "--pid", str(system.process.pid), "--rate", "1000",
                    "--gil", "--format", "raw", "--output", str(folded), "--nonblocking",
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                await asyncio.sleep(1.0)  # py-spy attaches (not synchronisation of the server)
                before = system.cpu_seconds()
                rate = await workload()
                cpu = (system.cpu_seconds() - before) / count * 1e6
                spy.send_signal(signal.SIGINT)
                await spy.wait()
                who = "rhea (npm)" if client == "rhea" else "python-qpid-proton"
                head = (
                    f"{name}: {who} client, {count:,} messages, window/credit"
                    f" {WINDOW}: {rate:,.0f} msg/s, server CPU {cpu:.1f} µs per message"
                    f" (load {_load()})"
                )
                (OUT / f"{name}.txt").write_text("\n".join([head, "", *summary(folded)]) + "\n")
                print(head, flush=True)


def _load() -> str:
    """The load averages (1, 5, 15 minutes), to print beside figures."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


RHEA_DIR = Path(__file__).resolve().parent / "amqp_js"
RABBITMQ_PORT = 5672


def _install_rhea() -> None:
    stamp = RHEA_DIR / "node_modules" / ".installed-from"
    wanted = (RHEA_DIR / "package.json").read_text()
    if stamp.exists() and stamp.read_text() == wanted:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed for --client rhea")
    cache = RHEA_DIR.parent.parent / ".cache" / "npm"
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--cache", str(cache)],
        cwd=RHEA_DIR, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    stamp.write_text(wanted)


async def _rhea(**scenario: Any) -> float:
    proc = await asyncio.create_subprocess_exec(
        "node", "client.js", json.dumps(scenario), cwd=RHEA_DIR,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"rhea client failed: {err.decode().strip() or 'no result'}")
    return float(json.loads(out.decode().splitlines()[-1])["rate"])


def _beam_cpu_seconds() -> float:
    """User and system time of the RabbitMQ node (its beam.smp processes)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(beam.smp)" in text:
            fields = text.rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _enable_rabbitmq_amqp() -> str | None:
    """None when RabbitMQ takes AMQP 1.0 on 5672, else why not."""
    try:
        listed = subprocess.run(
            ["rabbitmq-plugins", "list", "-e", "rabbitmq_amqp1_0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if not re.search(r"^\[[Ee]\*?\]\s+rabbitmq_amqp1_0\b", listed.stdout, re.M):
            print("enabling RabbitMQ's AMQP 1.0 plugin (rabbitmq_amqp1_0)", flush=True)
            enabled = subprocess.run(
                ["rabbitmq-plugins", "enable", "rabbitmq_amqp1_0"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if enabled.returncode != 0:
                return f"rabbitmq-plugins enable rabbitmq_amqp1_0 failed: {enabled.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"RabbitMQ's plugins cannot be listed or enabled: {exc}"
    return None


async def rhea_rows(count: int, before: Path | None) -> dict[str, float]:
    """rhea against futoin-evt (before and after) and RabbitMQ: rates and server CPU."""
    _install_rhea()
    figures: dict[str, float] = {}
    common = {"host": "127.0.0.1", "count": count, "window": WINDOW}
    trees: list[tuple[str, Path | None]] = [("futoin-evt", None)]
    if before is not None:
        trees.append(("futoin-evt before", before))
    for name, source in trees:
        with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
            system = await start_futoin_evt(Path(tmp), "--amqp", "127.0.0.1:0", source=source)
            async with running(system):
                assert system.amqp_url is not None
                port = int(system.amqp_url.rpartition(":")[2])
                login = {"port": port, "user": USER, "password": PASSWORD, "address": "events"}
                for mode in ("produce", "consume"):
                    cpu = system.cpu_seconds()
                    rate = await _rhea(mode=mode, earliest=True, **login, **common)
                    per = (system.cpu_seconds() - cpu) / count * 1e6
                    figures[f"rhea {mode}, {name} (msg/s)"] = rate
                    figures[f"rhea {mode}, {name}: server CPU (µs/msg)"] = per
                # the yardsticks, on the same server: what rhea produced, read over FTN3
                yardsticks: list[tuple[str, Callable[[System, int], Awaitable[float]]]] = [
                    ("FTN3 addEvent, 1000 in flight",
                     functools.partial(workloads.add_in_flight, window=WINDOW)),
                    ("FTN3 push catch-up", workloads.push_catch_up),
                ]  # fmt: skip
                for row, workload in yardsticks:
                    cpu = system.cpu_seconds()
                    rate = await workload(system, count)
                    per = (system.cpu_seconds() - cpu) / count * 1e6
                    figures[f"{row}, {name} (events/s)"] = rate
                    figures[f"{row}, {name}: server CPU (µs/event)"] = per
        print(f"{name} measured (load {_load()})", flush=True)
    why_not = _enable_rabbitmq_amqp()
    if why_not is not None:
        print(f"RabbitMQ not measured: {why_not}", flush=True)
        return figures
    queue = f"bench-futoin-evt-{uuid.uuid4().hex[:8]}"
    login = {"port": RABBITMQ_PORT, "user": "guest", "password": "guest",
             "address": f"/queue/{queue}", "durable": True}  # fmt: skip
    try:
        for mode in ("produce", "consume"):
            cpu = _beam_cpu_seconds()
            rate = await _rhea(mode=mode, **login, **common)
            per = (_beam_cpu_seconds() - cpu) / count * 1e6
            figures[f"rhea {mode}, RabbitMQ durable queue (msg/s)"] = rate
            figures[f"rhea {mode}, RabbitMQ durable queue: server CPU (µs/msg)"] = per
    except RuntimeError as exc:
        print(f"RabbitMQ not measured: {exc}", flush=True)
    finally:
        delete = ["rabbitmqctl", "delete_queue", queue]
        await asyncio.to_thread(subprocess.run, delete, capture_output=True, timeout=60)
    return figures


def sdk_catch_up(conn_str: str, count: int) -> float:
    """Events/s of one Event Hubs SDK consumer client reading ``count`` events from the
    earliest over every partition of the hub (``receive_batch``, batches of 300)."""
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(conn_str, consumer_group="$Default")
    received = 0
    started = finished = time.perf_counter()

    def on_batch(_context: Any, events: list[Any]) -> None:
        nonlocal received, finished
        received += len(events)
        if received >= count and finished == started:
            finished = time.perf_counter()
            threading.Thread(target=client.close).start()

    with client:
        client.receive_batch(on_event_batch=on_batch, starting_position="-1", max_batch_size=300)
    return count / (finished - started)


async def measure_partitions(count: int) -> dict[str, float]:
    """Produce with keys and catch up over 4 partitions, beside the same on one partition,
    with the server's CPU time per event."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
        system = await start_futoin_evt(
            Path(tmp), "--amqp", "127.0.0.1:0", streams={PARTITIONED: 4}
        )
        async with running(system):
            url = system.amqp_url
            assert url is not None
            secret = load_secret(Path(f"{system.db_path}.sas-secret"), create=False)
            key = sas_key(secret, user(system))

            async def timed(row: str, workload: Callable[[], float]) -> None:
                before = system.cpu_seconds()
                figures[f"{row} (events/s)"] = await asyncio.to_thread(workload)
                cpu = (system.cpu_seconds() - before) / count * 1e6
                figures[f"{row}: server CPU (µs/event)"] = cpu

            for hub, partitions in (("events", 1), (PARTITIONED, 4)):
                producer = Producer(url, count, address=hub, keys=64, **_login())
                row = f"AMQP produce with 64 keys, {partitions} partition(s), 1000 unsettled"
                await timed(row, functools.partial(run, producer))
            for hub, partitions in (("events", 1), (PARTITIONED, 4)):
                consumer = Consumer(url, count, address=hub, **_login())
                row = f"AMQP consume catch-up, {partitions} partition(s), 1 link, credit 1000"
                await timed(row, functools.partial(run, consumer))
            for hub, partitions in (("events", 1), (PARTITIONED, 4)):
                conn_str = (
                    f"Endpoint=sb://{url.split('://')[1]}/;SharedAccessKeyName={USER};"
                    f"SharedAccessKey={key};EntityPath={hub};UseDevelopmentEmulator=true"
                )
                row = f"Event Hubs SDK consumer catch-up, {partitions} partition(s)"
                await timed(row, functools.partial(sdk_catch_up, conn_str, count))
    return figures


def user(system: System) -> User:
    with sqlite3.connect(system.db_path) as conn:
        row = conn.execute(
            "SELECT id, name, password_hash FROM users WHERE name = ?", (USER,)
        ).fetchone()
    return User(UserId(row[0]), row[1], row[2], False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqp", description=__doc__)
    parser.add_argument("--produce", type=int, default=30_000)
    parser.add_argument("--catch-up", type=int, default=100_000)
    parser.add_argument("--source", type=Path, help="run the server from this source tree")
    parser.add_argument("--profile", action="store_true", help="py-spy profiles instead")
    parser.add_argument("--client", choices=["proton", "rhea"], default="proton")
    parser.add_argument("--before", type=Path, help="with rhea: also the server of this tree")
    parser.add_argument(
        "--partitions",
        type=int,
        default=20_000,
        metavar="N",
        help="events for the rows of 4 partitions beside 1 (0: none)",
    )
    args = parser.parse_args(argv)
    if args.client == "rhea" and not args.profile:
        rows = asyncio.run(rhea_rows(args.produce, args.before))
        print_figures(f"AMQP with rhea: {args.produce:,} messages each way", rows)
        return 0
    if args.profile:
        asyncio.run(profile(args.produce, args.catch_up, args.source, args.client))
        return 0
    figures = asyncio.run(measure(args.produce, args.catch_up, args.source))
    if args.partitions:
        figures.update(asyncio.run(measure_partitions(args.partitions)))
    figures.update(raw_limits(args.produce, args.catch_up))
    print_figures(
        f"AMQP beside FTN3: produce {args.produce:,}, catch-up {args.catch_up:,}", figures
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- Event Hubs $management requests -----------------------------------------------------------


def management_latency(system: System, calls: int) -> tuple[float, float]:
    """The median time (ms) of one ``$management`` request: the checkpoint store's (update,
    then list, each a request on its kept connection) and the SDK's own, which opens a
    connection for each one."""
    from azure.eventhub import EventHubProducerClient

    from futoin_evt.eventhubs import FutoinCheckpointStore

    url = system.amqp_url
    assert url is not None
    key = sas_key(load_secret(Path(f"{system.db_path}.sas-secret"), create=False), user(system))
    conn_str = (
        f"Endpoint=sb://{url.split('://')[1]}/;SharedAccessKeyName={USER};"
        f"SharedAccessKey={key};EntityPath=events;UseDevelopmentEmulator=true"
    )
    scope = {"fully_qualified_namespace": "bench", "eventhub_name": "events"}
    checkpoint = {**scope, "consumer_group": "$Default", "partition_id": "0"}

    def timed(call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    with FutoinCheckpointStore.from_connection_string(conn_str) as store:
        store.list_checkpoints("bench", "events", "$Default")  # opens its connection
        store_times = []
        for n in range(calls):
            body = {**checkpoint, "offset": str(n), "sequence_number": n}
            store_times.append(timed(functools.partial(store.update_checkpoint, body)))
            store_times.append(timed(lambda: store.list_checkpoints("bench", "events", "$Default")))
    with EventHubProducerClient.from_connection_string(conn_str) as producer:
        sdk_times = [timed(lambda: producer.get_partition_properties("0")) for _ in range(calls)]
    return statistics.median(store_times), statistics.median(sdk_times)
