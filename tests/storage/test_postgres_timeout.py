"""A PostgreSQL that stops answering is an outage, not a hang: with a command timeout, a
write or a read held by a lock another session keeps fails as ``Unavailable`` (503, which
callers retry) once the timeout passes, and the next one after the lock is gone commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from tidemesh.core.errors import Unavailable
from tidemesh.storage import postgres
from tidemesh.storage.engine import BatchOp

pytestmark = pytest.mark.postgres

TIMEOUT_S = 0.5


async def _insert(conn: Any, rows: Sequence[int]) -> list[int]:
    await conn.execute("INSERT INTO item (n) SELECT * FROM unnest($1::bigint[])", list(rows))
    return list(rows)


INSERT = BatchOp("insert", _insert)


@pytest.fixture
async def db(pg_database: str) -> AsyncIterator[postgres.Database]:
    async def setup(conn: Any) -> None:
        await conn.execute("CREATE TABLE item (n BIGINT NOT NULL)")

    d = await postgres.Database.open(pg_database, setup, name="timeouts", writers=1,
                                     command_timeout_s=TIMEOUT_S)
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def locked(pg_database: str) -> AsyncIterator[asyncpg.Connection]:
    """Another session holding the table's strongest lock until the test releases it."""
    conn = await asyncpg.connect(pg_database)
    tx = conn.transaction()
    await tx.start()
    await conn.execute("LOCK TABLE item IN ACCESS EXCLUSIVE MODE")
    try:
        yield conn
    finally:
        if not conn.is_closed():
            await conn.close()


async def test_a_write_held_by_a_lock_fails_as_an_outage_then_the_next_commits(
        db: postgres.Database, locked: asyncpg.Connection) -> None:
    with pytest.raises(Unavailable, match="no answer within the command timeout"):
        await asyncio.wait_for(db.submit(INSERT, 1), 10 * TIMEOUT_S)
    await locked.close()   # its transaction ends with it
    assert await asyncio.wait_for(db.submit(INSERT, 2), 10 * TIMEOUT_S) == 2
    assert [r["n"] for r in await db.pool.fetch("SELECT n FROM item")] == [2]


async def test_a_pool_statement_held_by_a_lock_times_out_and_the_pool_heals(
        db: postgres.Database, locked: asyncpg.Connection) -> None:
    read = asyncio.create_task(db.pool.fetchval("SELECT count(*) FROM item"))
    done, _ = await asyncio.wait([read], timeout=10 * TIMEOUT_S)
    assert read in done, "the read waited past its command timeout"
    assert isinstance(read.exception(), db.outage_errors)
    await locked.close()
    assert await asyncio.wait_for(db.pool.fetchval("SELECT count(*) FROM item"),
                                  10 * TIMEOUT_S) == 0


async def test_setup_has_no_command_timeout(pg_database: str) -> None:
    async def slow_setup(conn: Any) -> None:   # a migration longer than the timeout
        await conn.execute("SELECT pg_sleep($1)", 2 * TIMEOUT_S)

    d = await postgres.Database.open(pg_database, slow_setup, name="timeouts",
                                     command_timeout_s=TIMEOUT_S)
    await d.close()


async def test_an_unbounded_connection_outlasts_the_command_timeout(
        db: postgres.Database) -> None:
    async with db.unbounded() as conn:
        await conn.execute("SELECT pg_sleep($1)", 2 * TIMEOUT_S)
