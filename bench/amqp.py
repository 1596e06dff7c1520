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

The proton clients are reactor-driven (``proton.reactor.Container``), as a real AMQP
application's would be; the server is a process of its own, started with ``--amqp``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from proton import Delivery, Described, Message, symbol, timestamp, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter

from futoin_evt.auth.sas import load_secret, sas_key
from futoin_evt.domain.stream import UserId
from futoin_evt.storage.base import User

from . import workloads
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
    parser.add_argument(
        "--partitions",
        type=int,
        default=20_000,
        metavar="N",
        help="events for the rows of 4 partitions beside 1 (0: none)",
    )
    args = parser.parse_args(argv)
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
