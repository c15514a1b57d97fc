"""The SQLite write engine on aiosqlite: one writer connection with group commit, and one reader.

Every write is a function ``fn(conn) -> T`` (or a ``BatchOp`` run for many callers at once)
queued to the writer. The writer drains what is queued, runs it all inside one
``BEGIN IMMEDIATE`` transaction with a savepoint per item (so one failing item cannot take the
others with it), commits, and only then resolves each caller's future: an answer never leaves
before its row is durable (``synchronous=FULL``). Later items in a batch see the rows earlier
items wrote, so decisions stay serial. Reads use a second, read-only connection (WAL: they
never block the writer). Other processes (the CLI) may write too: ``busy_timeout`` covers them.
A weighed op's light args drained beside heavy ones of other owners commit first, in a
transaction of their own (``light_first``), so a lone write does not wait for a big one.

Each connection is an aiosqlite connection, whose thread runs one queued call at a time. A
whole batch's transaction (or a whole read) is one such call on the plain ``sqlite3``
connection, never one await per statement: aiosqlite's hop to its thread and back costs
tens of microseconds, so it is paid per batch. bench/storage_engine.py measures the
difference.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiosqlite
import structlog

from tidemesh.core.errors import InsufficientStorage, TidemeshError, Unavailable
from tidemesh.storage.pending import Pending, answer, fail_all, take
from tidemesh.storage.stats import BatchCounters

T = TypeVar("T")
A = TypeVar("A")
log = structlog.get_logger(__name__)

SQLITE_FULL = 13
# The longer of the two timeouts the daemon (5 s) and the broker (10 s) used to set. Only
# another process (the CLI's offline commands, a backup) can hold the write lock, and giving
# up early turns its brief hold into a 503 that nothing was stored; waiting costs latency
# only while that happens. The writer thread waits, never the event loop.
BUSY_TIMEOUT_MS = 10_000


def configure(conn: sqlite3.Connection, *, readonly: bool = False) -> None:
    """The PRAGMAs of every connection, set in this one place."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
        return
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")


def create_private(path: Path) -> None:
    """Make the database file 0600 before SQLite opens it: SQLite would create it with the
    umask's mode (usually 0644), and it gives the -wal and -shm files it creates the database
    file's mode. An existing file is narrowed too, so older stores become private."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if not readonly:
        create_private(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    configure(conn, readonly=readonly)
    return conn


async def _open_thread(path: Path, *, readonly: bool, thread: str) -> aiosqlite.Connection:
    """An aiosqlite connection whose thread opened ``connect(path)``: every PRAGMA is set by
    ``configure`` as for any other connection."""

    def connector() -> sqlite3.Connection:
        threading.current_thread().name = thread  # names the thread in py-spy and dumps
        return connect(path, readonly=readonly)

    conn = aiosqlite.Connection(connector, iter_chunk_size=64)
    # A database left open (a crash before close) must not keep the process from exiting:
    # aiosqlite's thread waits for work until closed. SQLite's journal makes a cut-off
    # transaction harmless, and no caller heard back about it.
    conn._thread.daemon = True
    return await conn


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` on the connection's thread as one call. aiosqlite has no public way to run
    a callable there; ``_execute`` is what its own methods use (the version is pinned)."""
    result: T = await conn._execute(lambda: fn(conn._conn))  # type: ignore[no-untyped-call]
    return result


def storage_error(exc: sqlite3.Error, name: str) -> TidemeshError:
    """Map a SQLite failure to the error the caller sees: 507 when the disk is full, else 503;
    ``name`` says which database."""
    code = getattr(exc, "sqlite_errorcode", None)
    text = str(exc)
    if code == SQLITE_FULL or "full" in text or "too large" in text:
        return InsufficientStorage(
            f"the {name} database could not be written: {text}; nothing was stored")
    return Unavailable(f"the {name} database is unavailable: {text}; nothing was stored")


@dataclass(frozen=True, slots=True)
class BatchOp(Generic[A, T]):
    """A write that runs for many callers at once: ``run(conn, args)`` returns one result per
    arg, in order, deciding each against what the ones before it wrote. It must be all or
    nothing; if it raises, the batch falls back to one savepoint per arg."""

    name: str
    run: Callable[[sqlite3.Connection, Sequence[A]], list[T]]
    # Both or neither: the rows an arg writes and whose it is (``light_first``).
    weight: Callable[[A], int] | None = None
    owner: Callable[[A], Hashable] | None = None


@dataclass(slots=True, kw_only=True)
class _Item(Pending):
    fn: Callable[[sqlite3.Connection], Any] | None = None
    op: BatchOp[Any, Any] | None = None
    arg: Any = None


# An arg of at most this weight is light (a lone send or a few); ``light_first``.
LIGHT_WEIGHT = 16


def light_first(batch: Sequence[_Item]) -> tuple[list[_Item], list[_Item]] | None:
    """Split a drained batch of one weighed op that mixes light args with heavy ones: the
    light ones commit first, in a transaction of their own, and the heavy ones next. With one
    writer, a lone send queued beside a flood's frame would otherwise wait for that frame's
    rows too. An owner's args keep their order (one behind its own heavy arg is deferred with
    it); anything else, or a batch of one weight, is not split (None)."""
    op = batch[0].op if batch else None
    if op is None or op.weight is None or op.owner is None or any(
            it.op is not op for it in batch):
        return None
    light: list[_Item] = []
    heavy: list[_Item] = []
    deferred: set[Hashable] = set()
    for it in batch:
        owner = op.owner(it.arg)
        if owner in deferred or op.weight(it.arg) > LIGHT_WEIGHT:
            deferred.add(owner)
            heavy.append(it)
        else:
            light.append(it)
    return (light, heavy) if light and heavy else None


class Database(BatchCounters):
    """Async facade over one SQLite file; construct with ``Database.open``. ``name`` (the
    file's stem unless given) names the database in errors, logs and thread names."""

    def __init__(self, path: Path, batch_max: int = 512, name: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.name = name or path.stem
        self.batch_max = batch_max
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._wconn: aiosqlite.Connection | None = None
        self._rconn: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._deferred: list[_Item] = []   # heavy args ``light_first`` put off one commit
        # The writer's loop, known once: on Python 3.11 every get_running_loop() is a
        # getpid() system call, ~5 % of the daemon's event loop at 64 senders (py-spy).
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def open(cls, path: Path, setup: Callable[[sqlite3.Connection], None],
                   batch_max: int = 512, *, name: str | None = None) -> Database:
        """Open, run ``setup`` (migrations, checks) on the writer, then start the writer task."""
        db = cls(path, batch_max, name)
        try:
            db._wconn = await _open_thread(path, readonly=False, thread=f"sqlite-w-{path.name}")
            await _on_thread(db._wconn, setup)
            db._rconn = await _open_thread(path, readonly=True, thread=f"sqlite-r-{path.name}")
        except BaseException:
            await db._close_connections()
            raise
        db._loop = asyncio.get_running_loop()
        db._task = asyncio.create_task(db._run(), name=f"sqlite-writer-{path.name}")
        return db

    @property
    def writer(self) -> asyncio.Task[None]:
        """The writer task, for the composition root to supervise."""
        assert self._task is not None
        return self._task

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        return [self.writer]

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in the next group-committed transaction; returns after COMMIT."""
        result: T = await self._enqueue(
            _Item(future=self._new_future(), fn=fn))
        return result

    async def submit(self, op: BatchOp[A, T], arg: A) -> T:
        """Run ``op`` for ``arg`` together with the other queued args of the same op."""
        result: T = await self._enqueue(
            _Item(future=self._new_future(), op=op, arg=arg))
        return result

    def _new_future(self) -> asyncio.Future[Any]:
        if self._loop is None:
            raise Unavailable(f"the {self.name} database writer is not running")
        return self._loop.create_future()

    async def _enqueue(self, item: _Item) -> Any:
        if self._task is None or self._task.done():
            raise Unavailable(f"the {self.name} database writer is not running")
        self._queue.put_nowait(item)
        return await item.future

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the read-only connection (WAL: never blocks the writer)."""
        conn = self._rconn
        if conn is None:
            raise Unavailable(f"the {self.name} database is closed")
        try:
            return await _on_thread(conn, fn)
        except sqlite3.Error as exc:
            raise storage_error(exc, self.name) from exc

    async def close(self) -> None:
        """Finish everything queued, commit it, then close both connections."""
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(None)
            await self._task
        await self._close_connections()

    async def _close_connections(self) -> None:
        wconn, rconn = self._wconn, self._rconn
        self._wconn = self._rconn = None  # reads from now on are answered 503
        for conn in (wconn, rconn):
            if conn is not None:
                await conn.close()  # after what its thread has queued; then the thread ends

    async def _run(self) -> None:
        batch: list[_Item] = []
        try:
            stopping = False
            while not stopping:
                batch, stopping = await self._next_batch()
                if batch:
                    await self._commit_batch(batch)
        finally:
            fail_all(self._queue, batch + self._deferred,
                     Unavailable(f"the {self.name} database writer stopped"))

    async def _next_batch(self) -> tuple[list[_Item], bool]:
        if self._deferred:
            # Put off once only: these go now, with whatever is queued, light or not.
            batch, self._deferred = self._deferred, []
            return batch, take(self._queue, batch, self.batch_max)
        first = await self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        stopping = take(self._queue, batch, self.batch_max)
        split = None if stopping else light_first(batch)
        if split is None:
            return batch, stopping
        light, self._deferred = split
        return light, False

    async def _commit_batch(self, batch: list[_Item]) -> None:
        conn = self._wconn
        assert conn is not None
        started = time.perf_counter()
        await _on_thread(conn, lambda c: self._commit(c, batch))
        self._record(len(batch), time.perf_counter() - started)
        answer(batch)

    def _commit(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            start = 0
            while start < len(batch):
                op = batch[start].op
                end = start + 1
                while op is not None and end < len(batch) and batch[end].op is op:
                    end += 1
                if op is None:
                    self._run_item(conn, batch[start])
                else:
                    self._run_op(conn, op, batch[start:end])
                start = end
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            err = storage_error(exc, self.name)
            log.error(f"{self.name}_commit_failed", path=str(self.path), error=str(exc),
                      items=len(batch))
            for item in batch:
                item.error = err

    def _run_op(self, conn: sqlite3.Connection, op: BatchOp[Any, Any], items: list[_Item]) -> None:
        conn.execute("SAVEPOINT run")
        try:
            results = op.run(conn, [it.arg for it in items])
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK TO run")
            conn.execute("RELEASE run")
            if isinstance(storage_error(exc, self.name), InsufficientStorage):
                raise
            # One bad arg must not fail the others: retry each on its own savepoint.
            for it in items:
                it.fn = lambda c, arg=it.arg: op.run(c, [arg])[0]
                self._run_item(conn, it)
            return
        conn.execute("RELEASE run")
        for it, res in zip(items, results, strict=True):
            it.result = res

    def _run_item(self, conn: sqlite3.Connection, item: _Item) -> None:
        assert item.fn is not None
        conn.execute("SAVEPOINT item")
        try:
            item.result = item.fn(conn)
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK TO item")
            item.error = storage_error(exc, self.name)
            if isinstance(item.error, InsufficientStorage):
                conn.execute("RELEASE item")
                raise
        except Exception as exc:
            conn.execute("ROLLBACK TO item")
            item.error = exc
        conn.execute("RELEASE item")
