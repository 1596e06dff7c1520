"""The power-loss filesystem (tests/faultfs): what survives a cut is exactly what was made
durable (a file's fsync for its data, its directory's for its name), and SQLite runs on it in
WAL mode (its ``-shm`` mapped shared by two processes) and with a rollback journal."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faultfs import FaultFS


def write(path: Path, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def power_failure(fs: FaultFS, keep: float = 0.0) -> None:
    fs.cut(keep)
    fs.remount()


def test_unsynced_writes_are_lost_and_synced_ones_kept(faultfs: FaultFS) -> None:
    mnt = faultfs.mountpoint
    write(mnt / "a", b"first " * 2000, sync=True)
    sync_dir(mnt)
    fd = os.open(mnt / "a", os.O_WRONLY)
    os.pwrite(fd, b"SECOND", 6000)  # inside the second block
    os.pwrite(fd, b"appended", 12000)
    os.close(fd)
    assert (mnt / "a").read_bytes()[6000:6006] == b"SECOND"  # the programs see it meanwhile
    power_failure(faultfs)
    assert (mnt / "a").read_bytes() == b"first " * 2000


def test_a_name_is_durable_only_once_its_directory_is_synced(faultfs: FaultFS) -> None:
    mnt = faultfs.mountpoint
    write(mnt / "synced-data-only", b"data", sync=True)
    (mnt / "sub").mkdir()
    power_failure(faultfs)
    assert sorted(os.listdir(mnt)) == []
    assert os.listdir(faultfs.orphans) == []  # the orphans' data was freed

    write(mnt / "named", b"data", sync=True)
    sync_dir(mnt)
    power_failure(faultfs)
    assert (mnt / "named").read_bytes() == b"data"


def test_unlink_and_rename_come_back_until_the_directory_is_synced(faultfs: FaultFS) -> None:
    mnt = faultfs.mountpoint
    write(mnt / "gone", b"one", sync=True)
    write(mnt / "old", b"two", sync=True)
    sync_dir(mnt)
    (mnt / "gone").unlink()
    (mnt / "old").rename(mnt / "new")
    assert sorted(os.listdir(mnt)) == ["new"]
    power_failure(faultfs)
    assert sorted(os.listdir(mnt)) == ["gone", "old"]

    (mnt / "gone").unlink()
    (mnt / "old").rename(mnt / "new")
    sync_dir(mnt)
    power_failure(faultfs)
    assert sorted(os.listdir(mnt)) == ["new"]
    assert (mnt / "new").read_bytes() == b"two"


def test_an_unsynced_truncation_is_undone(faultfs: FaultFS) -> None:
    mnt = faultfs.mountpoint
    write(mnt / "f", bytes(range(256)) * 64, sync=True)
    sync_dir(mnt)
    os.truncate(mnt / "f", 100)
    with open(mnt / "f", "r+b") as f:  # grown again: the bytes past 100 read as zeros
        f.seek(9000)
        f.write(b"x")
    assert (mnt / "f").read_bytes()[100:9000] == bytes(8900)
    power_failure(faultfs)
    assert (mnt / "f").read_bytes() == bytes(range(256)) * 64


def test_a_cut_ends_all_writes_and_keep_one_lands_what_was_pending(faultfs: FaultFS) -> None:
    mnt = faultfs.mountpoint
    write(mnt / "f", b"pending")
    fd = os.open(mnt / "f", os.O_WRONLY)
    stats = faultfs.cut(keep=1.0)
    assert stats["dirty_files"] == {"f": 1}
    with pytest.raises(OSError, match="Input/output error") as raised:
        os.write(fd, b"after the cut")
    assert raised.value.errno == errno.EIO
    os.close(fd)
    faultfs.remount()
    assert (mnt / "f").read_bytes() == b"pending"  # written back before the power went


#: A second process on the same database: SQLite shares the WAL index through the mapped
#: ``-shm`` file, so what one commits the other reads only if the mapping is shared.
OTHER_PROCESS = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
print(conn.execute("SELECT count(*) FROM t").fetchone()[0], flush=True)
conn.execute("INSERT INTO t VALUES ('other')")
print(open("/proc/self/maps").read().count("-shm"))
"""


def test_sqlite_in_wal_mode_keeps_what_it_synced(faultfs: FaultFS) -> None:
    db = faultfs.mountpoint / "wal.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"durable {i}",) for i in range(500)])
    assert "wal.sqlite-shm" in Path("/proc/self/maps").read_text()  # the -shm is mapped
    other = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(db)], capture_output=True, text=True, check=True
    )
    seen, mapped = other.stdout.split()
    assert (int(seen), int(mapped) > 0) == (500, True)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (501,)  # its write, seen here
    conn.execute("PRAGMA synchronous=OFF")  # committed, never synced
    conn.executemany("INSERT INTO t VALUES (?)", [(f"lost {i}",) for i in range(500)])
    assert faultfs.cut()["dirty_files"].get("wal.sqlite-wal", 0) > 0
    conn.close()
    faultfs.remount()
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT count(*), max(v) FROM t WHERE v LIKE 'durable%'").fetchone() == (
        500,
        "durable 99",
    )
    assert conn.execute("SELECT count(*) FROM t WHERE v NOT LIKE 'durable%'").fetchone() == (1,)
    conn.close()


def test_sqlite_rolls_back_a_transaction_cut_midway_with_its_hot_journal(
    faultfs: FaultFS,
) -> None:
    """Rollback journal: a large transaction spills pages into the database file before its
    commit; the power goes; the journal, synced before each spill, undoes them."""
    db = faultfs.mountpoint / "journal.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA cache_size=10")  # spill to the file before the commit
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    with conn:  # one transaction
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "old" * 30) for i in range(3000)])
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET v = 'new' || v")
    # the disk had written back all of it: the changed pages are in the database file
    assert faultfs.cut(keep=1.0)["dirty_files"].get("journal.sqlite", 0) > 0
    conn.close()
    faultfs.remount()
    assert (faultfs.mountpoint / "journal.sqlite-journal").exists()  # a hot journal
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT count(*), min(v), max(v) FROM t").fetchone() == (
        3000,
        "old" * 30,
        "old" * 30,
    )
    conn.close()
