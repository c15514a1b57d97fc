"""The PostgreSQL engine's writers and shards: one shard's writes commit in the order they
were submitted, and a shard with nothing in flight is not queued behind another shard's long
batch while a writer is free (what keeps a flooding member from holding up the others)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from tidemesh.storage import postgres
from tidemesh.storage.engine import BatchOp

pytestmark = pytest.mark.postgres

Row = tuple[str, int, float]   # (shard, n, seconds the statement sleeps)


async def _insert(conn: Any, rows: Sequence[Row]) -> list[int]:
    """Rows get the table's sequence in commit order; a row may ask its batch to sleep."""
    nap = max(r[2] for r in rows)
    if nap:
        await conn.execute("SELECT pg_sleep($1)", nap)
    await conn.execute("INSERT INTO item (shard, n) SELECT * FROM"
                       " unnest($1::text[], $2::bigint[])",
                       [r[0] for r in rows], [r[1] for r in rows])
    return [r[1] for r in rows]


INSERT = BatchOp("insert", _insert, owner=lambda r: r[0])   # the shard is the row's owner


@pytest.fixture
async def db(pg_database: str) -> AsyncIterator[postgres.Database]:
    async def setup(conn: Any) -> None:
        await conn.execute("CREATE TABLE item (seq BIGSERIAL PRIMARY KEY, shard TEXT NOT NULL,"
                           " n BIGINT NOT NULL)")

    d = await postgres.Database.open(pg_database, setup, name="writers", writers=2)
    try:
        yield d
    finally:
        await d.close()


async def _committed(d: postgres.Database, shard: str) -> list[int]:
    rows = await d.pool.fetch("SELECT n FROM item WHERE shard = $1 ORDER BY seq", shard)
    return [r["n"] for r in rows]


async def test_a_quiet_shard_is_not_queued_behind_a_busy_one(db: postgres.Database) -> None:
    finished: list[str] = []

    async def write(shard: str, n: int, nap: float) -> None:
        await db.submit(INSERT, (shard, n, nap))
        finished.append(f"{shard}{n}")

    flood = asyncio.create_task(write("flood", 0, 1.0))
    await asyncio.sleep(0.1)               # the flood's batch is in its writer
    more = asyncio.create_task(write("flood", 1, 0.0))
    for q in range(6):                     # each goes to the other writer, which is free
        await write(f"q{q}-", 0, 0.0)
    await asyncio.gather(flood, more)

    assert finished == [*(f"q{q}-0" for q in range(6)), "flood0", "flood1"]


async def test_one_shards_writes_commit_in_submission_order(db: postgres.Database) -> None:
    """Shards move between writers only when idle, so interleaved shards, some batches
    sleeping, still commit each shard's writes in order."""
    async def shard(name: str, naps: list[float]) -> None:
        for start in range(0, len(naps), 5):
            # Five at once (they may share a batch), then the next five.
            await asyncio.gather(*(db.submit(INSERT, (name, i, naps[i]))
                                   for i in range(start, min(start + 5, len(naps)))))

    await asyncio.gather(shard("a", [0.0] * 40),
                         shard("b", [0.05 if i % 7 == 0 else 0.0 for i in range(40)]),
                         shard("c", [0.0] * 40))

    for name in "abc":
        assert await _committed(db, name) == list(range(40))
    assert db._homes == {} and db._load == [0, 0]   # every submission released
