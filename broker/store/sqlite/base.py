"""The broker's hold on the shared SQLite engine (``tidemesh.storage.sqlite``): every table
module of the SQLite store writes and reads through it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from tidemesh.core.errors import TidemeshError, Unavailable
from tidemesh.storage.engine import BatchOp
from tidemesh.storage.sqlite import Database

T = TypeVar("T")
A = TypeVar("A")


def write_error(exc: BaseException) -> TidemeshError:
    """What a caller hears of a failed write: the engine's own error as it is, anything else
    (the write's own failure) as this call's 503."""
    if isinstance(exc, TidemeshError):
        return exc
    return Unavailable(f"the broker database write failed: {exc}")


class SqliteBase:
    db: Database

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self.db.write(fn)
        except TidemeshError:
            raise
        except Exception as exc:  # a write's own failure is this call's 503
            raise write_error(exc) from exc

    async def _submit(self, op: BatchOp[A, T], arg: A) -> T:
        try:
            return await self.db.submit(op, arg)
        except TidemeshError:
            raise
        except Exception as exc:  # a write's own failure is this call's 503
            raise write_error(exc) from exc

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self.db.read(fn)
