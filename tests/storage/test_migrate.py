"""The one migration runner, on every set it serves: a database the earlier runners made
(the daemon's and the broker's, each with its own ``schema_migrations`` table) opens and
migrates on, a newer one is refused, and one behind is refused where migrating is not
allowed. Real SQLite files, a real PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from tidemesh.broker.store.base import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
from tidemesh.core.sqlscript import split_statements
from tidemesh.daemon.store.db import INBOX_MIGRATIONS, OUTBOX_MIGRATIONS
from tidemesh.storage.migrate import Migrations, SchemaBehind, SchemaTooNew

# The recorded-migrations tables as the runners before this one created them.
_DAEMON_TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations ( version INTEGER PRIMARY KEY,"
                 " name TEXT NOT NULL, applied_at INTEGER NOT NULL)")
_BROKER_TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                 " name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
SQLITE_SETS = [(OUTBOX_MIGRATIONS, _DAEMON_TABLE), (INBOX_MIGRATIONS, _DAEMON_TABLE),
               (SQLITE_MIGRATIONS, _BROKER_TABLE)]


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def _old_runner(conn: sqlite3.Connection, table: str, migrations: Migrations, upto: int) -> None:
    """What the earlier runners left: their table, and migrations 1..``upto`` recorded."""
    conn.execute(table)
    for mg in migrations.load()[:upto]:
        for stmt in split_statements(mg.sql):
            conn.execute(stmt).fetchall()
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                     (mg.version, mg.name, 1_700_000_000_000))


def _table_sql(conn: sqlite3.Connection) -> str:
    return str(conn.execute("SELECT sql FROM sqlite_master WHERE name = 'schema_migrations'")
               .fetchone()[0])


@pytest.mark.parametrize(("migrations", "table"), SQLITE_SETS,
                         ids=["daemon-outbox", "daemon-inbox", "broker-sqlite"])
def test_a_database_the_old_runner_made_opens_and_migrates_on(
        tmp_path: Path, migrations: Migrations, table: str) -> None:
    known = migrations.load()
    conn = _connect(tmp_path / "old.db")
    try:
        _old_runner(conn, table, migrations, len(known) - 1)

        applied = migrations.apply_sqlite(conn)
        again = migrations.apply_sqlite(conn)
        migrations.require_current_sqlite(conn)
        rows = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version")

        assert applied == [len(known)]
        assert again == []
        assert [tuple(r) for r in rows] == [(m.version, m.name) for m in known]
        assert _table_sql(conn) == table.replace(" IF NOT EXISTS", "")   # left as it was
    finally:
        conn.close()


@pytest.mark.parametrize(("migrations", "table"), SQLITE_SETS,
                         ids=["daemon-outbox", "daemon-inbox", "broker-sqlite"])
def test_a_fresh_database_gets_every_migration_and_the_same_columns(
        tmp_path: Path, migrations: Migrations, table: str) -> None:
    conn = _connect(tmp_path / "new.db")
    try:
        assert migrations.apply_sqlite(conn) == [m.version for m in migrations.load()]
        columns = [r[1] for r in conn.execute("PRAGMA table_info(schema_migrations)")]
    finally:
        conn.close()
    assert columns == ["version", "name", "applied_at"]


def test_a_newer_database_is_refused_and_one_behind_too_where_it_must_not_migrate(
        tmp_path: Path) -> None:
    known = len(SQLITE_MIGRATIONS.load())
    conn = _connect(tmp_path / "b.db")
    try:
        _old_runner(conn, _BROKER_TABLE, SQLITE_MIGRATIONS, 2)
        with pytest.raises(SchemaBehind, match=f"version 2 of {known}; run `tidemesh broker"):
            SQLITE_MIGRATIONS.require_current_sqlite(conn)
        SQLITE_MIGRATIONS.apply_sqlite(conn)
        conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
        with pytest.raises(SchemaTooNew, match="the broker store is at schema version 999"):
            SQLITE_MIGRATIONS.apply_sqlite(conn)
        with pytest.raises(SchemaTooNew, match="upgrade tidemesh or restore a backup"):
            _newer_inbox(tmp_path / "inbox.db")
    finally:
        conn.close()


def _newer_inbox(path: Path) -> None:
    conn = _connect(path)
    try:
        INBOX_MIGRATIONS.apply_sqlite(conn)
        conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
        INBOX_MIGRATIONS.apply_sqlite(conn)
    finally:
        conn.close()


@pytest.mark.postgres
async def test_a_postgres_store_the_old_runner_made_opens_and_migrates_on(
        pg_database: str) -> None:
    known = POSTGRES_MIGRATIONS.load()
    conn = await asyncpg.connect(pg_database)
    try:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS mesh")
        await conn.execute("CREATE TABLE IF NOT EXISTS mesh.schema_migrations (version INTEGER"
                           " PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
        for mg in known[:-1]:
            await conn.execute(mg.sql)
            await conn.execute("INSERT INTO mesh.schema_migrations VALUES ($1, $2, 0)",
                               mg.version, mg.name)
        with pytest.raises(SchemaBehind):
            await POSTGRES_MIGRATIONS.require_current_postgres(conn)

        applied = await POSTGRES_MIGRATIONS.apply_postgres(conn)
        again = await POSTGRES_MIGRATIONS.apply_postgres(conn)
        await POSTGRES_MIGRATIONS.require_current_postgres(conn)
        rows = await conn.fetch("SELECT version, name FROM mesh.schema_migrations"
                                " ORDER BY version")
    finally:
        await conn.close()

    assert applied == [len(known)]
    assert again == []
    assert [tuple(r) for r in rows] == [(m.version, m.name) for m in known]
