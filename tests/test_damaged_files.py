"""Damaged files: an event whose stored content changed after it was stored (a digit changed
in the SQLite file while the server was stopped, a row changed by SQL on PostgreSQL) is never
served. Every door refuses it, naming the partition and the id (FTN3 InternalError, HTTP 500,
WebSocket close 1008, AMQP detach with amqp:internal-error); the server logs it once, however
often it is read, and ``futoin_evt_damaged_events_total`` counts it; ``futoin-evt check``
lists it. A file cut short by a page, or with a damaged page SQLite's quick check finds, is
refused by ``serve`` in one line. Events stored before checksums existed are served as
before and counted as unchecked.

Against ``futoin-evt serve`` as its own process (one worker: the log line and the metric are
each process's own), with the official clients of each door.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from google_crc32c import value
from proton.utils import BlockingConnection, LinkDetached

from futoin_evt.amqp.codec import format_offset
from futoin_evt.client.aio import OPS, EventStreamClient, FTN3Client, RemoteError
from futoin_evt.client.notify import Notifications
from futoin_evt.client.receiver import PUSH, RECEIVER
from futoin_evt.storage.checksums import ATTRS_VERSION, CHECKSUMS_VERSION, event_checksum
from futoin_evt.storage.sqlite.schema import MIGRATIONS, partition_tables_sql

from .support.amqp import annotations_filter
from .support.cli import run
from .support.servers import ServerProcess

pytestmark = pytest.mark.functional

PASSWORD: Final = "alice-pw"
CREDENTIALS: Final = f"alice:{PASSWORD}"
WITHIN: Final = 30.0
#: The digits changed in the stored data of the third event: 7777001 becomes 7777091.
STORED: Final = b"7777001"
CHANGED: Final = b"7777091"


def make_user(db: str) -> None:
    added = run("user", "add", "alice", "--password-stdin", "--db", db, stdin=PASSWORD + "\n")
    assert added.returncode == 0, added.stderr
    granted = run("grant", "alice", "read,write", "*", "--db", db)
    assert granted.returncode == 0, granted.stderr


def serve(db: str) -> ServerProcess:
    return ServerProcess(
        db, 0, "--amqp", "127.0.0.1:0", "--metrics", "127.0.0.1:0", workers=1, log_level="warning"
    )


async def add_events(url: str, path: str = "") -> list[int]:
    """Five events; the third holds :data:`STORED`."""
    async with await EventStreamClient.connect(url + path, credentials=CREDENTIALS) as client:
        return [
            await client.add_event("ORDER", {"order": n, "amount": int(STORED) if n == 3 else n})
            for n in range(1, 6)
        ]


def change_one_digit(path: Path) -> None:
    """What a damaged disk does: one digit changed inside the stored data, in the file."""
    with sqlite3.connect(path) as conn:  # the server is stopped: its WAL goes into the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    content = path.read_bytes()
    assert content.count(STORED) == 1
    path.write_bytes(content.replace(STORED, CHANGED))


def metric(server: ServerProcess, stream: str, partition: int) -> float:
    match = re.search(r"http://[^ ]+/metrics", server.line)
    assert match is not None, server.line
    text = httpx.get(match.group(0), timeout=WITHIN).text
    line = f'futoin_evt_damaged_events_total{{partition="{partition}",stream="{stream}"}} '
    for row in text.splitlines():
        if row.startswith(line):
            return float(row[len(line) :])
    raise AssertionError(f"no {line} in the metrics")


def one_line(stderr: str, words: str) -> None:
    """A refusal in one line that says ``words``."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert words in lines[0], stderr


def basic() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()}


async def closed_with(client: FTN3Client) -> tuple[int, str]:
    async with asyncio.timeout(WITHIN):
        await client.wait_closed()
    close = client._io.ws.close_rcvd
    assert close is not None
    return int(close.code), close.reason


def amqp_detach(url: str, address: str, options: Any) -> str:
    """The condition and description the node detaches a receiver with."""
    conn = BlockingConnection(
        url, user="alice", password=PASSWORD, allowed_mechs="PLAIN", timeout=30
    )
    try:
        receiver = conn.create_receiver(address, credit=10, options=options)
        receiver.receive(timeout=WITHIN)
    except LinkDetached as exc:
        return str(exc)
    finally:
        conn.close()
    raise AssertionError("the receiver got a message")


async def ftn3_refusal(url: str, call: Any) -> str:
    async with await EventStreamClient.connect(url, credentials=CREDENTIALS) as client:
        with pytest.raises(RemoteError) as refused:
            await call(client)
    assert refused.value.name == "InternalError"
    return refused.value.desc


@pytest.fixture
def damaged_sqlite(db_path: Path) -> Iterator[tuple[ServerProcess, list[int]]]:
    """A served SQLite file whose third event had a digit changed while it was stopped."""
    make_user(str(db_path))
    first = serve(str(db_path))
    try:
        ids = asyncio.run(add_events(first.url))
    finally:
        assert first.stop() == 0
    change_one_digit(db_path)
    server = serve(str(db_path))
    try:
        yield server, ids
    finally:
        if server.proc.returncode is None:  # not stopped by the test
            server.stop()


async def test_a_changed_digit_is_refused_at_every_door(
    damaged_sqlite: tuple[ServerProcess, list[int]], db_path: Path
) -> None:
    server, ids = damaged_sqlite
    sentence = f"event {ids[2]} in partition events/0 is damaged"
    url, http = server.url, server.url.replace("ws://", "http://", 1).rstrip("/")

    # FTN18: a LIVE poll, a registered consumer's poll, and readEvents (the Spark source's)
    assert sentence in await ftn3_refusal(url, lambda c: c.poll_events("LIVE", last_id=1))

    async def registered_poll(client: EventStreamClient) -> Any:
        await client.register_consumer("BILLING")
        return await client.poll_events("BILLING")

    assert sentence in await ftn3_refusal(url, registered_poll)
    read_range = {"component": "BILLING", "after_id": "0"}
    assert sentence in await ftn3_refusal(url, lambda c: c.ftn3.call(OPS, "readEvents", read_range))

    # FTN18 push: the stream ends, its connection closed with the sentence
    pushed = await FTN3Client.connect(url, credentials=CREDENTIALS)
    received: list[int] = []

    async def on_events(params: dict[str, Any]) -> bool:
        received.extend(int(e["id"]) for e in params["events"])
        return True

    pushed.on_request(RECEIVER, "onEvents", on_events)
    await pushed.call(PUSH, "registerConsumer", {"component": "PUSHED"})
    assert await pushed.call(PUSH, "readyToReceive", {"component": "PUSHED"}) is True
    code, reason = await closed_with(pushed)
    assert (code, sentence in reason) == (1008, True), reason
    assert ids[2] not in received

    # event notification over FTN3
    listening = await FTN3Client.connect(url, credentials=CREDENTIALS)
    await Notifications(listening).subscribe(stream="events", after=[0])
    code, reason = await closed_with(listening)
    assert (code, sentence in reason) == (1008, True), reason

    # the HTTP feed and DCB: 500 with the sentence
    async with httpx.AsyncClient(base_url=http, headers=basic(), timeout=WITHIN) as client:
        feed = await client.get("/feeds/events", params={"n": "1", "cursor0": "_first"})
        assert (feed.status_code, sentence.capitalize() in feed.text) == (500, True), feed.text
        dcb = await client.post("/dcb/v1/read", json={"limit": 10})
        assert (dcb.status_code, sentence.capitalize() in dcb.text) == (500, True), dcb.text

    # AMQP: a consumer link from the start, and a notification link
    assert server.amqp_url is not None
    detached = await asyncio.to_thread(
        amqp_detach, server.amqp_url, "events", annotations_filter(offset=format_offset(0))
    )
    assert "amqp:internal-error" in detached, detached
    assert sentence in detached, detached

    # the events around it are served as they were stored
    async with await EventStreamClient.connect(url, credentials=CREDENTIALS) as reader:
        assert [e.data["order"] for e in await reader.poll_events("LIVE", last_id=ids[2])] == [4, 5]

    # counted once, logged once, however often it was read
    assert metric(server, "events", 0) == 1
    status, logged = server.stop_and_read_log(timeout=WITHIN)
    assert status == 0
    assert [line for line in logged.splitlines() if "is damaged" in line] == [
        next(line for line in logged.splitlines() if sentence in line)
    ], logged

    checked = run("check", "--db", str(db_path))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"damaged: event {ids[2]} in partition events/0" in checked.stdout
    assert "events matching their checksums: 4" in checked.stdout
    assert "SQLite integrity_check: ok" in checked.stdout


def test_check_finds_nothing_in_a_sound_file(db_path: Path) -> None:
    make_user(str(db_path))
    server = serve(str(db_path))
    try:
        asyncio.run(add_events(server.url))
        checked = run("check", "--db", str(db_path))  # beside the serving server
    finally:
        server.stop()
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "events matching their checksums: 5" in checked.stdout
    assert "nothing damaged" in checked.stdout
    missing = run("check", "--db", str(db_path.with_name("missing.sqlite")))
    assert missing.returncode == 2
    one_line(missing.stderr, "no database file")
    other = db_path.with_name("other.sqlite")
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
    foreign = run("check", "--db", str(other))  # another program's database
    assert foreign.returncode == 2
    one_line(foreign.stderr, "holds no futoin-evt data")


def test_check_reads_a_file_from_before_attributes_as_it_is(db_path: Path) -> None:
    """``check`` reads a file as the release before attributes left it (it migrates nothing):
    its events are checked, a changed one found."""
    ts = "2026-01-01T00:00:00Z"
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version in range(1, ATTRS_VERSION):
            conn.executescript(MIGRATIONS[version])
        conn.execute("INSERT INTO schema_version VALUES (?)", (ATTRS_VERSION - 1,))
        conn.executemany(
            "INSERT INTO events (type, data, ts, checksum) VALUES ('OLD', ?, ?, ?)",
            [(str(n), ts, event_checksum("OLD", "1", ts)) for n in (1, 2)],
        )
        conn.commit()
    checked = run("check", "--db", str(db_path))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "events matching their checksums: 1" in checked.stdout
    assert "damaged: event 2 in partition events/0" in checked.stdout


def test_a_file_cut_short_by_a_page_is_refused_at_start(db_path: Path) -> None:
    make_user(str(db_path))
    server = serve(str(db_path))
    try:
        asyncio.run(add_events(server.url))
    finally:
        server.stop()
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    os.truncate(db_path, db_path.stat().st_size - page_size)
    refused = run("serve", "--db", str(db_path), "--port", "0", "--workers", "1")
    assert refused.returncode == 2
    one_line(refused.stderr, "is damaged")
    checked = run("check", "--db", str(db_path))
    assert checked.returncode == 1
    one_line(checked.stderr, "is damaged")


def test_a_damaged_index_page_is_refused_at_start(db_path: Path) -> None:
    """A page the start itself never reads (an index of the events): only the quick check
    finds it; ``--start-check 0`` skips it."""
    make_user(str(db_path))
    server = serve(str(db_path))
    try:
        asyncio.run(add_events(server.url))
    finally:
        server.stop()
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'events_by_type'"
        ).fetchone()
    with db_path.open("r+b") as file:  # the page's cells, past its header
        file.seek((root - 1) * page_size + page_size // 2)
        file.write(b"\xff" * (page_size // 2))
    refused = run("serve", "--db", str(db_path), "--port", "0", "--workers", "1")
    assert refused.returncode == 2
    one_line(refused.stderr, "is damaged")
    checked = run("check", "--db", str(db_path))
    assert checked.returncode == 1
    assert "SQLite integrity_check: ok" not in checked.stdout, checked.stdout
    skipped = ServerProcess(db_path, 0, "--start-check", "0", workers=1)
    status, logged = skipped.stop_and_read_log(timeout=WITHIN)
    assert status == 0, logged


async def test_events_from_before_checksums_are_served_and_counted_unchecked(
    db_path: Path,
) -> None:
    """A file at the schema version before checksums, with events in ``events``/0 and in a
    stream's partition: the server migrates it, serves the old events as stored (a changed
    one too: nothing says it changed), and new events get checksums in every partition."""
    old = [(json.dumps({"n": n}),) for n in range(3)]
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version in range(1, CHECKSUMS_VERSION):
            conn.executescript(MIGRATIONS[version])
        conn.execute("INSERT INTO schema_version VALUES (?)", (CHECKSUMS_VERSION - 1,))
        conn.execute("INSERT INTO streams VALUES ('orders', '2026-01-01T00:00:00Z', NULL)")
        conn.execute("INSERT INTO partitions (key, stream, number) VALUES (1, 'orders', 0)")
        for statement in partition_tables_sql(1):
            conn.execute(statement)
        conn.execute("DROP INDEX events_1_by_key")
        for column in ("checksum", "attrs", "key_user_id", "key", "key_at"):  # as before
            conn.execute(f"ALTER TABLE events_1 DROP COLUMN {column}")
        for table in ("events", "events_1"):
            conn.executemany(
                f"INSERT INTO {table} (type, data, ts) VALUES ('OLD', ?, '2026-01-01T00:00:00Z')",
                old,
            )
        conn.execute("""UPDATE events SET data = '{"n": 9}' WHERE id = 3""")
    make_user(str(db_path))
    server = serve(str(db_path))
    try:
        for path, served in (("", [0, 1, 9]), ("orders/0", [0, 1, 2])):
            async with await EventStreamClient.connect(
                server.url + path, credentials=CREDENTIALS
            ) as client:
                events = await client.poll_events("LIVE", last_id=0)
                assert [e.data["n"] for e in events] == served
        await add_events(server.url)
        await add_events(server.url, "orders/0")
    finally:
        server.stop()
    checked = run("check", "--db", str(db_path))
    assert checked.returncode == 0, checked.stdout
    assert "events matching their checksums: 10" in checked.stdout
    assert "events stored before checksums (not checked): 6" in checked.stdout


def test_a_damaged_event_of_a_stream_partition_names_it(db_path: Path) -> None:
    make_user(str(db_path))
    assert run("stream", "add", "orders", "--partitions", "3", "--db", str(db_path)).returncode == 0
    server = serve(str(db_path))
    try:
        ids = asyncio.run(add_events(server.url, "orders/2"))
    finally:
        server.stop()
    change_one_digit(db_path)
    server = serve(str(db_path))
    try:
        desc = asyncio.run(
            ftn3_refusal(server.url + "orders/2", lambda c: c.poll_events("LIVE", last_id=0))
        )
        assert f"event {ids[2]} in partition orders/2 is damaged" in desc
        assert metric(server, "orders", 2) == 1
    finally:
        server.stop()
    checked = run("check", "--db", str(db_path))
    assert f"damaged: event {ids[2]} in partition orders/2" in checked.stdout


async def test_postgres_a_row_changed_by_sql_is_refused(pg_url: str) -> None:
    make_user(pg_url)
    assert run("stream", "add", "orders", "--partitions", "2", "--db", pg_url).returncode == 0
    first = serve(pg_url)
    try:
        ids = await add_events(first.url)
        part = await add_events(first.url, "orders/1")
    finally:
        first.stop()
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key FROM partitions WHERE stream = 'orders' AND number = 1"
        ).fetchone()
        assert row is not None
        for table, event_id in (("events", ids[2]), (f"events_{row[0]}", part[2])):
            conn.execute(
                f"UPDATE {table} SET data = replace(data, %s, %s) WHERE id = %s",
                (STORED.decode(), CHANGED.decode(), event_id),
            )
    server = serve(pg_url)
    try:
        sentence = f"event {ids[2]} in partition events/0 is damaged"
        assert sentence in await ftn3_refusal(server.url, lambda c: c.poll_events("LIVE", 1))
        in_orders = await ftn3_refusal(server.url + "orders/1", lambda c: c.poll_events("LIVE", 1))
        assert f"event {part[2]} in partition orders/1 is damaged" in in_orders
        http = server.url.replace("ws://", "http://", 1).rstrip("/")
        async with httpx.AsyncClient(base_url=http, headers=basic(), timeout=WITHIN) as client:
            dcb = await client.post("/dcb/v1/read", json={"limit": 10})
            assert (dcb.status_code, sentence.capitalize() in dcb.text) == (500, True), dcb.text
        assert server.amqp_url is not None
        detached = await asyncio.to_thread(
            amqp_detach, server.amqp_url, "events", annotations_filter(offset=format_offset(0))
        )
        assert "amqp:internal-error" in detached, detached
        assert sentence in detached, detached
        assert (metric(server, "events", 0), metric(server, "orders", 1)) == (1, 1)
        status, logged = server.stop_and_read_log(timeout=WITHIN)
        assert status == 0
        assert len([line for line in logged.splitlines() if "is damaged" in line]) == 2, logged
    finally:
        if server.proc.returncode is None:
            server.stop()
    checked = run("check", "--db", pg_url)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"damaged: event {ids[2]} in partition events/0" in checked.stdout
    assert f"damaged: event {part[2]} in partition orders/1" in checked.stdout
    assert "events matching their checksums: 8" in checked.stdout
    assert "password" not in checked.stdout


def test_checksum_covers_type_data_time_and_content_type() -> None:
    base = event_checksum("T", '{"a":1}', "2026-01-01T00:00:00Z")
    assert 0 <= base < 2**32
    others = {
        event_checksum("U", '{"a":1}', "2026-01-01T00:00:00Z"),
        event_checksum("T", '{"a":2}', "2026-01-01T00:00:00Z"),
        event_checksum("T", '{"a":1}', "2026-01-01T00:00:01Z"),
        event_checksum("T", '{"a":1}', "2026-01-01T00:00:00Z", ""),
        event_checksum("T", '{"a":1}', "2026-01-01T00:00:00Z", "text/plain"),
    }
    assert base not in others
    assert len(others) == 5
    # CRC32C (the iSCSI check value of "123456789") of the bytes the module says
    assert value(b"123456789") == 0xE3069283
    assert event_checksum("T", "d", "ts") == value(b"T\0d\0ts")
    # attributes after the rest, behind two NULs: never the sum of a content type
    assert event_checksum("T", "d", "ts", None, '{"k":"a"}') == value(b'T\0d\0ts\0\0{"k":"a"}')
    assert event_checksum("T", "d", "ts", "c", '{"k":"a"}') == value(b'T\0d\0ts\0c\0\0{"k":"a"}')
    assert event_checksum("T", "d", "ts", '{"k":"a"}') != event_checksum(
        "T", "d", "ts", None, '{"k":"a"}'
    )
