"""Forward-only numbered migrations: the one runner of every database tidemesh keeps (the
daemon's outbox and inbox, the broker's store on SQLite or PostgreSQL).

A set (``Migrations``) is a folder of ``NNNN_name.sql`` files under ``tidemesh.migrations``,
numbered 1..n. Each migration is applied and recorded in ``schema_migrations`` (version,
name, applied_at in ms) in one transaction, after reading the version again inside it: two
processes opening one database at once apply each migration once (SQLite: ``BEGIN
IMMEDIATE``; PostgreSQL: an advisory lock). A database recorded at a version newer than the
set is refused (``SchemaTooNew``) rather than guessed at; ``require_current_*`` also refuses
one behind (``SchemaBehind``) for a process that must not migrate.
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
# A SQLite migration whose first line is this runs outside a transaction (VACUUM cannot run
# in one); it must be safe to run again, since it is recorded only after it finished.
OUTSIDE_TRANSACTION = "-- migrate: outside-transaction"
# Any constant works; it only keeps two processes from migrating one PostgreSQL database at
# once (the value the broker has always used).
_PG_LOCK = 0x7469_6465
_TABLE = ("CREATE TABLE IF NOT EXISTS {}schema_migrations (version INTEGER PRIMARY KEY,"
          " name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
_VERSION = "SELECT COALESCE(MAX(version), 0) FROM {}schema_migrations"
_RECORD = "INSERT INTO {}schema_migrations (version, name, applied_at) VALUES ({})"


class SchemaTooNew(RuntimeError):
    """The database was written by a newer tidemesh; refuse rather than guess."""


class SchemaBehind(RuntimeError):
    """The database needs migrating first, by the process whose job that is."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class Migrations:
    """One database's set: ``folder`` under ``tidemesh.migrations``; ``what`` names the
    database in messages, ``too_new`` and ``behind`` say what to do about each refusal;
    ``pg_schema`` is the PostgreSQL schema of the recorded table (None on SQLite)."""

    folder: str
    what: str
    too_new: str = "upgrade tidemesh"
    behind: str = "open it with a process that migrates it"
    pg_schema: str | None = None

    def load(self) -> list[Migration]:
        """The set, in version order."""
        folder = resources.files("tidemesh.migrations").joinpath(*self.folder.split("/"))
        found = []
        for entry in folder.iterdir():
            m = _NAME.fullmatch(entry.name)
            if m:
                found.append(Migration(int(m.group(1)), m.group(2),
                                       entry.read_text(encoding="utf-8")))
        found.sort(key=lambda mg: mg.version)
        versions = [mg.version for mg in found]
        if versions != list(range(1, len(found) + 1)):
            raise RuntimeError(f"the {self.folder} migrations are not numbered 1..n: {versions}")
        return found

    def _check(self, current: int, known: int) -> None:
        if current > known:
            raise SchemaTooNew(f"{self.what} is at schema version {current}, newer than this "
                               f"tidemesh knows ({known}); {self.too_new}")

    def _require(self, current: int, known: int) -> None:
        self._check(current, known)
        if current < known:
            raise SchemaBehind(f"{self.what} is at schema version {current} of {known}; "
                               f"{self.behind}")

    # -------------------------------------------------------------- SQLite
    def sqlite_version(self, conn: sqlite3.Connection) -> int:
        """The version recorded (0 for a new database, whose table this creates)."""
        conn.execute(_TABLE.format(""))
        return int(conn.execute(_VERSION.format("")).fetchone()[0])

    def apply_sqlite(self, conn: sqlite3.Connection) -> list[int]:
        """Apply what is pending on an autocommit connection; the versions applied now."""
        migrations = self.load()
        conn.execute("BEGIN IMMEDIATE")  # the version read and the check must not interleave
        try:
            current = self.sqlite_version(conn)
            self._check(current, len(migrations))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        done = []
        for mg in migrations[current:]:
            outside = mg.sql.startswith(OUTSIDE_TRANSACTION)
            if outside:
                for stmt in split_statements(mg.sql):
                    conn.execute(stmt).fetchall()
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self.sqlite_version(conn) >= mg.version:  # another process got there first
                    conn.execute("COMMIT")
                    continue
                if not outside:
                    for stmt in split_statements(mg.sql):
                        conn.execute(stmt)
                conn.execute(_RECORD.format("", "?, ?, ?"),
                             (mg.version, mg.name, int(time.time() * 1000)))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            done.append(mg.version)
        return done

    def require_current_sqlite(self, conn: sqlite3.Connection) -> None:
        self._require(self.sqlite_version(conn), len(self.load()))

    # -------------------------------------------------------------- PostgreSQL
    def _prefix(self) -> str:
        return f"{self.pg_schema}." if self.pg_schema else ""

    async def postgres_version(self, conn: Any) -> int:
        """The version recorded on an asyncpg connection (0 for a new database)."""
        if self.pg_schema:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.pg_schema}")
        await conn.execute(_TABLE.format(self._prefix()))
        return int(await conn.fetchval(_VERSION.format(self._prefix())))

    async def apply_postgres(self, conn: Any) -> list[int]:
        """Apply what is pending on an asyncpg connection; the versions applied now."""
        migrations = self.load()
        done = []
        for mg in migrations:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _PG_LOCK)
                current = await self.postgres_version(conn)
                self._check(current, len(migrations))
                if current >= mg.version:
                    continue
                await conn.execute(mg.sql)
                await conn.execute(_RECORD.format(self._prefix(), "$1, $2, $3"),
                                   mg.version, mg.name, int(time.time() * 1000))
            done.append(mg.version)
        return done

    async def require_current_postgres(self, conn: Any) -> None:
        self._require(await self.postgres_version(conn), len(self.load()))
