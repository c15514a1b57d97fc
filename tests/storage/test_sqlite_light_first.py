"""The SQLite engine's one writer under mixed load: a light write queued beside a heavy one
commits first, in a transaction of its own, and one owner's writes keep their order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from tidemesh.storage import sqlite
from tidemesh.storage.engine import BatchOp

Part = tuple[str, int]   # (owner, part)


def _put(conn: sqlite3.Connection, args: Sequence[list[Part]]) -> list[int]:
    for parts in args:
        conn.executemany("INSERT INTO part (owner, n) VALUES (?, ?)", parts)
    return [len(parts) for parts in args]


PUT = BatchOp("put", _put, weight=len, owner=lambda parts: parts[0][0])


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


class Gate:
    """Holds the writer inside each flood chunk until the test lets it go on."""

    def __init__(self) -> None:
        self.entered: asyncio.Queue[int] = asyncio.Queue()
        self.go = threading.Semaphore(0)
        self.loop = asyncio.get_running_loop()
        self.calls = 0
        self.op = BatchOp("put", self.put, weight=len, owner=lambda parts: parts[0][0])

    def open(self, chunks: int) -> None:
        """Let the writer through this many flood chunks."""
        for _ in range(chunks):
            self.go.release()

    async def inside(self) -> int:
        """Wait until the writer is in a flood chunk (fails fast when it never is)."""
        return await asyncio.wait_for(self.entered.get(), 10)

    def put(self, conn: sqlite3.Connection, args: Sequence[list[Part]]) -> list[int]:
        if args[0][0][0] == "flood":
            self.calls += 1
            self.loop.call_soon_threadsafe(self.entered.put_nowait, self.calls)
            self.go.acquire(timeout=10)
        return _put(conn, args)


def _order(path: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute("SELECT owner, n FROM part ORDER BY seq")]
    finally:
        conn.close()


async def _open(path: Path) -> sqlite.Database:
    return await sqlite.Database.open(path, lambda c: c.execute(
        "CREATE TABLE part (seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, n INTEGER)"))


def _flood(chunks: int) -> list[list[Part]]:
    size = sqlite.HEAVY_CHUNK
    return [[("flood", i * size + j) for j in range(size)] for i in range(chunks)]


async def _flooding(db: sqlite.Database, gate: Gate, flood: list[list[Part]]
                    ) -> asyncio.Future[list[int | BaseException]]:
    """A light writer has been about (a lone write committed), then ``flood`` is queued in
    parts: its future (the writer is not yet held in it)."""
    assert await db.submit(gate.op, [("lone", -1)]) == 1
    return asyncio.ensure_future(db.submit_all(gate.op, flood))


async def test_a_light_write_queued_while_a_heavy_batch_runs_waits_for_one_chunk_of_it(
        tmp_path: Path) -> None:
    db = await _open(tmp_path / "chunks.db")
    gate = Gate()
    flood = _flood(3)
    try:
        heavy = await _flooding(db, gate, flood)
        await gate.inside()                    # the writer is in the flood's first chunk
        lone = asyncio.ensure_future(db.submit(gate.op, [("lone", 0)]))
        await asyncio.sleep(0)                 # queued while that chunk runs
        gate.open(len(flood))
        assert await lone == 1
        assert await heavy == [sqlite.HEAVY_CHUNK] * 3
        # The first chunk with the lone write in its transaction, then the rest of the flood.
        assert (db.batches, db.items) == (1 + 2, 1 + 4)
    finally:
        gate.open(3)
        await db.close()
    first = [("flood", n) for n in range(sqlite.HEAVY_CHUNK)]
    rest = [("flood", n) for n in range(sqlite.HEAVY_CHUNK, 3 * sqlite.HEAVY_CHUNK)]
    assert _order(tmp_path / "chunks.db") == [("lone", -1), *first, ("lone", 0), *rest]


async def test_light_writes_arriving_all_the_time_slow_a_heavy_batch_but_never_starve_it(
        tmp_path: Path) -> None:
    db = await _open(tmp_path / "steady.db")
    gate = Gate()
    flood = _flood(3)
    lones = []
    try:
        heavy = await _flooding(db, gate, flood)
        for n in range(len(flood)):            # a lone write queued during every chunk
            await gate.inside()
            lones.append(asyncio.ensure_future(db.submit(gate.op, [("lone", n)])))
            await asyncio.sleep(0)
            gate.open(1)
        assert await heavy == [sqlite.HEAVY_CHUNK] * 3
        assert await asyncio.gather(*lones) == [1, 1, 1]
    finally:
        gate.open(3)
        await db.close()
    want: list[tuple[str, int]] = [("lone", -1)]
    for i, chunk in enumerate(flood):          # each round: a chunk, then the lone write
        want += [*chunk, ("lone", i)]
    assert _order(tmp_path / "steady.db") == want


async def test_with_no_light_writer_about_a_heavy_batch_commits_whole(tmp_path: Path) -> None:
    db = await _open(tmp_path / "whole.db")
    gate = Gate()
    flood = _flood(3)
    try:
        heavy = asyncio.ensure_future(db.submit_all(gate.op, flood))
        assert await gate.inside() == 1
        gate.open(1)
        assert await heavy == [sqlite.HEAVY_CHUNK] * 3
        # One transaction, and the op ran once for all three args (no chunks to pay for).
        assert (db.batches, db.items, gate.calls) == (1, 3, 1)
    finally:
        gate.open(1)
        await db.close()


async def test_close_while_a_lone_write_joins_a_heavy_batch_commits_everything_queued(
        tmp_path: Path) -> None:
    db = await _open(tmp_path / "close.db")
    gate = Gate()
    flood = _flood(3)
    try:
        heavy = await _flooding(db, gate, flood)
        await gate.inside()
        lone = asyncio.ensure_future(db.submit(gate.op, [("lone", 0)]))
        closing = asyncio.ensure_future(db.close())   # queued behind the lone write
        await asyncio.sleep(0)
    finally:
        gate.open(len(flood))
    await closing
    assert await lone == 1
    assert await heavy == [sqlite.HEAVY_CHUNK] * 3
    assert len(_order(tmp_path / "close.db")) == 2 + 3 * sqlite.HEAVY_CHUNK


async def test_a_lone_write_does_not_overtake_a_plain_write_queued_before_it(
        tmp_path: Path) -> None:
    db = await _open(tmp_path / "plain.db")
    gate = Gate()
    flood = _flood(2)
    try:
        heavy = await _flooding(db, gate, flood)
        await gate.inside()
        plain = asyncio.ensure_future(db.write(
            lambda c: c.execute("INSERT INTO part (owner, n) VALUES ('plain', 0)").rowcount))
        lone = asyncio.ensure_future(db.submit(gate.op, [("lone", 0)]))
        await asyncio.sleep(0)
        gate.open(len(flood))
        assert (await heavy, await plain, await lone) == ([sqlite.HEAVY_CHUNK] * 2, 1, 1)
    finally:
        gate.open(len(flood))
        await db.close()
    order = _order(tmp_path / "plain.db")
    assert order.index(("plain", 0)) < order.index(("lone", 0))
