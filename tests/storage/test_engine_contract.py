"""The write engines' contract, the same test on SQLite and on PostgreSQL: group commit,
one failing item alone, a full disk answered 507, a dead writer answered 503, and close()
finishing what was queued. Real files, a real tmpfs and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tidemesh.core.errors import InsufficientStorage, TidemeshError, Unavailable
from tidemesh.storage import postgres, sqlite

Row = tuple[str, int, bytes]

TABLE = "CREATE TABLE item (k TEXT PRIMARY KEY, v BIGINT NOT NULL CHECK (v >= 0), blob {blob})"


def _sqlite_insert(conn: sqlite3.Connection, rows: Sequence[Row]) -> list[str]:
    conn.executemany("INSERT INTO item (k, v, blob) VALUES (?, ?, ?)", rows)
    return [k for k, _, _ in rows]


async def _pg_insert(conn: Any, rows: Sequence[Row]) -> list[str]:
    await conn.execute("INSERT INTO item (k, v, blob) SELECT * FROM"
                       " unnest($1::text[], $2::bigint[], $3::bytea[])",
                       [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return [r[0] for r in rows]


SQLITE_INSERT = sqlite.BatchOp("insert", _sqlite_insert)
PG_INSERT = postgres.BatchOp("insert", _pg_insert, key=lambda r: r[0])


@dataclass
class Engine:
    """One engine under test, with what the tests need to drive and observe it."""

    db: sqlite.Database | postgres.Database
    submit: Callable[[Row], Awaitable[str]]
    committed: Callable[[], Awaitable[set[str]]]  # read over a connection of its own


async def _open_sqlite(folder: Path) -> Engine:
    path = folder / "contract.db"
    db = await sqlite.Database.open(path, lambda c: c.execute(TABLE.format(blob="BLOB")))

    async def committed() -> set[str]:
        conn = sqlite3.connect(path)
        try:
            return {r[0] for r in conn.execute("SELECT k FROM item")}
        finally:
            conn.close()

    return Engine(db, lambda row: db.submit(SQLITE_INSERT, row), committed)


async def _open_postgres(dsn: str, tablespace: str | None = None) -> Engine:
    where = f" TABLESPACE {tablespace}" if tablespace else ""

    async def setup(conn: Any) -> None:
        await conn.execute(TABLE.format(blob="BYTEA") + where)

    db = await postgres.Database.open(dsn, setup, name="contract")
    lock = asyncio.Lock()  # one observer connection, one query at a time

    async def committed() -> set[str]:
        async with lock:
            conn = await asyncpg.connect(dsn)
            try:
                return {r[0] for r in await conn.fetch("SELECT k FROM item")}
            finally:
                await conn.close()

    return Engine(db, lambda row: db.submit(PG_INSERT, row, shard=row[0]), committed)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A folder for the SQLite file, or a fresh PostgreSQL database's DSN."""
    if request.param == "sqlite":
        return tmp_path
    dsn: str = request.getfixturevalue("pg_database")
    return dsn


@pytest.fixture
async def engine(where: Path | str) -> AsyncIterator[Engine]:
    e = await (_open_sqlite(where) if isinstance(where, Path) else _open_postgres(where))
    try:
        yield e
    finally:
        await e.db.close()


def _row(i: int, v: int = 1, blob: bytes = b"") -> Row:
    return (f"k{i:04d}", v, blob)


async def test_concurrent_callers_share_transactions_and_hear_back_after_commit(
        engine: Engine) -> None:
    async def one(i: int) -> bool:
        key = await engine.submit(_row(i))
        return key in await engine.committed()  # durable before the caller heard back

    seen = await asyncio.gather(*(one(i) for i in range(200)))

    assert all(seen)
    assert len(await engine.committed()) == 200
    assert engine.db.items == 200
    assert engine.db.batches < 200


async def test_one_failing_item_does_not_fail_the_rest_of_its_batch(engine: Engine) -> None:
    rows = [_row(i, v=-1 if i == 7 else 1) for i in range(20)]

    answers = await asyncio.gather(*(engine.submit(r) for r in rows), return_exceptions=True)

    (failed,) = [a for a in answers if isinstance(a, BaseException)]
    assert isinstance(failed, Unavailable) and failed.http_status == 503
    assert await engine.committed() == {r[0] for r in rows} - {"k0007"}


async def test_a_dead_writer_answers_503_to_queued_and_later_callers(engine: Engine) -> None:
    await engine.submit(_row(0))
    queued = [asyncio.ensure_future(engine.submit(_row(i))) for i in range(1, 30)]
    for task in engine.db.writer_tasks:
        task.cancel()
    await asyncio.gather(*engine.db.writer_tasks, return_exceptions=True)

    answers = await asyncio.gather(*queued, return_exceptions=True)
    with pytest.raises(Unavailable) as later:
        await engine.submit(_row(99))

    assert later.value.http_status == 503
    assert all(isinstance(a, str) or (isinstance(a, TidemeshError) and a.http_status == 503)
               for a in answers)


async def test_close_commits_everything_queued_before_it(engine: Engine) -> None:
    queued = [asyncio.ensure_future(engine.submit(_row(i))) for i in range(50)]
    await asyncio.sleep(0)  # every caller has queued its row

    await engine.db.close()

    assert sorted(await asyncio.gather(*queued)) == [_row(i)[0] for i in range(50)]
    assert len(await engine.committed()) == 50


async def _fill_until_refused(engine: Engine) -> TidemeshError:
    """Write incompressible 1 MiB rows until the engine refuses one (48 MiB file system)."""
    for i in range(200):
        try:
            await engine.submit(_row(i, blob=os.urandom(1 << 20)))
        except TidemeshError as exc:
            return exc
    raise AssertionError("the small file system never filled")


async def test_a_full_disk_is_answered_507_naming_the_sqlite_database(small_fs: Path) -> None:
    engine = await _open_sqlite(small_fs)
    try:
        refused = await _fill_until_refused(engine)
    finally:
        await engine.db.close()

    assert isinstance(refused, InsufficientStorage) and refused.http_status == 507
    assert "contract database" in refused.message


@pytest.mark.postgres
async def test_a_full_disk_is_answered_507_naming_the_postgres_database(
        small_fs: Path, pg_database: str) -> None:
    # The table lives in a tablespace on the small file system, written by the server itself.
    folder = small_fs / "pg"
    folder.mkdir()
    owner = pwd.getpwnam("postgres")
    os.chown(small_fs, owner.pw_uid, owner.pw_gid)
    os.chown(folder, owner.pw_uid, owner.pw_gid)
    space = "tm_full_" + secrets.token_hex(4)
    admin = await asyncpg.connect(pg_database)
    await admin.execute(f"CREATE TABLESPACE {space} LOCATION '{folder}'")
    try:
        engine = await _open_postgres(pg_database, space)
        try:
            refused = await _fill_until_refused(engine)
        finally:
            await engine.db.close()
            await admin.execute("DROP TABLE item")
    finally:
        await admin.execute(f"DROP TABLESPACE {space}")
        await admin.close()

    assert isinstance(refused, InsufficientStorage) and refused.http_status == 507
    assert "contract database" in refused.message


# ---------------------------------------------------------------- SQLite: reader and threads
def _engine_threads(path: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith(f"-{path.name}")]


async def test_sqlite_reads_do_not_wait_for_the_writers_open_transaction(tmp_path: Path) -> None:
    engine = await _open_sqlite(tmp_path)
    db = engine.db
    assert isinstance(db, sqlite.Database)
    inside, release = threading.Event(), threading.Event()

    def slow_insert(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO item (k, v) VALUES ('held', 1)")
        inside.set()
        release.wait(30)  # the transaction stays open until the read below has answered
        return "held"

    def count(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT count(*) FROM item").fetchone()[0])

    try:
        write = asyncio.ensure_future(db.write(slow_insert))
        await asyncio.to_thread(inside.wait, 30)
        try:
            # The guard only keeps a broken engine from hanging the run; no timing is asserted.
            during = await asyncio.wait_for(db.read(count), 20)
        finally:
            release.set()
        assert await write == "held"
        after = await db.read(count)
    finally:
        await db.close()

    assert (during, after) == (0, 1)  # the reader saw the last commit, not the open write


async def test_sqlite_close_ends_its_threads_and_later_reads_are_answered_503(
        tmp_path: Path) -> None:
    engine = await _open_sqlite(tmp_path)
    db = engine.db
    assert isinstance(db, sqlite.Database)
    await engine.submit(_row(0))
    assert len(_engine_threads(db.path)) == 2  # one writer, one reader

    await db.close()
    for t in _engine_threads(db.path):
        t.join(10)

    assert _engine_threads(db.path) == []
    with pytest.raises(Unavailable) as later:
        await db.read(lambda c: c.execute("SELECT 1").fetchone())
    assert later.value.http_status == 503


async def test_sqlite_a_failing_setup_leaves_no_thread_behind(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"

    def setup(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (x)")
        raise RuntimeError("migration refused")

    with pytest.raises(RuntimeError, match="migration refused"):
        await sqlite.Database.open(path, setup)
    for t in _engine_threads(path):
        t.join(10)

    assert _engine_threads(path) == []
