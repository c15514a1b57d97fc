"""Embedded SQLite adapter (the default store): the broker's SQL on the shared SQLite engine
(``tidemesh.storage.sqlite``: one writer, group commit, a savepoint per item, one reader).

One module per group of tables: ``membership`` (meshes, invites, members, topics, queues),
``accept`` (the accept transaction, through ``broker/store/accept.py``), ``delivery`` (the
receive path), ``retention`` and ``files`` (shared files' chunks). Other processes (the CLI)
may write too: the engine's ``busy_timeout`` covers them.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tidemesh.broker.store.base import SQLITE_MIGRATIONS, TABLES, OnEngine
from tidemesh.broker.store.sqlite.accept import Accept
from tidemesh.broker.store.sqlite.delivery import Delivery
from tidemesh.broker.store.sqlite.files import Files
from tidemesh.broker.store.sqlite.membership import Membership
from tidemesh.broker.store.sqlite.retention import Retention
from tidemesh.core.errors import Unavailable
from tidemesh.storage.sqlite import Database


def _private_folder(folder: Path) -> None:
    """Create the store's folder 0700. A folder that already exists is the operator's choice
    (``sqlite:///srv/shared/broker.db``) and keeps its mode."""
    if folder.exists():
        return
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)  # mkdir's mode is narrowed by the umask, never widened


class SqliteStore(OnEngine[Database], Membership, Accept, Delivery, Retention,
                  Files):
    """The ``Store`` on one SQLite file; construct with ``SqliteStore.open``."""

    outage_errors: tuple[type[Exception], ...] = (Unavailable,)

    def __init__(self, db: Database) -> None:
        self.db = db
        self.path = db.path
        self._init_accept()
        self._init_delivery()

    @classmethod
    async def open(cls, path: Path, *, batch_max: int = 512,
                   migrate_now: bool = True) -> SqliteStore:
        _private_folder(path.parent)

        def setup(conn: sqlite3.Connection) -> None:
            if migrate_now:
                SQLITE_MIGRATIONS.apply_sqlite(conn)
            else:
                SQLITE_MIGRATIONS.require_current_sqlite(conn)

        return cls(await Database.open(path, setup, batch_max, name="broker"))

    async def set_info(self, key: str, value: str, now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO broker_info (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key)"
            " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (key, value, now_ms)))

    async def get_info(self, key: str) -> str | None:
        def fn(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT value FROM broker_info WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(fn)

    async def counts(self) -> dict[str, int]:
        def fn(conn: sqlite3.Connection) -> dict[str, int]:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608
                    for t in TABLES}

        return await self._read(fn)
