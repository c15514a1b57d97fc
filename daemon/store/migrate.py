"""Forward-only numbered migrations, each applied and recorded in one transaction."""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from tidemesh.core.sqlscript import split_statements

_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
# A migration whose first line is this runs outside a transaction (VACUUM cannot run in one);
# it must be safe to run again, since it is recorded only after it finished.
OUTSIDE_TRANSACTION = "-- migrate: outside-transaction"


class SchemaTooNew(RuntimeError):
    """The database was written by a newer tidemesh; refuse rather than guess."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load(target: str) -> list[Migration]:
    """Migrations under ``migrations/daemon/<target>/`` in version order."""
    folder: Traversable = resources.files("tidemesh.migrations") / "daemon" / target
    found = []
    for entry in folder.iterdir():
        m = _NAME.fullmatch(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mg: mg.version)
    versions = [mg.version for mg in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations for {target} are not numbered 1..n: {versions}")
    return found


def applied_version(conn: sqlite3.Connection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
    )
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(row[0])


def apply(conn: sqlite3.Connection, target: str) -> list[int]:
    """Apply pending migrations of ``target``; returns the versions applied now."""
    migrations = load(target)
    current = applied_version(conn)
    if current > len(migrations):
        raise SchemaTooNew(
            f"{target} database is at schema version {current}, newer than this tidemesh "
            f"knows ({len(migrations)}); upgrade tidemesh or restore a backup"
        )
    done = []
    for mg in migrations[current:]:
        outside = mg.sql.startswith(OUTSIDE_TRANSACTION)
        if outside:
            for stmt in split_statements(mg.sql):
                conn.execute(stmt).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not outside:
                for stmt in split_statements(mg.sql):
                    conn.execute(stmt)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (mg.version, mg.name, int(time.time() * 1000)),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        done.append(mg.version)
    return done
