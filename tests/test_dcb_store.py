"""DCB in the store: reads and conditions cost what matches, not the size of the log."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.dcb.model import parse_query
from futoin_evt.domain.dcb import AppendCondition, new_event
from futoin_evt.storage.sql.dcb import condition_sql, read_sql
from futoin_evt.storage.sqlite import SqliteStore
from futoin_evt.storage.sqlite.schema import ensure_schema

LOG_SIZE = 1_000_000
RARE_EVERY = 100_000
#: The tables and their aliases in the DCB SQL: none may be walked in full.
TABLES = {"events", "e", "x", "event_tags", "o", "dcb_events", "d"}  # t: a matched set


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1M events, 10 of them tagged ``rare`` (made with plain SQL: fast)."""
    path = tmp_path_factory.mktemp("dcb") / "big.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        ensure_schema(conn)
        conn.executemany(
            "INSERT INTO events (id, type, data, ts) VALUES (?, ?, ?, '2026-01-01T00:00:00Z')",
            ((i, "Common" if i % RARE_EVERY else "Rare", str(i)) for i in range(1, LOG_SIZE + 1)),
        )
        rare = range(RARE_EVERY, LOG_SIZE + 1, RARE_EVERY)
        conn.executemany(
            "INSERT INTO dcb_events (event_id, tags) VALUES (?, '[\"rare\"]')", ((i,) for i in rare)
        )
        conn.executemany(
            "INSERT INTO event_tags (tag, event_id) VALUES ('rare', ?)", ((i,) for i in rare)
        )
    return path


@pytest.fixture
async def store(big_log: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(big_log) as opened:
        yield opened


def plan(path: Path, sql: str, params: list[object]) -> str:
    with sqlite3.connect(path) as conn:
        return "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))


@pytest.mark.parametrize(
    "query",
    [
        {"items": [{"tags": ["rare"]}]},
        {"items": [{"types": ["Rare"]}]},
        {"items": [{"types": ["Rare"], "tags": ["rare"]}]},
        {"criteria": [{"type": "Tags", "properties": {"tags": ["rare"]}}]},
        {
            "criteria": [
                {
                    "type": "EventTypesAndTags",
                    "properties": {"event_types": ["Rare", "Common"], "tags": ["rare"]},
                }
            ]
        },
    ],
)
async def test_a_read_matching_10_of_1m_events_uses_an_index(
    store: SqliteStore, big_log: Path, query: dict[str, object]
) -> None:
    parsed = parse_query(query)
    events, head = await store.dcb_read(parsed, after=None, before=None, limit=1000)
    assert [e.position for e in events] == list(range(RARE_EVERY, LOG_SIZE + 1, RARE_EVERY))
    assert head == LOG_SIZE
    sql, params = read_sql(parsed, after=0, before=None, limit=1000)
    read_plan = plan(big_log, sql, params)
    check_sql, check_params = condition_sql(parsed, 0)
    check_plan = plan(big_log, check_sql, check_params)
    for text in (read_plan, check_plan):
        # every step searches an index; none walks the log
        scanned = {line.split()[1] for line in text.splitlines() if line.startswith("SCAN ")}
        assert not scanned & TABLES, text


async def test_a_condition_on_a_big_log_is_exact(store: SqliteStore) -> None:
    rare = parse_query({"items": [{"tags": ["rare"]}]})
    with pytest.raises(Exception, match="position 1000000"):
        await store.dcb_append([new_event("Rare", 1, ["rare"])], AppendCondition(rare, 900_000))
    position = await store.dcb_append(
        [new_event("Rare", 1, ["rare"])], AppendCondition(rare, LOG_SIZE)
    )
    assert position == LOG_SIZE + 1


async def test_a_read_on_the_event_loop_that_runs_long_is_left_to_the_read_thread(
    store: SqliteStore,
) -> None:
    """Small reads (the head, a tag read's first step) run on the event loop; one that turns
    out to scan is interrupted there (None: read it on the thread), so it never holds up the
    loop's other connections."""
    scan = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000)"
        " SELECT count(*) FROM n"
    )
    assert store._peek_rows(scan, ()) is None
    tagged = store._peek_rows("SELECT event_id FROM event_tags WHERE tag = 'rare'", ())
    assert tagged is not None  # a small read, on the loop
    first, _head = await store.dcb_read(
        parse_query({"items": [{"tags": ["rare"]}]}), after=None, before=None, limit=50
    )
    assert [event.position for event in first] == sorted(row[0] for row in tagged)


async def test_a_read_answers_with_the_stored_tags_as_they_are(tmp_path: Path) -> None:
    """Tags stored as the store writes them (compact JSON, tags by the tag rule) go into the
    answer as stored; tags written otherwise (spaces, escapes) are decoded and encoded again;
    an event without DCB tags has none."""
    path = tmp_path / "tags.sqlite"
    stored = [
        '["course:c1","student:s-1"]',
        '["course:c1", "student:s\\u002d2"]',
        '["course:c1"]',
        "[]",
    ]
    with sqlite3.connect(path) as conn:
        ensure_schema(conn)
        conn.executemany(
            "INSERT INTO events (id, type, data, ts) VALUES (?, 'Enrolled', '{}', '2026-01-01')",
            ((i,) for i in range(1, 6)),
        )
        conn.executemany(
            "INSERT INTO dcb_events (event_id, tags) VALUES (?, ?)", enumerate(stored, 1)
        )
        conn.executemany(
            "INSERT INTO event_tags (tag, event_id) VALUES ('course:c1', ?)",
            ((i,) for i in (1, 2, 3)),
        )
    async with await SqliteStore.open(path) as store:
        everything = parse_query(None)
        events, _head = await store.dcb_read(everything, after=None, before=None, limit=10)
    assert [e.tags for e in events] == [
        ("course:c1", "student:s-1"),
        ("course:c1", "student:s-2"),
        ("course:c1",),
        (),
        (),
    ]
    answers = [e.to_json() for e in events]
    assert [json.loads(text)["tags"] for text in answers] == [list(e.tags) for e in events]
    assert '"tags":["course:c1","student:s-1"]' in answers[0]
    assert '"tags":["course:c1","student:s-2"]' in answers[1]  # encoded again, compact
