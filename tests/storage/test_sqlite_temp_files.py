"""The writer's batches keep SQLite's temporary data in memory: a savepoint whose journal
outgrew 64 KiB used to spill it to a file in the system's temporary folder (what a batch
changes, message text included, on a disk outside the process's own folder, and a file
made and unlinked at nearly every commit of the inbox)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tidemesh.storage import sqlite

ROWS = 400   # 400 rows of 1 KiB: a savepoint journal of ~100 pages, well past 64 KiB


def _setup(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body BLOB)")
    conn.executemany("INSERT INTO t (id, body) VALUES (?, ?)",
                     [(i, os.urandom(1024)) for i in range(ROWS)])


def _sqlite_temp_files() -> list[str]:
    """The files this process holds open that SQLite made as temporary files (``etilqs_``,
    unlinked at once, so only an open descriptor shows them)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # closed meanwhile
            continue
        if "etilqs_" in target:
            found.append(target)
    return found


def _rewrite_all(conn: sqlite3.Connection) -> list[str]:
    conn.execute("UPDATE t SET body = randomblob(1024)")
    return _sqlite_temp_files()   # before the savepoint around this write is released


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
async def test_a_batch_that_changes_many_pages_writes_no_temporary_file(tmp_path: Path
                                                                        ) -> None:
    db = await sqlite.Database.open(tmp_path / "d.db", _setup)
    try:
        held = await db.write(_rewrite_all)
        assert held == [], f"the writer spilled to a temporary file: {held}"
        assert await db.read(lambda c: c.execute("SELECT COUNT(*) FROM t").fetchone()[0]
                             ) == ROWS
    finally:
        await db.close()
