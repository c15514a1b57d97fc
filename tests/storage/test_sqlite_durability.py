"""Writes a power cut may undo without harm commit without a sync of their own; a durable
write in the same transaction makes all of it durable; nothing else changes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from tidemesh.storage import sqlite

FULL, NORMAL = 2, 1


def _sync_mode(conn: sqlite3.Connection) -> int:
    conn.execute("INSERT INTO t (x) VALUES (1)")
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


async def test_a_transaction_of_non_durable_writes_alone_skips_the_sync(tmp_path: Path) -> None:
    db = await sqlite.Database.open(tmp_path / "d.db", lambda c: c.execute(
        "CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
    try:
        assert await db.write(_sync_mode) == FULL
        assert await db.write(_sync_mode, durable=False) == NORMAL
        assert await db.write(_sync_mode) == FULL, "the next transaction is durable again"
        # Queued together, they share one transaction: one durable write makes it durable.
        both = await asyncio.gather(db.write(_sync_mode, durable=False), db.write(_sync_mode),
                                    db.write(_sync_mode, durable=False))
        assert both == [FULL, FULL, FULL]
        # A failed non-durable transaction leaves the connection durable too.
        def boom(conn: sqlite3.Connection) -> None:
            raise sqlite3.OperationalError("disk I/O error")
        with contextlib.suppress(Exception):   # the failure itself is not under test
            await db.write(boom, durable=False)
        assert await db.write(_sync_mode) == FULL
    finally:
        await db.close()
    conn = sqlite3.connect(tmp_path / "d.db")
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 7
    conn.close()
