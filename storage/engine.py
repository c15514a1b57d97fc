"""What a write engine is, once for both (``sqlite`` and ``postgres``): the ``BatchOp`` a
caller hands it, the ``Engine`` protocol both implement, and the rules every batch follows.

A batch is what a writer drained from its queue. It runs in one transaction: each run of
one op's args is one ``op.run`` under a savepoint. When that run raises (a statement failed,
the op refused with a ``TidemeshError``, or an arg could not be bound: an integer past 64
bits is Python's ``OverflowError``), the engine rolls back to the savepoint and
runs each of those args alone, under a savepoint of its own: only an arg that fails again
gets an error (``one_arg_failed``), the others commit. An error that no arg alone can get
past (a full disk, the connection or server gone: ``fails_batch``) fails the whole batch
instead, every caller hearing the same error (``fail_batch``). Callers hear back only after
COMMIT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

from tidemesh.core.errors import InsufficientStorage, TidemeshError
from tidemesh.storage.pending import Pending

T = TypeVar("T")
A = TypeVar("A")
log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BatchOp(Generic[A, T]):
    """A write run for many callers at once. ``run(conn, args)`` returns one result per arg,
    in order, deciding each against what the ones before it wrote, all or nothing. On
    SQLite it is a plain function called on the writer's thread with its ``sqlite3``
    connection; on PostgreSQL a coroutine function given the writer's asyncpg connection.

    ``owner``: whose write an arg is; one owner's args are run in the order they were
    submitted (PostgreSQL keeps them on one writer; SQLite lets light ones go first only
    for owners with nothing heavier waiting). ``weight``: the rows an arg writes (SQLite's
    ``light_first``; needs ``owner``). ``key``: args of one key never share a run (an op
    whose statements see the whole batch at once, as PostgreSQL's set-based ones do, has the
    later ones wait for the next batch; SQLite's ops run their args in order and need none).
    """

    name: str
    run: Callable[[Any, Sequence[A]], list[T] | Awaitable[list[T]]]
    owner: Callable[[A], Hashable] | None = None
    weight: Callable[[A], int] | None = None
    key: Callable[[A], Hashable] | None = None


class Engine(Protocol):
    """A group-committing write engine: ``storage.sqlite.Database`` and
    ``storage.postgres.Database``."""

    name: str
    batches: int
    items: int
    on_batch: Callable[[int, float], None] | None

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        """The writers, for the composition root to supervise."""
        ...

    async def submit(self, op: BatchOp[A, T], arg: A) -> T:
        """Run ``op`` for ``arg`` in the next batch; its result after COMMIT, or the error
        it met (a ``TidemeshError``: 507 on a full disk, 503 otherwise)."""
        ...

    async def submit_all(self, op: BatchOp[A, T], args: Sequence[A]
                         ) -> list[T | BaseException]:
        """``submit`` for each of ``args``, queued at once and in order: each arg's result or
        error. They may commit in more than one transaction."""
        ...

    async def close(self) -> None:
        """Finish everything queued, commit it, then let go of the database."""
        ...


def fails_batch(err: TidemeshError) -> bool:
    """True for an error no arg alone can get past (a full disk; the engine raises it for
    a lost connection as well): the batch fails whole rather than arg by arg."""
    return isinstance(err, InsufficientStorage)


def fail_batch(name: str, items: Iterable[Pending], err: BaseException, exc: BaseException,
               **where: Any) -> None:
    """The one way a batch fails: every item gets ``err``, and the log says so once."""
    failed = list(items)
    log.error(f"{name}_commit_failed", error=str(exc), items=len(failed), **where)
    for p in failed:
        p.error = err


def one_arg_failed(name: str, op: str, err: BaseException) -> None:
    """A database error of one arg run alone, or an arg the driver could not bind (it alone
    gets ``err``; the writer goes on): logged."""
    message = err.message if isinstance(err, TidemeshError) else repr(err)
    log.error(f"{name}_write_failed", op=op, error=message)
