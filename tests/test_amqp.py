"""The AMQP 1.0 door, driven by python-qpid-proton's own blocking client over real sockets."""

from __future__ import annotations

import asyncio
import calendar
import logging
import socket
import sqlite3
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
from proton import (
    ConnectionException,
    Delivery,
    Described,
    LinkException,
    Message,
    SSLDomain,
    symbol,
    timestamp,
    uint,
    ulong,
)
from proton.reactor import Filter
from proton.utils import BlockingConnection, LinkDetached, SendException

from futoin_evt.amqp import AmqpConfig, AmqpLimits, NodeLimits
from futoin_evt.amqp.codec import format_offset
from futoin_evt.amqp.sasl import SASL_HEADER
from futoin_evt.client.aio import Event, EventStreamClient
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.server.app import EventServer

from .support.amqp import (
    LinkProperties,
    annotations_filter,
    connected,
    in_thread,
    management_requests,
    produce,
    send_outcome,
)
from .support.amqp_wire import ATTACH, FLOW, TRANSFER, attach, frame, logged_in
from .support.js import run_js
from .support.servers import USERS, ServerFactory

pytestmark = pytest.mark.functional

OFFSET = symbol("event-streams-offset")
TIMESTAMP = symbol("event-streams-timestamp")


def delivery_annotations(message: Message) -> dict[Any, Any]:
    assert message.instructions is not None
    return dict(message.instructions)


def message_annotations(message: Message) -> dict[Any, Any]:
    assert message.annotations is not None
    return dict(message.annotations)


def consume(url: str, count: int, options: Any = None, credit: int = 500) -> list[Message]:
    with connected(url) as conn:
        receiver = conn.create_receiver("events", credit=credit, options=options)
        messages = []
        for _ in range(count):
            messages.append(receiver.receive())
            receiver.accept()
        return messages


async def test_login_and_capability(amqp_server: EventServer) -> None:
    assert amqp_server.amqp_url is not None

    def capabilities() -> Any:
        with connected(amqp_server.amqp_url or "") as conn:
            assert conn.conn is not None
            return list(conn.conn.remote_offered_capabilities or [])

    assert symbol("AMQP_EVENT_STREAMS_V1_0") in await in_thread(capabilities)


async def test_wrong_password_is_refused_and_not_logged(
    amqp_server: EventServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    def login() -> None:
        with connected(amqp_server.amqp_url or "", password="not-the-password"):
            pass

    with pytest.raises(ConnectionException):
        await in_thread(login)
    failures = [r.getMessage() for r in caplog.records if "login failed" in r.getMessage()]
    assert failures
    assert "'alice'" in failures[0]
    assert all("not-the-password" not in r.getMessage() for r in caplog.records)


async def test_anonymous_login_may_not_use_the_node(amqp_server: EventServer) -> None:
    def attach() -> None:
        conn = BlockingConnection(amqp_server.amqp_url or "", allowed_mechs="ANONYMOUS", timeout=30)
        try:
            conn.create_receiver("events")
        finally:
            conn.close()

    with pytest.raises(LinkException, match="unauthorized-access"):
        await in_thread(attach)


async def test_produce_and_consume_ten_thousand(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""
    count = 10_000
    await in_thread(produce, url, [{"n": n} for n in range(count)])
    messages = await in_thread(
        consume, url, count, annotations_filter(offset=symbol("@earliest")), 1000
    )
    assert [m.body for m in messages] == [{"n": n} for n in range(count)]
    assert all(m.subject == "T" for m in messages)
    offsets = [delivery_annotations(m)[OFFSET] for m in messages]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == count
    assert offsets[0] == format_offset(1)
    first = messages[0]
    assert message_annotations(first)[symbol("x-opt-sequence-number")] == 1
    assert message_annotations(first)[symbol("x-opt-offset")] == format_offset(1)
    assert (
        delivery_annotations(first)[TIMESTAMP]
        == message_annotations(first)[symbol("x-opt-enqueued-time")]
    )
    # the same events over FTN3
    rows = await amqp_server.store.read_rows(0, limit=3)
    assert [(r[1], r[2]) for r in rows] == [("T", '{"n":0}'), ("T", '{"n":1}'), ("T", '{"n":2}')]


async def test_consume_after_an_offset(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, list(range(10)))
    messages = await in_thread(consume, url, 3, annotations_filter(offset=format_offset(7)))
    assert [m.body for m in messages] == [7, 8, 9]  # ids 8, 9, 10


async def test_consume_after_a_timestamp(amqp_server: EventServer, db_path: Path) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, ["old", "new"])
    # The first event was added long ago (stored times are whole seconds, UTC), before
    # events had checksums.
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE events SET ts = '2020-01-01T00:00:00Z', checksum = NULL WHERE id = 1")
    old_ms = calendar.timegm((2020, 1, 1, 0, 0, 0)) * 1000
    after_old = await in_thread(consume, url, 1, annotations_filter(timestamp=timestamp(old_ms)))
    assert after_old[0].body == "new"
    before_old = await in_thread(
        consume, url, 1, annotations_filter(timestamp=timestamp(old_ms - 1))
    )
    assert before_old[0].body == "old"
    assert delivery_annotations(before_old[0])[TIMESTAMP] == old_ms


async def test_credit_is_honoured_exactly(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, list(range(10)))

    def take() -> tuple[list[Any], int, list[Any]]:
        with connected(url) as conn:
            receiver = conn.create_receiver(
                "events", credit=0, options=annotations_filter(offset="@earliest")
            )
            fetcher = receiver.fetcher
            assert fetcher is not None
            receiver.link.flow(3)
            conn.wait(lambda: fetcher.has_message >= 3)
            # A round trip on the same connection: anything sent beyond the credit is in by now.
            info = conn.create_receiver("events/$info", credit=1)
            info.receive()
            queued = fetcher.has_message
            first = [receiver.receive().body for _ in range(3)]
            receiver.link.flow(2)
            more = [receiver.receive().body for _ in range(2)]
            return first, queued, more

    first, queued, more = await in_thread(take)
    assert (first, queued, more) == ([0, 1, 2], 3, [3, 4])


async def test_no_filter_gets_only_new_events(amqp_server: EventServer, alice: Any) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, ["before"])
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()

    def new_only() -> Message:
        with connected(url) as conn:
            receiver = conn.create_receiver("events", credit=10)
            loop.call_soon_threadsafe(ready.set)
            message = receiver.receive()
            receiver.accept()
            return message

    consumer = asyncio.ensure_future(in_thread(new_only))
    await ready.wait()
    # added over FTN3: the same log
    await alice.add_event("T", "after")
    message = await consumer
    assert message.body == "after"


async def test_added_over_amqp_is_polled_over_ftn3(
    amqp_server: EventServer, alice: EventStreamClient
) -> None:
    await in_thread(produce, amqp_server.amqp_url or "", [{"via": "amqp"}], "AMQP_EVT")
    await alice.register_consumer("c1")
    events = await alice.poll_events("c1")
    assert [(e.type, e.data) for e in events] == [("AMQP_EVT", {"via": "amqp"})]


async def test_a_drain_has_what_another_process_acknowledged_before_it(
    start_server: ServerFactory,
) -> None:
    """Two servers on one SQLite file that are not workers of one server hear of each
    other's events only by polling the file (here: not within the test). A link drained on
    one gets the event the other acknowledged before the drain, not "nothing more"."""
    writer = await start_server()
    reader = await start_server(amqp=AmqpConfig(port=0), other_writers_seconds=3600)
    assert reader.amqp is not None
    peer = await logged_in(reader.amqp.port)
    await peer.send(attach("out", 0, "events", receiver=False))  # from the newest event on
    await peer.until(ATTACH)
    credentials = f"alice:{USERS['alice']}"
    async with await EventStreamClient.connect(writer.url, credentials=credentials) as client:
        added = await client.add_event("E", {"n": 1})
    drain = [uint(0), uint(5000), uint(0), uint(5000), uint(0), uint(0), uint(10), None, True]
    await peer.send(frame(FLOW, drain))
    async with asyncio.timeout(30):
        while (answer := await peer.next_frame()) is not None:
            if answer.descriptor in (TRANSFER, FLOW):
                break
    assert answer is not None
    assert (answer.descriptor, answer.fields[2]) == (TRANSFER, str(added).encode())
    await peer.close()


async def test_data_sections(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""

    def send() -> None:
        with connected(url) as conn:
            sender = conn.create_sender("events")
            json_body = Message(subject="J", body=b'{"a": [1, 2]}', inferred=True)
            json_body.content_type = "application/json"
            sender.send(json_body)
            sender.send(Message(subject="B", body=b"\x00\xffraw", inferred=True))

    await in_thread(send)
    messages = await in_thread(consume, url, 2, annotations_filter(offset="@earliest"))
    # each goes back out as it came: the same section, bytes and content type
    assert (messages[0].inferred, messages[0].content_type) == (True, "application/json")
    assert messages[0].body == b'{"a": [1, 2]}'
    assert messages[1].inferred
    assert messages[1].body == b"\x00\xffraw"


@pytest.mark.parametrize(
    ("message", "condition"),
    [
        (Message(subject="", body=1), "amqp:invalid-field"),  # an empty subject: no event type
        (Message(subject="lower", body=1), "amqp:invalid-field"),  # not an FTN18 type
        (Message(subject="T", body=b"x"), "amqp:invalid-field"),  # binary amqp-value
        (Message(subject="T", body={1: 2}), "amqp:invalid-field"),  # non-string map keys
        (
            Message(subject="T", body=b"{no json", inferred=True, content_type="application/json"),
            "amqp:decode-error",
        ),
    ],
)
async def test_messages_that_cannot_be_events_are_rejected(
    amqp_server: EventServer, message: Message, condition: str
) -> None:
    def send() -> tuple[int, str | None]:
        with connected(amqp_server.amqp_url or "") as conn:
            sender = conn.create_sender("events")
            outcome = send_outcome(sender, message)
            sender.send(Message(subject="OK", body=1))  # the link goes on
            return outcome

    assert await in_thread(send) == (Delivery.REJECTED, condition)
    rows = await amqp_server.store.read_rows(0, limit=10)
    assert [r[1] for r in rows] == ["OK"]


async def test_info(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""

    def info() -> Any:
        with connected(url) as conn:
            receiver = conn.create_receiver("events/$info", credit=1)
            message = receiver.receive()
            receiver.accept()
            return message.body

    empty = await in_thread(info)
    assert empty[symbol("partitions")] == [
        {symbol("partition"): "0", symbol("earliest-offset"): None, symbol("latest-offset"): None}
    ]
    await in_thread(produce, url, [1, 2, 3])
    partition = (await in_thread(info))[symbol("partitions")][0]
    assert partition[symbol("earliest-offset")] == format_offset(1)
    assert partition[symbol("latest-offset")] == format_offset(3)


@pytest.mark.parametrize(
    ("address", "options", "condition"),
    [
        ("nowhere", None, "amqp:not-found"),
        ("events", LinkProperties(event_streams_partition=symbol("1")), "amqp:not-found"),
        ("events", LinkProperties(event_streams_partition=7), "amqp:invalid-field"),
        ("events", annotations_filter(offset="not-an-offset"), "amqp:invalid-field"),
        ("events", annotations_filter(colour="red"), "amqp:invalid-field"),
    ],
)
async def test_refused_links(
    amqp_server: EventServer, address: str, options: Any, condition: str
) -> None:
    url = amqp_server.amqp_url or ""

    def attach() -> None:
        with connected(url) as conn:
            conn.create_receiver(address, options=options)

    with pytest.raises((LinkDetached, LinkException), match=condition):
        await in_thread(attach)
    # the connection's peers are unaffected
    await in_thread(produce, url, [1])


async def test_tls(start_server: ServerFactory, tmp_path: Path) -> None:
    authority = trustme.CA()
    cert = authority.issue_cert("futoin-evt.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    server = await start_server(amqp=AmqpConfig(port=0, tls=context))
    assert server.amqp_url is not None
    assert server.amqp_url.startswith("amqps://")
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca_file))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)

    def round_trip() -> Any:
        with connected(server.amqp_url or "", ssl_domain=domain, sni="futoin-evt.test") as conn:
            conn.create_sender("events").send(Message(subject="TLS", body="secret"))
            receiver = conn.create_receiver(
                "events", credit=1, options=annotations_filter(offset="@earliest")
            )
            message = receiver.receive()
            receiver.accept()
            return message.body

    assert await in_thread(round_trip) == "secret"


async def test_connections_over_the_limit_are_refused(start_server: ServerFactory) -> None:
    server = await start_server(amqp=AmqpConfig(port=0, limits=AmqpLimits(max_connections=1)))
    url = server.amqp_url or ""

    def second_while_first_open() -> None:
        with connected(url), connected(url):
            pass

    with pytest.raises(ConnectionException):
        await in_thread(second_while_first_open)
    await in_thread(produce, url, [1])  # the slot is free again


async def test_silent_peers_are_disconnected(start_server: ServerFactory) -> None:
    server = await start_server(amqp=AmqpConfig(port=0, limits=AmqpLimits(idle_timeout=0.2)))
    assert server.amqp is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.amqp.port)
    writer.write(SASL_HEADER)  # ... and then nothing
    assert (await reader.read(8)) == SASL_HEADER
    async with asyncio.timeout(30):
        while await reader.read(4096):
            pass  # the mechanisms, then the end of the stream
    writer.close()


async def test_a_message_over_the_size_limit_detaches_the_link(
    start_server: ServerFactory,
) -> None:
    limits = AmqpLimits(node=NodeLimits(max_message_bytes=10_000))
    server = await start_server(amqp=AmqpConfig(port=0, limits=limits))
    url = server.amqp_url or ""

    def send_large() -> None:
        with connected(url) as conn:
            sender = conn.create_sender("events")
            sender.send(Message(subject="BIG", body="x" * 20_000))

    with pytest.raises((LinkDetached, SendException), match="message-size-exceeded"):
        await in_thread(send_large)
    await in_thread(produce, url, ["small"])
    rows = await server.store.read_rows(0, limit=10)
    assert [r[1] for r in rows] == ["T"]


GROUP = symbol("event-streams-consumer-group")
EPOCH = symbol("event-streams-epoch")
SQL_FILTER = ulong(0x201)
SELECTOR = symbol("apache.org:selector-filter:string")


def sql_filter(text: str, descriptor: Any = SQL_FILTER) -> Filter:
    return Filter({symbol("sql"): Described(descriptor, text)})


def produce_unsettled(url: str, bodies: list[Any]) -> None:
    """Send everything without waiting for each outcome; return once all are accepted."""
    with connected(url) as conn:
        sender = conn.create_sender("events")
        link: Any = sender.link
        deliveries = [link.send(Message(subject="T", body=body)) for body in bodies]
        conn.wait(lambda: all(d.remote_state for d in deliveries), timeout=120)
        assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}


async def test_sql_and_selector_filters(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce_unsettled, url, list(range(1, 10_001)))
    between = sql_filter(
        f"d.event-streams-offset > '{format_offset(9000)}'"
        f" AND d.event-streams-offset <= '{format_offset(9003)}' OR FALSE"
    )
    messages = await in_thread(consume, url, 3, between)
    assert [m.body for m in messages] == [9001, 9002, 9003]
    selector = sql_filter("amqp.annotation.x-opt-offset > '9997'", SELECTOR)
    messages = await in_thread(consume, url, 3, selector)
    assert [m.body for m in messages] == [9998, 9999, 10000]


async def test_bad_sql_filter_is_refused(amqp_server: EventServer) -> None:
    def attach() -> None:
        with connected(amqp_server.amqp_url or "") as conn:
            conn.create_receiver("events", options=sql_filter("d.event-streams-offset >"))

    with pytest.raises((LinkDetached, LinkException), match="invalid-field"):
        await in_thread(attach)


async def test_consumer_group_epochs(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""

    def scenario() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        with connected(url) as first_conn, connected(url) as second_conn:
            first = first_conn.create_receiver(
                "events", credit=1, options=LinkProperties(event_streams_consumer_group="g")
            )
            outcome["first epoch"] = first.link.remote_properties[EPOCH]
            for epoch in (None, 0):
                try:
                    options = LinkProperties(event_streams_consumer_group="g")
                    if epoch is not None:
                        options.properties[EPOCH] = epoch
                    second_conn.create_receiver(
                        "events", credit=1, name=f"epoch-{epoch}", options=options
                    )
                except (LinkDetached, LinkException) as exc:
                    outcome[f"epoch {epoch}"] = str(exc)
            newer = second_conn.create_receiver(
                "events",
                credit=1,
                name="newer",
                options=LinkProperties(event_streams_consumer_group="g", event_streams_epoch=5),
            )
            outcome["newer epoch"] = newer.link.remote_properties[EPOCH]
            with pytest.raises(LinkDetached) as stolen:
                first.receive()
            outcome["first closed with"] = stolen.value.condition
            # another user's group of the same name is another group
        with connected(url, "bob") as bob:
            bob.create_receiver(
                "events", credit=1, options=LinkProperties(event_streams_consumer_group="g")
            )
        return outcome

    outcome = await in_thread(scenario)
    assert outcome["first epoch"] == 0
    assert "amqp:resource-locked" in outcome["epoch None"]
    assert "amqp:resource-locked" in outcome["epoch 0"]
    assert outcome["newer epoch"] == 5
    assert outcome["first closed with"] == "amqp:link:stolen"


async def test_group_bound_to_a_registered_consumer(
    amqp_server: EventServer, alice: EventStreamClient
) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, [1, 2, 3, 4, 5])
    group = LinkProperties(event_streams_consumer_group="ftn18:billing")

    def take_three_accept_two() -> list[Any]:
        with connected(url) as conn:
            receiver = conn.create_receiver("events", credit=0, options=group)
            receiver.link.flow(3)
            bodies = [receiver.receive().body for _ in range(3)]
            receiver.accept()
            receiver.accept()  # the third stays unsettled
            receiver.close()  # type: ignore[no-untyped-call]  # answered once the position is stored
            return bodies

    # a new consumer starts before the oldest event, as over FTN3
    assert await in_thread(take_three_accept_two) == [1, 2, 3]
    user = await amqp_server.store.get_user("alice")
    assert user is not None
    assert await amqp_server.store.position(user.id, "billing") == 2
    # FTN3 sees the same consumer: the next poll starts after the stored position
    events = await alice.poll_events("billing")
    assert [e.data for e in events] == [3, 4, 5]
    # ... and so does a new link of the group: the unsettled event comes again
    again = await in_thread(consume, url, 1, group)
    assert [m.body for m in again] == [3]


async def test_added_over_amqp_is_pushed_over_ftn3(amqp_server: EventServer) -> None:
    await in_thread(produce, amqp_server.amqp_url or "", [{"n": 1}, {"n": 2}], "PUSHED")
    received: list[Event] = []

    async def on_events(events: list[Event]) -> None:
        received.extend(events)

    receiver = ReliableReceiver(
        amqp_server.url, credentials="alice:alice-pw", component="PUSH", on_events=on_events
    )
    task = asyncio.ensure_future(receiver.run())
    await asyncio.wait_for(receiver.progress.wait_beyond(1), 30)
    receiver.stop()
    await task
    assert [(e.type, e.data) for e in received] == [("PUSHED", {"n": 1}), ("PUSHED", {"n": 2})]


@pytest.mark.interop
async def test_added_over_amqp_reaches_the_official_js_client(
    js_peer: Path, amqp_server: EventServer
) -> None:
    await in_thread(produce, amqp_server.amqp_url or "", [{"via": "amqp"}], "FROM_AMQP")
    scenario = {
        "endpoint": "secure+" + amqp_server.url,
        "credentials": "alice:alice-pw",
        "calls": [
            {"face": "poll", "version": "1.1", "method": m, "args": a}
            for m, a in (("registerConsumer", ["JS"]), ("pollEvents", ["JS", None, None]))
        ],
    }
    out = await run_js(js_peer, "calls.js", scenario)
    events = out[-1]["ok"]
    assert [(e["id"], e["type"], e["data"]) for e in events] == [
        ("1", "FROM_AMQP", {"via": "amqp"})
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--amqp", "nowhere"], "--amqp must be HOST:PORT"),
        (["--amqp", "127.0.0.1:99999"], "--amqp must be HOST:PORT"),
        (["--amqp", "127.0.0.1:0", "--amqp-idle-timeout", "0"], "must be above 0"),
        (["--amqp", "127.0.0.1:{busy}"], "cannot listen on 127.0.0.1:{busy} (--amqp): "),
    ],
)
def test_serve_amqp_option_errors(tmp_path: Path, args: list[str], message: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        result = subprocess.run(
            [sys.executable, "-m", "futoin_evt", "serve", "--db", str(tmp_path / "x.sqlite"),
             "--port", "0", *(a.replace("{busy}", port) for a in args)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2  # a bad setting
    assert message.replace("{busy}", port) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


async def test_links_per_connection_are_limited(start_server: ServerFactory) -> None:
    server = await start_server(amqp=AmqpConfig(port=0, limits=AmqpLimits(max_links=2)))
    url = server.amqp_url or ""

    def attach_three() -> None:
        with connected(url) as conn:
            for n in range(3):
                conn.create_receiver("events", name=f"r{n}")

    with pytest.raises((LinkDetached, LinkException), match="resource-limit-exceeded"):
        await in_thread(attach_three)


LONG_PARTITION = "events/Partitions/" + "1" * 60


async def test_event_hubs_addresses(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""

    def scenario() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        with connected(url) as conn:
            conn.create_sender("events/Partitions/0").send(Message(subject="EH", body=1))
            for name, address in (
                ("default", "events/ConsumerGroups/$Default/Partitions/0"),
                ("plain", "events/Partitions/0"),
            ):
                receiver = conn.create_receiver(
                    address, name=name, credit=1, options=annotations_filter(offset="@earliest")
                )
                message = receiver.receive()
                assert isinstance(message.body, memoryview | bytes)
                outcome[name] = (bytes(message.body), message.content_type)
                receiver.accept()
            conn.create_receiver("events/ConsumerGroups/shop/Partitions/0", name="g1")
            try:
                conn.create_receiver("events/ConsumerGroups/shop/Partitions/0", name="g2")
            except (LinkDetached, LinkException) as exc:
                outcome["second in group"] = str(exc)
            for n, address in enumerate(
                (
                    "events/Partitions/1",
                    "events/ConsumerGroups/x/Partitions/7",
                    "events/x/0",
                    LONG_PARTITION,
                )
            ):
                try:
                    conn.create_receiver(address, name=f"bad{n}")
                except (LinkDetached, LinkException) as exc:
                    outcome[address] = str(exc)
        return outcome

    outcome = await in_thread(scenario)
    # the Event Hubs forms get JSON data as JSON text (the amqp-value 1 was stored as JSON)
    assert outcome["default"] == outcome["plain"] == (b"1", "application/json")
    assert "amqp:resource-locked" in outcome["second in group"]
    for address in ("events/Partitions/1", "events/ConsumerGroups/x/Partitions/7", "events/x/0"):
        assert "amqp:not-found" in outcome[address]
    # a long value is quoted cut, with its length: never as a shorter value
    assert f"no such partition: '{'1' * 40}…' (60 characters)" in outcome[LONG_PARTITION]


async def test_management_reads_the_hub_and_its_partition(amqp_server: EventServer) -> None:
    url = amqp_server.amqp_url or ""
    await in_thread(produce, url, [1, 2, 3])
    read = {"operation": "READ", "name": "events"}
    replies = await in_thread(
        management_requests,
        url,
        [
            {**read, "type": "com.microsoft:eventhub"},
            {**read, "type": "com.microsoft:partition", "partition": "0"},
            {**read, "type": "com.microsoft:partition", "partition": "1"},
            {**read, "name": "other", "type": "com.microsoft:eventhub"},
            {"operation": "DELETE", "name": "events", "type": "com.microsoft:eventhub"},
        ],
    )
    (hub_status, hub), (partition_status, partition), *refusals = replies
    assert hub_status["status-code"] == 200
    assert hub["partition_ids"] == ["0"]
    assert hub["partition_count"] == 1
    assert partition_status["status-code"] == 200
    assert partition["begin_sequence_number"] == 1
    assert partition["last_enqueued_sequence_number"] == 3
    assert partition["last_enqueued_offset"] == format_offset(3)
    assert partition["is_partition_empty"] is False
    assert [status["status-code"] for status, _body in refusals] == [404, 404, 400]
