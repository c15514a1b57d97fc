"""bench/storage_engine: the SQLite write engine's group commit, on the daemon's real outbox.

Each caller submits one outbox accept (``outbox.ACCEPT``: a SELECT of the ids, the accept
table, one INSERT) and waits for its COMMIT (``synchronous=FULL``). Two loads: 64 concurrent
closed-loop callers (rows/s, caller p50/p99, rows per transaction) and one sequential caller
(accepts/s, p50/p99). Three writers in the same run, rounds interleaved, each on a fresh file:

- ``engine``: ``tidemesh.storage.sqlite.Database``, as the daemon runs it;
- ``thread``: the peer, a bare group commit on a one-thread executor and a stdlib connection
  (BEGIN IMMEDIATE, the same ``accept_many``, COMMIT): the floor the engine's own work adds to;
- ``aiosqlite-stmt``: a group commit whose every statement is its own aiosqlite await (what a
  port that calls ``await conn.execute`` per statement would pay);
- ``file`` (with ``--file``): another version of the engine module, loaded from a file, for a
  before/after in one run: ``git show REV:storage/sqlite.py > old_engine.py``.

Prints the median over rounds, [min-max], and each writer's ratio to ``thread``.

    .venv/bin/python bench/storage_engine.py [--seconds 3] [--rounds 3] [--modes engine,thread]
        [--file old_engine.py --modes engine,file,thread]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
import uvloop

from tidemesh.daemon.process.stores import _setup_outbox, open_outbox
from tidemesh.daemon.store import outbox
from tidemesh.storage import sqlite as engine_mod

PAYLOAD = b'{"to":"topic:bench","body":"' + b"x" * 200 + b'","body_encoding":"utf8"}'
Submit = Callable[[outbox.NewRow], Awaitable[Any]]


def _row(i: int, tag: str) -> outbox.NewRow:
    now = int(time.time() * 1000)
    return outbox.NewRow(id=f"{tag}{i:020d}", client_message_id=f"{tag}-{i}",
                         fingerprint=os.urandom(32), payload=PAYLOAD, dest_kind="topic",
                         dest_ref="bench", now_ms=now)


# ---------------------------------------------------------------- the writers under test
class Writer:
    """Opened on a migrated outbox file; ``submit`` answers after COMMIT."""

    batches = 0
    items = 0

    async def submit(self, new: outbox.NewRow) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class EngineWriter(Writer):
    def __init__(self, db: engine_mod.Database) -> None:
        self.db = db

    @classmethod
    async def open(cls, path: Path, module: Any = engine_mod) -> EngineWriter:
        return cls(await module.Database.open(path, _setup_outbox(path, False), 512))

    async def submit(self, new: outbox.NewRow) -> Any:
        return await self.db.submit(outbox.ACCEPT, new)

    async def close(self) -> None:
        self.batches, self.items = self.db.batches, self.db.items
        await self.db.close()


@dataclass
class _Queued:
    new: outbox.NewRow
    future: asyncio.Future[Any]


class _GroupCommit(Writer):
    """A queue drained by one task: whatever is queued is one transaction."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def submit(self, new: outbox.NewRow) -> Any:
        q = _Queued(new, asyncio.get_running_loop().create_future())
        self.queue.put_nowait(q)
        return await q.future

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < 512:
                batch.append(self.queue.get_nowait())
            results = await self._commit([q.new for q in batch])
            self.batches += 1
            self.items += len(batch)
            for q, r in zip(batch, results, strict=True):
                q.future.set_result(r)

    async def _commit(self, news: list[outbox.NewRow]) -> list[Any]:
        raise NotImplementedError

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class ThreadWriter(_GroupCommit):
    def __init__(self, path: Path) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.conn = self.pool.submit(engine_mod.connect, path).result()
        super().__init__()

    def _txn(self, news: list[outbox.NewRow]) -> list[Any]:
        self.conn.execute("BEGIN IMMEDIATE")
        results = outbox.accept_many(self.conn, news)
        self.conn.execute("COMMIT")
        return results

    async def _commit(self, news: list[outbox.NewRow]) -> list[Any]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._txn, news)

    async def close(self) -> None:
        await super().close()
        self.pool.submit(self.conn.close).result()
        self.pool.shutdown()


class AiosqliteStatementWriter(_GroupCommit):
    """accept_many's statements, each awaited on aiosqlite: BEGIN, SAVEPOINT, SELECT,
    fetchall, INSERT, RELEASE, COMMIT."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn
        super().__init__()

    @classmethod
    async def open(cls, path: Path) -> AiosqliteStatementWriter:
        conn = await aiosqlite.connect(path, isolation_level=None)
        for pragma in ("busy_timeout = 10000", "journal_mode = WAL", "synchronous = FULL"):
            await conn.execute(f"PRAGMA {pragma}")
        return cls(conn)

    async def _commit(self, news: list[outbox.NewRow]) -> list[Any]:
        c = self.conn
        await c.execute("BEGIN IMMEDIATE")
        await c.execute("SAVEPOINT run")
        ids = [n.client_message_id for n in news]
        cur = await c.execute(
            f"SELECT id FROM outbox WHERE client_message_id IN ({','.join('?' * len(ids))})",  # noqa: S608
            ids)
        found = {r[0] for r in await cur.fetchall()}
        await c.executemany(outbox._INSERT, [outbox._insert_args(n) for n in news])
        await c.execute("RELEASE run")
        await c.execute("COMMIT")
        return [n.id not in found for n in news]

    async def close(self) -> None:
        await super().close()
        await self.conn.close()


def _load_module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("bench_engine_from_file", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


FILE_ENGINE: Any = None


async def _open(mode: str, path: Path) -> Writer:
    # Every writer starts on the same migrated file, made by the daemon's own open.
    db = await open_outbox(path, 512, recover=False)
    await db.close()
    if mode == "engine":
        return await EngineWriter.open(path)
    if mode == "file":
        return await EngineWriter.open(path, FILE_ENGINE)
    if mode == "thread":
        return ThreadWriter(path)
    return await AiosqliteStatementWriter.open(path)


# ---------------------------------------------------------------- the loads
async def _load(w: Writer, conc: int, seconds: float, tag: str) -> dict[str, float]:
    lat: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await w.submit(_row(i, f"{tag}{c:02d}x"))
            lat.append(time.perf_counter() - t)
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(conc)))
    took = time.perf_counter() - started
    lat.sort()
    return {"rate": len(lat) / took, "p50": lat[len(lat) // 2] * 1e3,
            "p99": lat[int(len(lat) * 0.99)] * 1e3}


async def _one(mode: str, conc: int, seconds: float, folder: Path, rnd: int) -> dict[str, float]:
    path = folder / f"{mode}-{conc}-{rnd}.db"
    w = await _open(mode, path)
    try:
        out = await _load(w, conc, seconds, f"r{rnd}")
    finally:
        await w.close()
    out["per_txn"] = w.items / max(w.batches, 1)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return out


def _fmt(xs: list[float], unit: str = "", digits: int = 0) -> str:
    med = statistics.median(xs)
    return f"{med:,.{digits}f}{unit} [{min(xs):,.{digits}f}-{max(xs):,.{digits}f}]"


async def main(args: argparse.Namespace) -> None:
    global FILE_ENGINE
    modes = args.modes.split(",")
    if "file" in modes:
        FILE_ENGINE = _load_module(args.file)
    loads = [int(c) for c in args.concurrency.split(",")]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rnd in range(args.rounds):
            for conc in loads:
                for mode in modes:
                    r = await _one(mode, conc, args.seconds, Path(tmp), rnd)
                    results.setdefault((mode, conc), []).append(r)
                    print(f"  round {rnd} {mode:15} c={conc:<3} {r['rate']:8,.0f}/s "
                          f"p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms "
                          f"{r['per_txn']:.1f} rows/txn", file=sys.stderr, flush=True)
    print(f"aiosqlite {aiosqlite.__version__}, {args.rounds} rounds x {args.seconds} s,"
          f" synchronous=FULL, median [min-max]")
    print(f"{'writer':15} {'callers':>7}  {'accepts/s':>24} {'ratio':>6}  "
          f"{'p50 ms':>20} {'p99 ms':>22}  rows/txn")
    for conc in loads:
        peer = statistics.median(r["rate"] for r in results.get(("thread", conc), [{"rate": 0}]))
        for mode in modes:
            rs = results[(mode, conc)]
            rate = statistics.median(r["rate"] for r in rs)
            ratio = f"{rate / peer:.2f}x" if peer else "-"
            print(f"{mode:15} {conc:>7}  {_fmt([r['rate'] for r in rs]):>24} {ratio:>6}  "
                  f"{_fmt([r['p50'] for r in rs], digits=2):>20} "
                  f"{_fmt([r['p99'] for r in rs], digits=2):>22}  "
                  f"{statistics.median(r['per_txn'] for r in rs):.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="64,1")
    ap.add_argument("--modes", default="engine,thread,aiosqlite-stmt")
    ap.add_argument("--file", help="an engine module's file, measured as the mode 'file'")
    ap.add_argument("--dir", default=None, help="where the database files go (a real disk)")
    uvloop.run(main(ap.parse_args()))
