"""The SQLite engine's one writer under mixed load: a light write queued beside a heavy one
commits first, in a transaction of its own, and one owner's writes keep their order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from tidemesh.storage import sqlite

Part = tuple[str, int]   # (owner, part)


def _put(conn: sqlite3.Connection, args: Sequence[list[Part]]) -> list[int]:
    for parts in args:
        conn.executemany("INSERT INTO part (owner, n) VALUES (?, ?)", parts)
    return [len(parts) for parts in args]


PUT = sqlite.BatchOp("put", _put, weight=len, owner=lambda parts: parts[0][0])


async def test_a_light_write_beside_a_heavy_one_commits_first_and_an_owner_keeps_its_order(
        tmp_path: Path) -> None:
    path = tmp_path / "mixed.db"
    db = await sqlite.Database.open(path, lambda c: c.execute(
        "CREATE TABLE part (seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, n INTEGER)"))
    entered, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(10)

    try:
        holding = asyncio.create_task(db.write(hold))
        await asyncio.to_thread(entered.wait, 10)   # the writer is in that transaction
        heavy = [("flood", n) for n in range(sqlite.LIGHT_WEIGHT + 1)]
        writes = [asyncio.create_task(db.submit(PUT, parts)) for parts in (
            heavy, [("lone", 0)], [("flood", len(heavy))])]
        await asyncio.sleep(0)   # all three queued behind it
        release.set()
        await holding
        assert await asyncio.gather(*writes) == [len(heavy), 1, 1]
        # The held one, the lone write alone, then the flood's two together.
        assert (db.batches, db.items) == (3, 4)
    finally:
        release.set()
        await db.close()
    conn = sqlite3.connect(path)
    try:
        order = [tuple(r) for r in conn.execute("SELECT owner, n FROM part ORDER BY seq")]
    finally:
        conn.close()
    assert order == [("lone", 0)] + [("flood", n) for n in range(len(heavy) + 1)]
