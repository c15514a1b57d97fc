"""Forward-only numbered migrations for the broker store, each recorded in its own transaction.

Files: ``migrations/broker/{sqlite,postgres}/NNNN_name.sql``, numbered 1..n in both folders.
A database newer than the code is refused rather than guessed at.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from tidemesh.core.sqlscript import split_statements

_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
# Any constant works; it only keeps two brokers from migrating one database at once.
_PG_LOCK = 0x7469_6465


class SchemaTooNew(RuntimeError):
    """The store was migrated by a newer tidemesh."""


class SchemaBehind(RuntimeError):
    """The store needs ``tidemesh broker migrate`` first."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load(flavour: str) -> list[Migration]:
    folder = resources.files("tidemesh.migrations") / "broker" / flavour
    found = []
    for entry in folder.iterdir():
        m = _NAME.fullmatch(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mg: mg.version)
    if [mg.version for mg in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"broker {flavour} migrations are not numbered 1..n")
    return found


def _check(current: int, known: int) -> None:
    if current > known:
        raise SchemaTooNew(f"the broker store is at schema version {current}, newer than this "
                           f"tidemesh knows ({known}); upgrade tidemesh")


def _sqlite_version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                 " name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
    return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
               .fetchone()[0])


def apply_sqlite(conn: sqlite3.Connection) -> list[int]:
    migrations = load("sqlite")
    done = []
    conn.execute("BEGIN IMMEDIATE")  # the version read and the apply must not interleave
    try:
        current = _sqlite_version(conn)
        _check(current, len(migrations))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    for mg in migrations[current:]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _sqlite_version(conn) >= mg.version:  # another process got there first
                conn.execute("COMMIT")
                continue
            for stmt in split_statements(mg.sql):
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_migrations (version, name, applied_at)"
                         " VALUES (?, ?, ?)", (mg.version, mg.name, int(time.time() * 1000)))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        done.append(mg.version)
    return done


def require_current_sqlite(conn: sqlite3.Connection) -> None:
    known = len(load("sqlite"))
    current = _sqlite_version(conn)
    _check(current, known)
    if current < known:
        raise SchemaBehind(f"the broker store is at schema version {current} of {known}; "
                           "run `tidemesh broker migrate`")


async def _pg_version(conn: Any) -> int:
    await conn.execute("CREATE SCHEMA IF NOT EXISTS mesh")
    await conn.execute("CREATE TABLE IF NOT EXISTS mesh.schema_migrations (version INTEGER"
                       " PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
    return int(await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM mesh.schema_migrations"))


async def apply_postgres(conn: Any) -> list[int]:
    """Apply pending migrations on an asyncpg connection; one transaction per migration."""
    migrations = load("postgres")
    done = []
    for mg in migrations:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _PG_LOCK)
            current = await _pg_version(conn)
            _check(current, len(migrations))
            if current >= mg.version:
                continue
            await conn.execute(mg.sql)
            await conn.execute("INSERT INTO mesh.schema_migrations (version, name, applied_at)"
                               " VALUES ($1, $2, $3)", mg.version, mg.name,
                               int(time.time() * 1000))
        done.append(mg.version)
    return done


async def require_current_postgres(conn: Any) -> None:
    known = len(load("postgres"))
    current = await _pg_version(conn)
    _check(current, known)
    if current < known:
        raise SchemaBehind(f"the broker store is at schema version {current} of {known}; "
                           "run `tidemesh broker migrate`")
