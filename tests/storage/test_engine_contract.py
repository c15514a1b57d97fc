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

from tidemesh.core.errors import InsufficientStorage, InvalidRequest, TidemeshError, Unavailable
from tidemesh.storage import postgres, sqlite
from tidemesh.storage.engine import BatchOp, Engine

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


SQLITE_INSERT = BatchOp("insert", _sqlite_insert)
PG_INSERT = BatchOp("insert", _pg_insert, owner=lambda r: r[0], key=lambda r: r[0])


@dataclass
class Subject:
    """One engine under test (as the ``Engine`` protocol, nothing more), its insert op, and
    a look at what committed over a connection of its own."""

    db: Engine
    op: BatchOp[Row, str]
    committed: Callable[[], Awaitable[set[str]]]

    async def submit(self, row: Row) -> str:
        return await self.db.submit(self.op, row)


async def _open_sqlite(folder: Path) -> Subject:
    path = folder / "contract.db"
    db = await sqlite.Database.open(path, lambda c: c.execute(TABLE.format(blob="BLOB")))

    async def committed() -> set[str]:
        conn = sqlite3.connect(path)
        try:
            return {r[0] for r in conn.execute("SELECT k FROM item")}
        finally:
            conn.close()

    return Subject(db, SQLITE_INSERT, committed)


async def _open_postgres(dsn: str, tablespace: str | None = None) -> Subject:
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

    return Subject(db, PG_INSERT, committed)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A folder for the SQLite file, or a fresh PostgreSQL database's DSN."""
    if request.param == "sqlite":
        return tmp_path
    dsn: str = request.getfixturevalue("pg_database")
    return dsn


@pytest.fixture
async def engine(where: Path | str) -> AsyncIterator[Subject]:
    e = await (_open_sqlite(where) if isinstance(where, Path) else _open_postgres(where))
    try:
        yield e
    finally:
        await e.db.close()


def _row(i: int, v: int = 1, blob: bytes = b"") -> Row:
    return (f"k{i:04d}", v, blob)


async def test_concurrent_callers_share_transactions_and_hear_back_after_commit(
        engine: Subject) -> None:
    async def one(i: int) -> bool:
        key = await engine.submit(_row(i))
        return key in await engine.committed()  # durable before the caller heard back

    seen = await asyncio.gather(*(one(i) for i in range(200)))

    assert all(seen)
    assert len(await engine.committed()) == 200
    assert engine.db.items == 200
    assert engine.db.batches < 200


async def test_one_failing_item_does_not_fail_the_rest_of_its_batch(engine: Subject) -> None:
    rows = [_row(i, v=-1 if i == 7 else 1) for i in range(20)]

    answers = await asyncio.gather(*(engine.submit(r) for r in rows), return_exceptions=True)

    (failed,) = [a for a in answers if isinstance(a, BaseException)]
    assert isinstance(failed, Unavailable) and failed.http_status == 503
    assert await engine.committed() == {r[0] for r in rows} - {"k0007"}


async def test_an_op_refusing_one_arg_fails_that_arg_alone(engine: Subject) -> None:
    """An op may refuse an arg with a ``TidemeshError`` (a rule, not a statement): the run
    is rolled back and redone arg by arg, and only the refused arg hears of it."""
    async def refusing(conn: Any, rows: Sequence[Row]) -> list[str]:
        if any(r[1] == 13 for r in rows):
            raise InvalidRequest("13 is refused", field="v")
        return await _pg_insert(conn, rows)

    engine.op = BatchOp("refusing", refusing if isinstance(engine.db, postgres.Database)
                        else _refusing_sync, owner=engine.op.owner, key=engine.op.key)
    rows = [_row(i, v=13 if i == 3 else 1) for i in range(12)]

    answers = await asyncio.gather(*(engine.submit(r) for r in rows), return_exceptions=True)

    (refused,) = [a for a in answers if isinstance(a, BaseException)]
    assert isinstance(refused, InvalidRequest) and refused.http_status == 400
    assert await engine.committed() == {r[0] for r in rows} - {"k0003"}
    assert not any(t.done() for t in engine.db.writer_tasks)


async def test_an_arg_the_driver_cannot_bind_fails_that_arg_alone(engine: Subject) -> None:
    """An integer past 64 bits is no statement's error but the driver's (``OverflowError``
    in sqlite3, a client-side ``DataError`` in asyncpg): it fails its arg alone, and the
    writer goes on taking writes (it used to stop, and the broker with it)."""
    rows = [_row(i, v=2**63 if i == 5 else 1) for i in range(12)]

    answers = await asyncio.gather(*(engine.submit(r) for r in rows), return_exceptions=True)

    assert [i for i, a in enumerate(answers) if isinstance(a, BaseException)] == [5]
    assert await engine.committed() == {r[0] for r in rows} - {"k0005"}
    assert not any(t.done() for t in engine.db.writer_tasks)
    assert await engine.submit(_row(99)) == "k0099"


def _refusing_sync(conn: sqlite3.Connection, rows: Sequence[Row]) -> list[str]:
    if any(r[1] == 13 for r in rows):
        raise InvalidRequest("13 is refused", field="v")
    return _sqlite_insert(conn, rows)


async def test_submit_all_answers_each_arg_in_order(engine: Subject) -> None:
    rows = [_row(i, v=-1 if i == 2 else 1) for i in range(6)]

    answers = await engine.db.submit_all(engine.op, rows)

    assert answers[:2] == ["k0000", "k0001"] and answers[3:] == ["k0003", "k0004", "k0005"]
    assert isinstance(answers[2], Unavailable)
    assert await engine.committed() == {r[0] for r in rows} - {"k0002"}


async def test_a_dead_writer_answers_503_to_queued_and_later_callers(engine: Subject) -> None:
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


async def test_close_commits_everything_queued_before_it(engine: Subject) -> None:
    queued = [asyncio.ensure_future(engine.submit(_row(i))) for i in range(50)]
    await asyncio.sleep(0)  # every caller has queued its row

    await engine.db.close()

    assert sorted(await asyncio.gather(*queued)) == [_row(i)[0] for i in range(50)]
    assert len(await engine.committed()) == 50


async def _fill_until_refused(engine: Subject) -> TidemeshError:
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
