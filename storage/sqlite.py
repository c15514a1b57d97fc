"""The SQLite write engine on aiosqlite: one writer connection with group commit, and one reader.

Every write is a function ``fn(conn) -> T`` (or a ``BatchOp`` run for many callers at once)
queued to the writer. The writer drains what is queued, runs it all inside one
``BEGIN IMMEDIATE`` transaction with a savepoint per item (so one failing item cannot take the
others with it), commits, and only then resolves each caller's future: an answer never leaves
before its row is durable (``synchronous=FULL``). Later items in a batch see the rows earlier
items wrote, so decisions stay serial. Reads use a second, read-only connection (WAL: they
never block the writer). Other processes (the CLI) may write too: ``busy_timeout`` covers them.
A weighed op's light args drained beside heavy ones of other owners commit first, in a
transaction of their own (``light_first``), so a lone write does not wait for a big one; and a
heavy batch runs ``HEAVY_CHUNK`` of weight at a time, and a light arg of another owner
queued meanwhile joins the transaction after the current chunk, which then commits: it
waits for a chunk and one commit rather than the whole batch.

Each connection is an aiosqlite connection, whose thread runs one queued call at a time. A
whole batch's transaction (or a whole read) is one such call on the plain ``sqlite3``
connection, never one await per statement: aiosqlite's hop to its thread and back costs
tens of microseconds, so it is paid per batch. bench/storage_engine.py measures the
difference. (A transaction that light args join is two calls: between them the event loop
takes what was queued; nothing else is awaited with a transaction open.)
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
import structlog

from tidemesh.core.errors import InsufficientStorage, TidemeshError, Unavailable
from tidemesh.storage.engine import BatchOp, fail_batch, fails_batch, one_arg_failed
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

# How long a thread may keep the GIL while another waits for it; CPython's default is 5 ms.
# The writer thread runs SQLite without the GIL and takes it back when each sqlite3 call of
# its transaction returns; beside a busy event loop, that waited up to the whole interval
# each time. At 0.2 ms the daemon took 3.2k-3.5k lone sends/s at 64 connections against
# 3.1k with the default, and 16.4k-17.7k against 11.6k-15.0k messages/s in send_batch
# (interleaved runs, docs/daemon.md).
GIL_SWITCH_INTERVAL_S = 0.0002


def share_gil_with_writers() -> None:
    """Let writer threads have the GIL back sooner; the composition roots call it once, before
    their event loop starts. A process without writer threads is unaffected (no thread ever
    waits for the GIL)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def configure(conn: sqlite3.Connection, *, readonly: bool = False) -> None:
    """The PRAGMAs of every connection, set in this one place."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
        return
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")


def journal_savepoints_in_memory(conn: sqlite3.Connection) -> None:
    """For the writer once its setup is done: its savepoints' journals (and any temporary
    table or index its statements make) stay in memory. Every batch op runs under a
    savepoint, and SQLite spills a savepoint's journal past 64 KiB to a temporary file, which
    the inbox's search index (its segment merges) made happen in most commits: a file made,
    written and unlinked per commit (about 60 µs of CPU in a one-message commit), and message
    text on a disk outside the daemon's folder. A batch journals only the pages it changes;
    migrations and an index rebuild, which may change a whole database, run before this and
    keep spilling to disk."""
    conn.execute("PRAGMA temp_store = MEMORY")


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


@dataclass(slots=True, kw_only=True)
class _Item(Pending):
    fn: Callable[[sqlite3.Connection], Any] | None = None
    op: BatchOp[Any, Any] | None = None
    arg: Any = None
    durable: bool = True


# An arg of at most this weight is light (a lone send or a few); ``light_first``.
LIGHT_WEIGHT = 16
# A heavy batch runs this much weight between chances to commit early (``Plan``): what a light
# arg queued behind it waits for at most. A caller with one big arg splits it to this size
# (the broker's accept does) so that the chance comes inside it too.
HEAVY_CHUNK = 32
# Chunks are run only while light args come (one was queued this recently): each chunk's run
# costs its statements again, which a batch with no one behind it need not pay.
LIGHT_RECENT_S = 1.0


@dataclass(slots=True)
class Plan:
    """How one transaction runs a drained batch: ``light`` first, then ``heavy`` in chunks of
    ``HEAVY_CHUNK`` weight. Before each chunk the writer puts the rest off when a light arg
    waits: one of an owner not in ``heavy`` queued since the drain joins the transaction
    (``_joining``) and it commits; with one of this batch it commits at once. Except that a
    batch whose heavy args were put off last time without any of them running (``owed``)
    runs one chunk first: heavy args are slowed by light ones, never starved. ``weighed`` is
    False for a batch that is not all of one weighed op: it runs whole, as it always did."""

    light: list[_Item]
    heavy: list[_Item]
    weighed: bool = False
    owed: bool = False
    heavy_owners: frozenset[Hashable] = frozenset()
    chunk: int = HEAVY_CHUNK    # the weight run between chances (no chances: unbounded)


def split_light(items: Sequence[_Item], blocked: set[Hashable]
                ) -> tuple[list[_Item], list[_Item]]:
    """The light args of owners not in ``blocked`` (they may go first) and the rest, in
    order. An owner keeps its order: once it has an arg in the rest it is added to
    ``blocked``, so its later light args stay behind too. Nothing goes before a write that is
    not of a weighed op."""
    light: list[_Item] = []
    rest: list[_Item] = []
    behind_unweighed = False
    for it in items:
        op = it.op
        if op is None or op.weight is None or op.owner is None:
            behind_unweighed = True
        elif not behind_unweighed:
            owner = op.owner(it.arg)
            if owner not in blocked and op.weight(it.arg) <= LIGHT_WEIGHT:
                light.append(it)
                continue
            blocked.add(owner)
        rest.append(it)
    return light, rest


def light_first(batch: Sequence[_Item]
                ) -> tuple[list[_Item], list[_Item], frozenset[Hashable]] | None:
    """Split a drained batch of one weighed op into its light args, the rest, and the owners
    of the rest: the light ones run first. With one writer, a lone send queued beside a
    flood's frame would otherwise wait for that frame's rows too. None for a batch that is
    not all of one weighed op."""
    op = batch[0].op if batch else None
    if op is None or op.weight is None or op.owner is None or any(
            it.op is not op for it in batch):
        return None
    owners: set[Hashable] = set()
    light, heavy = split_light(batch, owners)
    return light, heavy, frozenset(owners)


def next_chunk(items: list[_Item], chunk: int) -> tuple[list[_Item], list[_Item]]:
    """The first ``chunk`` of weight of a weighed batch's heavy args (at least one arg), and
    the rest."""
    op = items[0].op if items else None
    assert op is not None
    assert op.weight is not None
    total = 0
    for i, it in enumerate(items):
        total += op.weight(it.arg)
        if total >= chunk:
            return items[:i + 1], items[i + 1:]
    return items, []


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
        self._deferred: list[_Item] = []   # heavy args a commit put off (``Plan``)
        self._owed = False                 # ... without running any of them
        # Owners of the light args queued since the last drain. Appended on the event loop,
        # read by the writer's thread between chunks (a list append is atomic).
        self._lights_queued: list[Hashable] = []
        self._light_at = -LIGHT_RECENT_S      # when the last light arg was queued (monotonic)
        self._stop_seen = False               # close()'s None was drained by ``_joining``
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
            await _on_thread(db._wconn, journal_savepoints_in_memory)
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

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool = True) -> T:
        """Run ``fn`` in the next group-committed transaction; returns after COMMIT.

        ``durable=False`` is for writes that a power cut may undo without harm (the outbox's
        claim of rows for the wire, its settling of the broker's answers: both are done
        again after a restart, and the broker's dedupe answers the resend). A transaction
        of such writes alone commits with ``synchronous=NORMAL``: atomic, and on disk with
        the next durable commit's WAL sync, but with no sync of its own on the path of a
        message. One durable write in the batch makes the whole transaction durable."""
        result: T = await self._enqueue(
            _Item(future=self._new_future(), fn=fn, durable=durable))
        return result

    async def submit(self, op: BatchOp[A, T], arg: A) -> T:
        """Run ``op`` for ``arg`` together with the other queued args of the same op."""
        if op.weight is not None and op.owner is not None and op.weight(arg) <= LIGHT_WEIGHT:
            self._lights_queued.append(op.owner(arg))
            self._light_at = time.monotonic()
        result: T = await self._enqueue(_Item(future=self._new_future(), op=op, arg=arg))
        return result

    async def submit_all(self, op: BatchOp[A, T], args: Sequence[A]
                         ) -> list[T | BaseException]:
        """``submit`` for each of ``args``, queued at once and in order (no other caller's
        write lands between them): each arg's result, or the error it met. They may commit
        in more than one transaction. The parts of one caller's write: none counts as a
        light arg queued (the last part of a big frame is often small)."""
        items = [_Item(future=self._new_future(), op=op, arg=arg) for arg in args]
        for it in items:
            self._put(it)
        got: list[T | BaseException] = await asyncio.gather(
            *(it.future for it in items), return_exceptions=True)
        return got

    def _new_future(self) -> asyncio.Future[Any]:
        if self._loop is None:
            raise Unavailable(f"the {self.name} database writer is not running")
        return self._loop.create_future()

    async def _enqueue(self, item: _Item) -> Any:
        self._put(item)
        return await item.future

    def _put(self, item: _Item) -> None:
        if self._task is None or self._task.done():
            raise Unavailable(f"the {self.name} database writer is not running")
        self._queue.put_nowait(item)

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
                    await self._commit_batch(batch, stopping)
        finally:
            fail_all(self._queue, batch + self._deferred,
                     Unavailable(f"the {self.name} database writer stopped"))

    async def _next_batch(self) -> tuple[list[_Item], bool]:
        # Put-off heavy args come first: they were queued before anything queued now.
        batch, self._deferred = self._deferred, []
        if self._stop_seen:
            return batch, True
        if not batch:
            first = await self._queue.get()
            if first is None:
                return [], True
            batch = [first]
        stopping = take(self._queue, batch, self.batch_max)
        self._lights_queued = []
        return batch, stopping

    def _plan(self, batch: list[_Item], stopping: bool) -> Plan:
        split = None if stopping else light_first(batch)   # closing: commit it all
        if split is None:
            return Plan([], batch)
        light, heavy, owners = split
        recent = time.monotonic() - self._light_at < LIGHT_RECENT_S
        return Plan(light, heavy, weighed=True, owed=self._owed, heavy_owners=owners,
                    chunk=HEAVY_CHUNK if recent else sys.maxsize)

    async def _commit_batch(self, batch: list[_Item], stopping: bool) -> None:
        conn = self._wconn
        assert conn is not None
        plan = self._plan(batch, stopping)
        started = time.perf_counter()
        left, still_open = await _on_thread(conn, lambda c: self._run_plan(c, plan))
        done = plan.light + plan.heavy[:len(plan.heavy) - len(left)]
        rest: list[_Item] = []
        if still_open:
            # A light arg of another owner was queued while the heavy ones ran: it joins
            # this transaction, so it waits for one commit, not for two.
            joining, rest = self._joining(plan.heavy_owners)
            await _on_thread(conn, lambda c: self._finish(c, joining, done))
            done += joining
        self._owed = bool(left) and len(left) == len(plan.heavy)
        self._deferred = left + rest
        self._record(len(done), time.perf_counter() - started)
        answer(done)

    def _light_queued(self, plan: Plan) -> bool:
        """On the writer's thread: was a light arg queued since the drain that the rest of
        ``plan`` holds up (one of an owner with nothing in it)?"""
        return any(owner not in plan.heavy_owners for owner in self._lights_queued)

    def _run_plan(self, conn: sqlite3.Connection, plan: Plan) -> tuple[list[_Item], bool]:
        """Begin a transaction and run ``plan``: the heavy args it put off, and whether it
        left the transaction open for the light args queued meanwhile (``_finish``)."""
        left = plan.heavy
        # Only plain writes may be non-durable, and a plan of them runs whole: a weighed plan,
        # the only kind left open for others to join (``_finish``), is always durable.
        durable = plan.weighed or any(it.durable for it in plan.light + plan.heavy)
        try:
            if not durable:
                conn.execute("PRAGMA synchronous = NORMAL")  # per transaction; see ``write``
            conn.execute("BEGIN IMMEDIATE")
            self._run_items(conn, plan.light)
            if not plan.weighed:
                self._run_items(conn, left)
                left = []
            ran = 0
            while left:
                if ran or not plan.owed:
                    if self._light_queued(plan):
                        return left, True
                    if plan.light:
                        break
                chunk, left = next_chunk(left, plan.chunk)
                self._run_items(conn, chunk)
                ran += 1
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._failed(conn, exc, plan.light + plan.heavy)
            return [], False
        finally:
            if not durable and not conn.in_transaction:
                conn.execute("PRAGMA synchronous = FULL")
        return left, False

    def _joining(self, heavy_owners: frozenset[Hashable]) -> tuple[list[_Item], list[_Item]]:
        """On the loop, the transaction open: take what was queued; the light args of owners
        with nothing ahead join it, the rest is put off in its order. Nothing overtakes a
        write that is not of a weighed op."""
        queued: list[_Item] = []
        self._stop_seen = take(self._queue, queued, self.batch_max)
        self._lights_queued = []
        return split_light(queued, set(heavy_owners))

    def _finish(self, conn: sqlite3.Connection, joining: list[_Item], done: list[_Item]) -> None:
        """Run ``joining`` in the transaction ``_run_plan`` left open, and commit."""
        try:
            self._run_items(conn, joining)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._failed(conn, exc, done + joining)

    def _failed(self, conn: sqlite3.Connection, exc: sqlite3.Error, items: list[_Item]) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        fail_batch(self.name, items, storage_error(exc, self.name), exc, path=str(self.path))

    def _run_items(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        """Run ``batch`` in order: each run of one op's args as one ``op.run``."""
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

    def _run_op(self, conn: sqlite3.Connection, op: BatchOp[Any, Any], items: list[_Item]) -> None:
        """One ``op.run`` under a savepoint; if it fails, each arg alone (``engine``)."""
        conn.execute("SAVEPOINT run")
        try:
            results = cast(list[Any], op.run(conn, [it.arg for it in items]))
        except Exception as exc:
            conn.execute("ROLLBACK TO run")
            conn.execute("RELEASE run")
            if isinstance(exc, sqlite3.Error) and fails_batch(storage_error(exc, self.name)):
                raise
            for it in items:
                it.fn = lambda c, arg=it.arg: cast(list[Any], op.run(c, [arg]))[0]
                self._run_item(conn, it, op.name)
            return
        conn.execute("RELEASE run")
        for it, res in zip(items, results, strict=True):
            it.result = res

    def _run_item(self, conn: sqlite3.Connection, item: _Item, what: str = "write") -> None:
        assert item.fn is not None
        conn.execute("SAVEPOINT item")
        try:
            item.result = item.fn(conn)
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK TO item")
            item.error = err = storage_error(exc, self.name)
            if fails_batch(err):
                conn.execute("RELEASE item")
                raise
            one_arg_failed(self.name, what, err)
        except Exception as exc:
            conn.execute("ROLLBACK TO item")
            item.error = exc
            # A TidemeshError is the op refusing this arg (its answer); anything else, e.g.
            # an integer past 64 bits, is a fault of this arg alone: logged, the writer goes on.
            if not isinstance(exc, TidemeshError):
                one_arg_failed(self.name, what, exc)
        conn.execute("RELEASE item")
