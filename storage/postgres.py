"""The PostgreSQL write engine (asyncpg): a pool for single statements, and writer loops that
group-commit batch operations.

Concurrent submissions are drained into batches by several writer connections (so batches
overlap each other's COMMIT; PostgreSQL flushes concurrent commits together). Each submission's
shard is its op's ``owner`` (the broker's accept: the sender). A shard with submissions in
flight sends the next to the writer that holds them, which keeps its submissions in arrival
order; a shard with none goes to the least loaded writer, so one member's big batches do not
hold up another member's send while a writer is free (fair load). A batch runs each operation
once for all its args, in one transaction, under the batch rules of ``engine`` (a savepoint per
run, redone arg by arg when it fails; a batch of one run has its transaction for savepoint).
Args of one ``key`` in one batch are split: the later ones wait for the writer's next batch, so
each is decided against what the first one wrote. Answers leave only after COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import asyncpg
import structlog
from asyncpg.exceptions._base import DataError as _EncodeError  # no public name: see _of_connection

from tidemesh.core.errors import InsufficientStorage, TidemeshError, Unavailable
from tidemesh.core.settings import ConfigError
from tidemesh.storage.engine import BatchOp, fail_batch, fails_batch, one_arg_failed
from tidemesh.storage.pending import Pending, answer, fail_all, take
from tidemesh.storage.stats import BatchCounters

T = TypeVar("T")
A = TypeVar("A")
log = structlog.get_logger(__name__)

# InternalClientError: a connection left mid-operation by a server that went away (e.g. a
# shutdown during a statement) refuses the next one; it is an outage of that connection.
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)
# Errors of the server or the connection, not of one arg: a savepoint retry cannot help.
_CONNECTION_ERRORS = (asyncpg.exceptions.OperatorInterventionError,
                      asyncpg.exceptions.PostgresConnectionError)


# The server refuses what the URL names (database, role, password) or what the role may do:
# a configuration to fix, which no retry heals.
_MISCONFIGURED = (asyncpg.exceptions.InvalidCatalogNameError,
                  asyncpg.exceptions.InvalidAuthorizationSpecificationError,
                  asyncpg.exceptions.InvalidPasswordError,
                  asyncpg.exceptions.InsufficientPrivilegeError)


def where(dsn: str) -> str:
    """The server and database of a URL, for messages: never its password."""
    try:
        url = urlsplit(dsn)
        host = f"{url.hostname or 'localhost'}:{url.port or 5432}"
    except ValueError:
        return "the configured server"
    user = f"{url.username}@" if url.username else ""
    return f"{user}{host}{url.path or '/'}"


def open_error(exc: BaseException, name: str, dsn: str) -> TidemeshError:
    """Why the ``name`` database could not be opened, as one line: a ConfigError for what
    the URL gets wrong, else Unavailable (refused, reset, the server starting up)."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, _MISCONFIGURED):
        return ConfigError(f"the {name} database postgresql://{where(dsn)} cannot be used: "
                           f"{said}; check the store URL (and that the database and role "
                           "exist: createdb, createuser)")
    return Unavailable(f"the {name} database postgresql://{where(dsn)} cannot be reached: "
                       f"{said}")


def storage_error(exc: BaseException, name: str, doing: str) -> TidemeshError:
    """Map a PostgreSQL failure to the error the caller sees: 507 when the server's disk is
    full (SQLSTATE 53100), else 503; ``name`` says which database, ``doing`` what failed."""
    if isinstance(exc, asyncpg.exceptions.DiskFullError):
        return InsufficientStorage(f"the {name} database is full: {exc}; nothing was stored")
    if isinstance(exc, TimeoutError):
        return Unavailable(f"the {name} database {doing}: no answer within the command "
                           "timeout (the server busy, locked or gone); nothing was stored")
    return Unavailable(f"the {name} database {doing}: {exc}")


@dataclass(slots=True, kw_only=True)
class _Pending(Pending):
    op: BatchOp[Any, Any]
    arg: Any
    shard: Hashable


class Database(BatchCounters):
    """One PostgreSQL database; construct with ``Database.open``."""

    # What the database raises while it is down or restarting.
    outage_errors: tuple[type[Exception], ...] = (Unavailable, *DB_ERRORS)

    def __init__(self, dsn: str, pool: Any, *, name: str, batch_max: int, writers: int,
                 generic_pool: Any = None, command_timeout_s: float | None = None,
                 server_settings: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.dsn = dsn
        self.command_timeout_s = command_timeout_s
        self.pool = pool
        self.generic_pool = generic_pool if generic_pool is not None else pool
        self.server_settings = dict(server_settings or {})
        self.name = name
        self.batch_max = batch_max
        self._queues: list[asyncio.Queue[_Pending | None]] = [
            asyncio.Queue() for _ in range(writers)]
        self._tasks: list[asyncio.Task[None]] = []
        # Known once: on Python 3.11 every get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._load = [0] * writers                  # submissions in flight, per writer
        self._homes: dict[Hashable, list[int]] = {}  # shard -> [writer, in flight]

    @classmethod
    async def open(cls, dsn: str, setup: Callable[[Any], Awaitable[None]], *,
                   name: str, pool_size: int = 4, batch_max: int = 512,
                   writers: int = 2, generic_pool_size: int = 0,
                   command_timeout_s: float | None = None,
                   server_settings: Mapping[str, str] | None = None) -> Database:
        """Create the pool, run ``setup`` (migrations, checks) on a connection of its own,
        then start the writers.

        ``command_timeout_s``: a statement of the pools or the writers left unanswered that
        long raises ``TimeoutError``, an outage (asyncpg cancels it on the server; a writer
        drops its connection), so a server that hangs cannot hold a caller for good.
        ``setup`` has no limit: a migration of a big table may take long.

        ``generic_pool_size``: a second pool, ``generic_pool``, whose prepared statements
        always run on their generic plan (planned once per connection), for statements
        shaped for it (each key looked up by its index whatever the count). For a handful of
        keys in ``unnest()`` arrays PostgreSQL keeps choosing a custom plan, planned again
        at every run: for a page of deliveries that was 0.4 ms of a 0.6 ms query, on the
        path of every message. Without it, ``generic_pool`` is ``pool``.

        ``server_settings``: for every connection of the pools and the writers (not those of
        ``unbounded``)."""
        settings = dict(server_settings or {})
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=pool_size,
                                             reset=_keep_session,
                                             command_timeout=command_timeout_s,
                                             server_settings=settings)
        except DB_ERRORS as exc:
            raise open_error(exc, name, dsn) from exc
        generic = None
        try:
            if generic_pool_size:
                generic = await asyncpg.create_pool(
                    dsn, min_size=1, max_size=generic_pool_size, reset=_keep_session,
                    command_timeout=command_timeout_s,
                    server_settings={**settings, "plan_cache_mode": "force_generic_plan"})
            conn = await asyncpg.connect(dsn)   # no command timeout: see above
            try:
                await setup(conn)
            except BaseException:
                conn.terminate()
                raise
            await conn.close()
        except DB_ERRORS as exc:
            await _close_pools(pool, generic)
            raise open_error(exc, name, dsn) from exc
        except BaseException:
            await _close_pools(pool, generic)
            raise
        db = cls(dsn, pool, name=name, batch_max=batch_max, writers=writers,
                 generic_pool=generic, command_timeout_s=command_timeout_s,
                 server_settings=settings)
        db._tasks = [asyncio.create_task(db._run(q), name=f"pg-writer-{name}-{i}")
                     for i, q in enumerate(db._queues)]
        return db

    @contextlib.asynccontextmanager
    async def unbounded(self) -> AsyncIterator[Any]:
        """A connection of its own without the command timeout, for work that may rightly
        run long and runs rarely (a retention sweep over a backlog): under the timeout it
        would fail the same way at every retry and never get done."""
        try:
            conn = await asyncpg.connect(self.dsn)
        except DB_ERRORS as exc:
            raise storage_error(exc, self.name, "could not be reached") from exc
        try:
            yield conn
        except BaseException:
            conn.terminate()
            raise
        await conn.close()

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        """The writers, for the composition root to supervise."""
        return self._tasks

    async def submit(self, op: BatchOp[A, T], arg: A) -> T:
        """Run ``op`` for ``arg`` in the next batch of the writer that holds its owner's
        writes (any writer for an op without owners)."""
        result: T = await self._put(op, arg)
        return result

    async def submit_all(self, op: BatchOp[A, T], args: Sequence[A]
                         ) -> list[T | BaseException]:
        """``submit`` for each of ``args``, queued at once and in order."""
        futures = [self._put(op, arg) for arg in args]
        got: list[T | BaseException] = await asyncio.gather(*futures, return_exceptions=True)
        return got

    def _put(self, op: BatchOp[Any, Any], arg: Any) -> asyncio.Future[Any]:
        shard: Hashable = op.owner(arg) if op.owner is not None else object()
        i = self._place(shard)
        future = self._loop.create_future()
        if self._tasks[i].done():
            self._release(shard)
            future.set_exception(Unavailable(f"the {self.name} database writer is not running"))
            return future
        self._queues[i].put_nowait(_Pending(future=future, op=op, arg=arg, shard=shard))
        return future

    def _place(self, shard: Hashable) -> int:
        home = self._homes.get(shard)
        if home is None:
            idle = min(range(len(self._load)), key=self._load.__getitem__)
            home = self._homes[shard] = [idle, 0]
        home[1] += 1
        self._load[home[0]] += 1
        return home[0]

    def _release(self, shard: Hashable) -> None:
        """The writer is done with one of ``shard``'s submissions (answered or failed): only
        then may the shard's next one go to another writer."""
        home = self._homes[shard]
        home[1] -= 1
        self._load[home[0]] -= 1
        if home[1] == 0:
            del self._homes[shard]

    async def close(self) -> None:
        """Finish everything queued, commit it, then close the pool."""
        for q in self._queues:
            q.put_nowait(None)
        await asyncio.gather(*(t for t in self._tasks if not t.done()))
        await _close_pools(self.pool, self.generic_pool)

    async def _run(self, queue: asyncio.Queue[_Pending | None]) -> None:
        carry: list[_Pending] = []
        batch: list[_Pending] = []
        conn: Any = None
        stopping = False
        try:
            while not (stopping and not carry):
                batch, stopping = await self._next_batch(queue, carry, stopping)
                batch, carry = _split_by_key(batch)
                if batch:
                    conn = await self._commit_batch(conn, batch)
                    batch = []   # answered and released: not the finally's to fail
            if conn is not None:
                await conn.close()
                conn = None
        finally:
            left = [*batch, *carry]
            while not queue.empty():
                p = queue.get_nowait()
                if p is not None:
                    left.append(p)
            fail_all(queue, left, Unavailable(f"the {self.name} database writer stopped"))
            for p in left:
                self._release(p.shard)
            if conn is not None:
                conn.terminate()

    async def _next_batch(self, queue: asyncio.Queue[_Pending | None], carry: list[_Pending],
                          stopping: bool) -> tuple[list[_Pending], bool]:
        batch = list(carry)
        if stopping:
            return batch, True
        if not batch:
            first = await queue.get()
            if first is None:
                return [], True
            batch.append(first)
            # Let the submissions that arrived with this one reach the queue: fuller batches.
            await asyncio.sleep(0)
        return batch, take(queue, batch, self.batch_max)

    async def _commit_batch(self, conn: Any, batch: list[_Pending]) -> Any:
        started = time.perf_counter()
        conn = await self._commit(conn, batch)
        self._record(len(batch), time.perf_counter() - started)
        answer(batch)
        for p in batch:
            self._release(p.shard)
        return conn

    async def _commit(self, conn: Any, batch: list[_Pending]) -> Any:
        try:
            if conn is None or conn.is_closed():
                conn = await asyncpg.connect(self.dsn, command_timeout=self.command_timeout_s,
                                             server_settings=self.server_settings)
            runs = _by_op(batch)
            if len(runs) == 1:
                await self._run_op(conn, *runs[0], whole=True)
                return conn
            async with conn.transaction():
                for op, items in runs:
                    await self._run_op(conn, op, items)
            return conn
        except DB_ERRORS as exc:
            if conn is not None:
                conn.terminate()
            fail_batch(self.name, batch, storage_error(exc, self.name, "could not commit"), exc)
            return None

    async def _run_op(self, conn: Any, op: BatchOp[Any, Any], items: list[_Pending], *,
                      whole: bool = False) -> None:
        """One ``op.run`` under a savepoint; if it fails, each arg alone (``engine``). A batch
        that is ``whole`` one run (the usual one: a writer's accepts) has its transaction for
        savepoint, which saves two round trips on the path of every send: if that run fails,
        the transaction is rolled back and the args run alone in the next one."""
        try:
            async with conn.transaction():
                results = await cast(Awaitable[list[Any]], op.run(conn, [p.arg for p in items]))
        except Exception as exc:
            if _of_connection(exc):
                raise
            if isinstance(exc, asyncpg.PostgresError) and fails_batch(
                    storage_error(exc, self.name, "could not commit")):
                raise
            log.warning(f"{self.name}_batch_split", error=str(exc), items=len(items))
            async with conn.transaction() if whole else contextlib.nullcontext():
                for p in items:
                    await self._run_alone(conn, p)
            return
        for p, r in zip(items, results, strict=True):
            p.result = r

    async def _run_alone(self, conn: Any, p: _Pending) -> None:
        try:
            async with conn.transaction():
                p.result = (await cast(Awaitable[list[Any]], p.op.run(conn, [p.arg])))[0]
        except _CONNECTION_ERRORS:
            raise
        except asyncpg.PostgresError as exc:
            p.error = err = storage_error(exc, self.name, "rejected this write")
            if fails_batch(err):
                raise
            one_arg_failed(self.name, p.op.name, err)
        except TidemeshError as exc:
            p.error = exc
        except Exception as exc:
            if _of_connection(exc):
                raise
            p.error = exc   # e.g. an integer past 64 bits: this arg's fault, not the writer's
            one_arg_failed(self.name, p.op.name, exc)


def _of_connection(exc: Exception) -> bool:
    """Whether ``exc`` is of the connection (the batch fails, the connection is replaced)
    rather than of one arg: the server's connection errors, and every error of the driver or
    the socket but asyncpg's client-side ``DataError`` (a value it cannot encode: an
    ``InterfaceError`` like the connection's own, but the arg's)."""
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    return (isinstance(exc, DB_ERRORS) and not isinstance(exc, asyncpg.PostgresError)
            and not isinstance(exc, _EncodeError))


def _split_by_key(batch: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
    """The batch without repeated keys, and the repeats (decided after the first commits)."""
    leaders: list[_Pending] = []
    later: list[_Pending] = []
    seen: set[tuple[str, Hashable]] = set()
    for p in batch:
        if p.op.key is None:
            leaders.append(p)
            continue
        key = (p.op.name, p.op.key(p.arg))
        (later if key in seen else leaders).append(p)
        seen.add(key)
    return leaders, later


def _by_op(batch: list[_Pending]) -> list[tuple[BatchOp[Any, Any], list[_Pending]]]:
    groups: dict[str, tuple[BatchOp[Any, Any], list[_Pending]]] = {}
    for p in batch:
        groups.setdefault(p.op.name, (p.op, []))[1].append(p)
    return list(groups.values())


async def _close_pools(*pools: Any) -> None:
    for pool in dict.fromkeys(p for p in pools if p is not None):
        await pool.close()


async def _keep_session(_conn: Any) -> None:
    """A released connection is not reset by a query. asyncpg's default runs
    ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` on every release, a round
    trip per query made through the pool (issue #30: a tenth of the broker's CPU in a connect
    storm). Pooled connections keep no session state here: LISTEN has a connection of its
    own, advisory locks are released by their holder, nothing is SET; a transaction left open
    is still rolled back by asyncpg before this is called."""
