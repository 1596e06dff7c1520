"""PostgreSQL: the command line with a URL, the native extension, and several server
processes on one database (what the contract suite cannot show from one process)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from futoin_evt.client.aio import CommError, Event, EventStreamClient, RemoteError
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.stream import EventRejected
from futoin_evt.storage import open_store
from futoin_evt.storage.head import HeadWatch
from futoin_evt.storage.postgres import add_event, add_event_async
from futoin_evt.storage.postgres.schema import LOCK_NAMESPACE, RETENTION_LOCK

from .support.cli import CLI, run
from .support.dcb import assert_no_lost_update, race_on_one_tag
from .support.js import run_js
from .support.servers import USERS, ServerProcess, add_user, free_port
from .support.sql import PgCluster, execute_sql
from .support.waiting import until

pytestmark = [pytest.mark.functional, pytest.mark.postgres]

BIG = 1 << 20
ALICE = "alice:" + USERS["alice"]


# -- the command line ------------------------------------------------------------------------


def test_user_commands_take_a_url_from_the_option_or_the_environment(pg_url: str) -> None:
    assert (
        run("user", "add", "carol", "--password-stdin", "--db", pg_url, stdin="c\n").returncode == 0
    )
    env = {"FUTOIN_EVT_DB": pg_url}
    added = run("user", "add", "dave", "--password-stdin", "--admin", stdin="d\n", env=env)
    assert added.returncode == 0, added.stderr
    assert run("user", "list", env=env).stdout == "carol\ndave (admin)\n"
    assert run("user", "passwd", "carol", "--password-stdin", env=env, stdin="e\n").returncode == 0
    assert run("user", "remove", "dave", "--db", pg_url).returncode == 0
    again = run("user", "remove", "dave", "--db", pg_url)
    assert (again.returncode, again.stderr) == (1, "futoin-evt: no user dave.\n")
    hashes = [row[0] for row in execute_sql(pg_url, "SELECT password_hash FROM users")]
    assert len(hashes) == 1
    assert hashes[0].startswith("scrypt$")


@pytest.mark.parametrize(
    ("db", "says"),
    [
        ("postgresql://postgres@127.0.0.1:{port}/x", "Connection refused"),
        ("postgres://postgres@127.0.0.1:99999/x", "invalid port number"),
        ("postgresql://postgres@127.0.0.1/futoin_evt_no_such_db", "does not exist"),
    ],
)
@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["user", "list"]])
def test_a_bad_or_unreachable_database_is_one_sentence_and_status_2(
    pg_database: str, command: list[str], db: str, says: str
) -> None:
    db = db.format(port=free_port())
    result = run(*command, "--db", db)
    assert result.returncode == 2
    assert result.stderr.startswith("futoin-evt: cannot connect to the PostgreSQL database ")
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_the_driver_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; from futoin_evt.cli import main; "
        "sys.exit(main(['user', 'list', '--db', 'postgresql://postgres@127.0.0.1/x']))"
    )
    result = run_python(code)
    assert result.returncode == 2
    assert result.stderr == (
        "futoin-evt: a PostgreSQL database needs the driver: pip install 'futoin-evt[postgres]'.\n"
    )


def run_python(code: str) -> Any:
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_password_stays_out_of_what_is_printed(pg_database: str) -> None:
    url = pg_database.replace("postgres@", "postgres:s3cret-pw@")
    port = f":{urlsplit(url).port or 5432}/"
    listing = run("user", "list", "--db", url.replace(port, ":1/"))  # nothing listens there
    assert listing.returncode == 2
    assert "s3cret-pw" not in listing.stderr
    assert ":***@" in listing.stderr


# -- the native extension ----------------------------------------------------------------------


async def test_native_extension_commits_and_rolls_back_with_the_application(pg_url: str) -> None:
    async with await open_store(pg_url) as store:
        store.watch_other_writers(0.2)
        with psycopg.connect(pg_url) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.execute("INSERT INTO accounts VALUES (1, 100)")
            conn.commit()
            with conn.transaction():
                conn.execute("UPDATE accounts SET balance = 90 WHERE id = 1")
                event_id = add_event(conn, "XFER", {"amount": -10})

            def failing_transfer() -> None:
                with conn.transaction():
                    conn.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
                    add_event(conn, "XFER", {"amount": -90})
                    raise RuntimeError("the business step failed")

            with pytest.raises(RuntimeError):
                failing_transfer()
            balance = conn.execute("SELECT balance FROM accounts").fetchone()
        assert balance == (90,)
        # the store's head learns of the committed event (LISTEN) and readers see it
        async with asyncio.timeout(30):
            await store.head.wait_beyond(event_id - 1)
        page = json.loads((await store.read_events(0, max_bytes=BIG)).json)
        assert [(int(e["id"]), e["data"]) for e in page] == [(event_id, {"amount": -10})]
        # the rolled-back id is a gap; the server's own ids continue after it
        assert await store.append("T", "1") == event_id + 2


async def test_native_extension_async_and_rejects_bad_events(pg_url: str) -> None:
    async with await open_store(pg_url):
        pass
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        assert await add_event_async(conn, "A", [1]) == 1
        await conn.commit()
        with pytest.raises(EventRejected):
            await add_event_async(conn, "a", 1)
        with pytest.raises(EventRejected):
            await add_event_async(conn, "A", "x" * 70_000)
    assert execute_sql(pg_url, "SELECT id, type, data FROM events") == [(1, "A", "[1]")]


# -- several processes on one database ---------------------------------------------------------


ServersFactory = Callable[..., list[ServerProcess]]


@pytest.fixture
async def servers(
    pg_url: str, password_hashes: dict[str, str], serve_workers: int
) -> AsyncIterator[ServersFactory]:
    """Start ``futoin-evt serve`` processes on the test database (users alice and bob), each
    with one worker, then with two."""
    async with await open_store(pg_url) as store:
        for name, password_hash in password_hashes.items():
            await add_user(store, name, password_hash)
    started: list[ServerProcess] = []

    def start(count: int, *options: str) -> list[ServerProcess]:
        new = [ServerProcess(pg_url, 0, *options, workers=serve_workers) for _ in range(count)]
        started.extend(new)
        return new

    yield start
    for server in started:
        if server.proc.returncode is None:
            server.stop()


async def connect(url: str) -> EventStreamClient:
    return await EventStreamClient.connect(url, credentials=ALICE)


class Collector:
    """A Python ReliableReceiver's events, and a way to wait for an id."""

    def __init__(self, url: str, component: str) -> None:
        self.ids: list[int] = []
        self.receiver = ReliableReceiver(
            url, credentials=ALICE, component=component, on_events=self._got
        )
        self.task = asyncio.ensure_future(self.receiver.run())

    async def _got(self, events: list[Event]) -> None:
        self.ids.extend(event.id for event in events)

    async def wait_for(self, event_id: int) -> None:
        async with asyncio.timeout(60):
            await self.receiver.progress.wait_beyond(event_id - 1)

    async def stop(self) -> None:
        self.receiver.stop()
        await self.task


async def test_added_through_one_process_pushed_through_another(servers: ServersFactory) -> None:
    a, b = servers(2)
    async with await connect(b.url) as consumer:
        await consumer.register_consumer("PY")
    collector = Collector(b.url, "PY")
    async with await connect(a.url) as producer:
        ids = [await producer.add_event("ACROSS", {"n": i}) for i in range(200)]
    await collector.wait_for(ids[-1])
    await collector.stop()
    assert collector.ids == ids


@pytest.mark.interop
async def test_official_js_client_adds_on_one_process_and_receives_on_another(
    js_peer: Path, servers: ServersFactory
) -> None:
    from .support.push import JsReceiver

    a, b = servers(2)
    async with await connect(b.url) as consumer:
        await consumer.register_consumer("JS")
    receiver = await JsReceiver.start(js_peer, {
        "endpoint": "secure+" + b.url, "credentials": ALICE, "component": "JS", "count": 50,
    })  # fmt: skip
    added = await run_js(js_peer, "calls.js", {
        "endpoint": "secure+" + a.url, "credentials": ALICE,
        "calls": [{"face": "gen", "version": "1.1", "method": "addEvent", "args": ["JS", i]}
                  for i in range(50)],
    })  # fmt: skip
    got = await receiver.received()
    assert [e["id"] for e in got] == [r["ok"] for r in added]


async def poll_all(url: str, component: str, until: asyncio.Future[list[int]]) -> list[int]:
    """A reliable consumer polling (acknowledging as it goes) until it has every id ``until``
    resolves to."""
    seen: list[int] = []
    async with await connect(url) as client:
        await client.register_consumer(component)
        last_id: int | None = None
        while not until.done() or not seen or seen[-1] < max(until.result()):
            events = await client.poll_events(component, last_id, None)
            seen.extend(event.id for event in events)
            if events:
                last_id = events[-1].id
            else:
                await asyncio.sleep(0.005)  # backoff between empty polls; nothing waits on it
    return seen


async def test_four_processes_eight_producers_each_two_consumers_see_every_id_in_order(
    servers: ServersFactory,
) -> None:
    processes = servers(4)
    per_producer = 60

    async def produce(url: str, producer: int) -> list[int]:
        async with await connect(url) as client:
            return [await client.add_event("P", [producer, i]) for i in range(per_producer)]

    async def produce_all() -> list[int]:
        runs = [produce(p.url, n) for n, p in enumerate(processes) for _ in range(8)]
        return list(itertools.chain.from_iterable(await asyncio.gather(*runs)))

    # Both register before any event exists: events every registered consumer has read are
    # discarded, and a consumer registered later starts after them.
    async with await connect(processes[1].url) as client:
        await client.register_consumer("FIRST")
        await client.register_consumer("SECOND")
    production = asyncio.ensure_future(produce_all())
    first, second = await asyncio.gather(
        poll_all(processes[0].url, "FIRST", production),
        poll_all(processes[3].url, "SECOND", production),
    )
    added = production.result()
    assert len(added) == len(set(added)) == 4 * 8 * per_producer
    # Each consumer saw every id once, in increasing order: none it passed appeared later.
    assert first == sorted(added)
    assert second == sorted(added)


async def test_sigkill_of_one_process_loses_nothing_acknowledged(servers: ServersFactory) -> None:
    a, b = servers(2)
    async with await connect(b.url) as client:
        await client.register_consumer("ON_A")
        await client.register_consumer("ON_B")
    on_a, on_b = Collector(a.url, "ON_A"), Collector(b.url, "ON_B")
    acknowledged: list[int] = []
    half_way = asyncio.Event()

    async def produce(url: str) -> None:
        try:
            async with await connect(url) as client:
                for i in range(300):
                    acknowledged.append(await client.add_event("K", i))
                    if len(acknowledged) >= 200:
                        half_way.set()
        except (CommError, OSError):
            pass  # the killed process's producers stop; what they got back is counted

    producing = asyncio.gather(*(produce(p.url) for p in (a, b, a, b)))
    async with asyncio.timeout(60):
        await half_way.wait()
    a.kill()
    await producing
    await on_a.stop()
    # A's consumer reconnects through B (as a load balancer would send it) and carries on.
    on_a_again = Collector(b.url, "ON_A")
    newest = max(acknowledged)
    await on_a_again.wait_for(newest)
    await on_b.wait_for(newest)
    await on_a_again.stop()
    await on_b.stop()
    assert set(acknowledged) <= set(on_a.ids) | set(on_a_again.ids)
    assert set(acknowledged) <= set(on_b.ids)
    assert on_b.ids == sorted(set(on_b.ids))
    # the second session starts at the stored position: no gap between the two sessions
    assert on_a_again.ids[0] <= (on_a.ids[-1] if on_a.ids else 0) + 1


async def test_a_newer_receiver_on_another_process_takes_the_consumer_over(
    servers: ServersFactory,
) -> None:
    a, b = servers(2)
    async with await connect(a.url) as producer:
        await producer.register_consumer("TAKEN")
        first = [await producer.add_event("T", i) for i in range(10)]
        old = Collector(a.url, "TAKEN")
        await old.wait_for(first[-1])
        new = Collector(b.url, "TAKEN")
        async with asyncio.timeout(30):
            await new.receiver.ready.wait()
        later = [await producer.add_event("T", i) for i in range(20)]
        await new.wait_for(later[-1])
        # The stream on process a ends: its acknowledgements are fenced off by the epoch.
        async with asyncio.timeout(30):
            while await push_connected(a.url, "TAKEN"):
                await producer.add_event("T", "more")
        last = await producer.add_event("T", "last")
        await new.wait_for(last)
    await old.stop()
    await new.stop()
    # from the claimed position on (what the old stream had not acknowledged comes again)
    assert set(later) <= set(new.ids)
    assert new.ids == sorted(set(new.ids))


async def test_a_takeover_on_another_process_ends_the_old_stream_at_once(
    servers: ServersFactory,
) -> None:
    """The claim reaches the old stream's process on the notification channel, ahead of any
    event added after it: the old stream sends nothing more, as on a takeover in one
    process, and does not wait for its next acknowledgement to be fenced off."""
    a, b = servers(2)
    async with await connect(a.url) as producer:
        await producer.register_consumer("MOVED")
        first = [await producer.add_event("T", i) for i in range(10)]
        old = Collector(a.url, "MOVED")
        await old.wait_for(first[-1])
        new = Collector(b.url, "MOVED")
        async with asyncio.timeout(30):
            await new.receiver.ready.wait()
        later = [await producer.add_event("T", i) for i in range(20)]
        await new.wait_for(later[-1])
        # Each process's record of the stream reaches its other workers shortly after.
        await until(lambda: push_connected(a.url, "MOVED", connected=False), "the old stream ended")
        await until(lambda: push_connected(b.url, "MOVED"), "the new stream connected")
    await old.stop()
    await new.stop()
    assert not set(later) & set(old.ids)
    assert set(later) <= set(new.ids)
    assert new.ids == sorted(set(new.ids))


async def consumer_info(url: str, component: str) -> dict[str, Any]:
    async with await connect(url) as client:
        consumers = await client.ftn3.call("futoinevt.ops:1.0", "listConsumers", {})
    (info,) = [c for c in consumers if c["component"] == component]
    return dict(info)


async def push_connected(url: str, component: str, *, connected: bool = True) -> bool:
    """Whether the server at ``url`` reports the consumer's push stream as ``connected``."""
    return bool((await consumer_info(url, component))["push_connected"]) == connected


async def test_one_process_discards_at_a_time_and_never_past_a_consumer(pg_url: str) -> None:
    async with await open_store(pg_url) as first, await open_store(pg_url) as second:
        for _ in range(10):
            await first.append("T", "1")
        user = await first.add_user("u", "h")
        await first.register_consumer(user, "SLOW")
        await second.acknowledge(user, "SLOW", 4)
        # Another process holds the retention lock: this one deletes nothing meanwhile.
        other = await psycopg.AsyncConnection.connect(pg_url)
        async with other, other.transaction():
            await other.execute(f"SELECT pg_advisory_xact_lock({LOCK_NAMESPACE}, {RETENTION_LOCK})")
            assert await first.delete_events(10, 100) == 0
        # The lock ends with its holder's transaction (or connection, when a process dies).
        # A bound past the slow consumer's position deletes only what it acknowledged.
        assert await second.delete_events(10, 100) == 4
        assert (await first.stream_bounds()).first_id == 5
        assert await first.last_given_id() == 10


# -- outages -------------------------------------------------------------------------------------

DCB = "futoin.evt.dcb:1.0"
UNAVAILABLE = "Database unavailable: "


class Producer:
    """Adds events in a loop through one server; every id it got back is acknowledged. An
    FTN3 error (the database restarting) is retried after a short backoff."""

    def __init__(self, url: str, number: int, acknowledged: list[int], errors: list[str]) -> None:
        self.url, self.number = url, number
        self.acknowledged, self.errors = acknowledged, errors
        self.count = 0
        self.progress = HeadWatch()
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        async with await connect(self.url) as client:
            while not self.stop.is_set():
                try:
                    event_id = await client.add_event("LOAD", [self.number, self.count])
                except RemoteError as exc:
                    self.errors.append(exc.desc)
                    await asyncio.sleep(0.02)  # backoff before the retry; nothing waits on it
                    continue
                self.acknowledged.append(event_id)
                self.count += 1
                self.progress.advance(self.count)

    async def wait_for(self, count: int) -> None:
        """Until ``count`` events are acknowledged; raises why the producer ended, if it did."""
        waiting = asyncio.ensure_future(self.progress.wait_beyond(count - 1))
        try:
            async with asyncio.timeout(60):
                await asyncio.wait([waiting, self.task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if self.task.done():
            self.task.result()
        assert self.count >= count


async def poll_through(
    url: str, component: str, done: asyncio.Event, until: list[int], errors: list[str]
) -> list[int]:
    """A reliable poll consumer that retries FTN3 errors (kept in ``errors``), until
    ``done`` is set and it has seen the newest of ``until``."""
    seen: list[int] = []
    async with await connect(url) as client:
        last_id: int | None = None
        while not done.is_set() or not seen or seen[-1] < max(until):
            try:
                events = await client.poll_events(component, last_id, None)
            except RemoteError as exc:
                errors.append(exc.desc)
                events = []
            seen.extend(event.id for event in events)
            if events:
                last_id = events[-1].id
            else:
                await asyncio.sleep(0.005)  # backoff between empty polls; nothing waits on it
    return seen


async def test_a_database_restart_under_load_loses_nothing_acknowledged(
    servers: ServersFactory, pg_url: str, pg_cluster: PgCluster
) -> None:
    a, b = servers(2, "--discard-interval", "3600")  # everything read stays in the log
    async with await connect(a.url) as client:
        await client.register_consumer("POLLED")
        await client.register_consumer("PUSHED")
    acknowledged: list[int] = []
    errors: list[str] = []
    producers = [Producer(s.url, n, acknowledged, errors) for n, s in enumerate((a, b, a, b))]
    done = asyncio.Event()
    polled = asyncio.ensure_future(poll_through(a.url, "POLLED", done, acknowledged, errors))
    pushed = Collector(b.url, "PUSHED")
    for producer in producers:
        await producer.wait_for(10)
    await asyncio.to_thread(pg_cluster.control, "restart")
    # every producer, on both servers, is acknowledged again after the restart
    for producer in producers:
        await producer.wait_for(producer.count + 5)
    for producer in producers:
        producer.stop.set()
    await asyncio.gather(*(p.task for p in producers))
    done.set()
    async with asyncio.timeout(60):
        seen = await polled
    await pushed.wait_for(max(acknowledged))
    await pushed.stop()
    assert a.proc.returncode is None
    assert b.proc.returncode is None
    assert len(acknowledged) == len(set(acknowledged))
    stored = {row[0] for row in execute_sql(pg_url, "SELECT id FROM events")}
    assert set(acknowledged) <= stored
    for ids in (seen, pushed.ids):
        assert ids == sorted(set(ids))  # each id once, in increasing order
        assert set(acknowledged) <= set(ids) <= stored
    assert all(desc.startswith(UNAVAILABLE) for desc in errors), set(errors)


async def test_conditional_appends_on_one_tag_through_two_processes_lose_no_update(
    servers: ServersFactory, pg_url: str
) -> None:
    """32 clients, half on each of two servers on one database, append to one tag on the
    condition that nothing with it came after the newest they read: each one's appends go
    through one after another, exactly one per position read."""
    a, b = servers(2)
    wins = await race_on_one_tag([a.url, b.url], ALICE, "seat:s1")
    assert_no_lost_update(wins, 32 * 3)
    rows = execute_sql(pg_url, "SELECT event_id FROM event_tags WHERE tag = 'seat:s1'")
    assert sorted(row[0] for row in rows) == sorted(position for _, position in wins)


async def lock_waiters(url: str, count: int) -> None:
    """Until ``count`` connections to the database wait for an advisory lock."""
    sql = (
        "SELECT COUNT(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
    )
    await until(lambda: execute_sql(url, sql)[0][0] >= count, f"{count} waiting", interval=0.01)


async def test_more_calls_than_pooled_connections_wait_then_fail_clearly(
    servers: ServersFactory, pg_url: str
) -> None:
    (server,) = servers(1, "--pg-pool-size", "1", "--pg-pool-timeout", "1")
    event = {"type": "Booked", "data": {}, "tags": ["room:1"]}
    async with await connect(server.url) as client:
        assert await client.ftn3.call(DCB, "append", {"events": [event]}) == 1
        # An application's transaction holds the append lock (the native extension) until it
        # commits; the DCB appends wait for that lock on the one pooled connection.
        app = await psycopg.AsyncConnection.connect(pg_url)
        async with app:
            await add_event_async(app, "APP", 1)
            appends = [
                asyncio.ensure_future(client.ftn3.call(DCB, "append", {"events": [event]}))
                for _ in range(2)
            ]
            # once the DCB writer waits for the lock on the one pooled connection, calls that
            # need another wait for it, then fail clearly
            await lock_waiters(pg_url, 1)
            for component in ("A", "B"):
                with pytest.raises(RemoteError) as failed:
                    await client.register_consumer(component)
                assert failed.value.name == "InternalError"
                assert failed.value.desc == (
                    f"{UNAVAILABLE}no database connection within 1 s (all 1 of the pool busy,"
                    " or the database unreachable)"
                )
            assert not any(call.done() for call in appends)
            await app.commit()
        async with asyncio.timeout(30):
            assert sorted(await asyncio.gather(*appends)) == [3, 4]
        # the pool is whole again
        assert await client.ftn3.call(DCB, "append", {"events": [event]}) == 5
        assert await client.add_event("AFTER", 1) == 6
    # the calls that failed stored nothing
    assert execute_sql(pg_url, "SELECT COUNT(*) FROM events") == [(6,)]
    assert execute_sql(pg_url, "SELECT COUNT(*) FROM consumers") == [(0,)]


async def test_a_push_stream_that_cannot_read_tries_again(
    servers: ServersFactory, pg_url: str
) -> None:
    """A read that finds no pooled connection in time (as during an outage) does not end the
    stream: its receiver gets the events once the database answers again."""
    (server,) = servers(1, "--pg-pool-size", "1", "--pg-pool-timeout", "0.5")
    (other,) = servers(1)
    async with await connect(server.url) as client, await connect(other.url) as producer:
        await client.register_consumer("PUSHED")
        pushed = Collector(server.url, "PUSHED")
        async with asyncio.timeout(30):
            await pushed.receiver.ready.wait()
        # An application locks the consumers; a registration on the server waits for it on
        # the pool's only connection.
        app = await psycopg.AsyncConnection.connect(pg_url)
        async with app:
            await app.execute("LOCK TABLE consumers IN ACCESS EXCLUSIVE MODE")
            blocked = asyncio.ensure_future(client.register_consumer("OTHER"))
            waiting_sql = (
                "SELECT COUNT(*) > 0 FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND position('consumers' in query) > 0"
                " AND datname = current_database()"  # not another run's database
            )
            await until(
                lambda: bool(execute_sql(pg_url, waiting_sql)[0][0]),
                "the registration waits for the lock",
            )
            # added elsewhere, so the server reads them from the database
            ids = [await producer.add_event("T", i) for i in range(5)]
            stream_failed = re.compile(r"push stream PUSHED .*(cannot read|failed)")
            await until(
                lambda: stream_failed.search(server.logged()) is not None,
                "the push stream's failure logged",
            )
            await app.rollback()
        await blocked
        await pushed.wait_for(ids[-1])
        await pushed.stop()
    assert pushed.ids == ids


async def test_serve_waits_for_a_database_that_starts_later(
    servers: ServersFactory, pg_url: str, pg_cluster: PgCluster
) -> None:
    # (``servers`` added the users)
    await asyncio.to_thread(pg_cluster.control, "stop")
    # without --wait-for-db: one sentence and status 2, at once
    refused = run("serve", "--port", "0", "--db", pg_url)
    assert refused.returncode == 2
    assert refused.stderr.startswith("futoin-evt: cannot connect to the PostgreSQL database ")
    assert len(refused.stderr.strip().splitlines()) == 1
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--log-level", "warning", "serve", "--port", "0", "--db", pg_url,
        "--wait-for-db", "120",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            for _ in range(2):
                line = (await proc.stderr.readline()).decode()
                assert "cannot connect to the PostgreSQL database" in line, line
                assert "trying again in" in line
        await asyncio.to_thread(pg_cluster.control, "start")
        async with asyncio.timeout(60):
            banner = (await proc.stdout.readline()).decode()
        url = banner.split(" listening on ")[1].split()[0]
        async with await connect(url) as client:
            assert await client.add_event("AFTER_START", 1) == 1
    finally:
        if proc.returncode is None:
            proc.terminate()
        async with asyncio.timeout(30):
            await proc.communicate()
    assert proc.returncode == 0


async def test_a_session_left_inside_a_transaction_is_ended_and_its_locks_go_to_others(
    pg_url: str,
) -> None:
    """A server stopped (SIGSTOP, a frozen VM) inside a transaction would hold its locks
    until it ran again: the server's end of each session ends it after the link timeout."""
    from futoin_evt.storage.base import PoolLimits
    from futoin_evt.storage.errors import StoreUnreachable
    from futoin_evt.storage.postgres import PostgresStore

    async def taken(other: psycopg.AsyncConnection[Any]) -> bool:
        cursor = await other.execute("SELECT pg_try_advisory_lock(4242)")
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def hold_and_idle(store: PostgresStore) -> None:
        async with store._transaction() as conn:  # the process stops right after this
            await conn.execute("SELECT pg_advisory_xact_lock(4242)")
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as other:
                await until(lambda: taken(other), "another session takes the lock")

    async with await PostgresStore.open(pg_url, pool=PoolLimits(link_timeout=1)) as store:
        with pytest.raises(StoreUnreachable):  # its connection was ended meanwhile
            await hold_and_idle(store)
