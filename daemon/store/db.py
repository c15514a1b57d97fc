"""The daemon's two databases run on the shared SQLite engine (``tidemesh.storage.sqlite``);
this module names it for the daemon's stores, declares their migration sets (run by
``tidemesh.storage.migrate``) and adds the start-up integrity check."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tidemesh.storage.engine import BatchOp
from tidemesh.storage.migrate import Migrations, SchemaTooNew
from tidemesh.storage.sqlite import Database, connect, storage_error

__all__ = ["INBOX_MIGRATIONS", "OUTBOX_MIGRATIONS", "BatchOp", "Connection", "Database",
           "SchemaTooNew", "StoreDamaged", "check_integrity", "connect", "storage_error"]

# What the stores' functions take. A service that reads or writes several of them in one
# transaction passes it through; it never executes SQL on it.
Connection = sqlite3.Connection

OUTBOX_MIGRATIONS = Migrations("daemon/outbox", "the outbox database",
                               too_new="upgrade tidemesh or restore a backup")
INBOX_MIGRATIONS = Migrations("daemon/inbox", "the inbox database",
                              too_new="upgrade tidemesh or restore a backup")


class StoreDamaged(RuntimeError):
    """``PRAGMA integrity_check`` failed, or the file is not a database at all."""


def check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    try:
        rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        raise StoreDamaged(f"{path} is not a readable SQLite database: {exc}") from exc
    if rows != ["ok"]:
        raise StoreDamaged(f"{path} failed its integrity check: {'; '.join(rows[:5])}")
