"""Both migration sets build the same tables and columns, and re-running applies nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from tidemesh.broker.store.base import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS, TABLES


def _sqlite_columns(path: Path) -> dict[str, set[str]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert SQLITE_MIGRATIONS.apply_sqlite(conn) == [m.version for m in SQLITE_MIGRATIONS.load()]
        assert SQLITE_MIGRATIONS.apply_sqlite(conn) == []
        out: dict[str, set[str]] = {}
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            out[name] = {r[1] for r in conn.execute(f"PRAGMA table_info({name})")}
        return out
    finally:
        conn.close()


def test_migration_sets_are_numbered_alike() -> None:
    assert [(m.version, m.name) for m in SQLITE_MIGRATIONS.load()] == [
        (m.version, m.name) for m in POSTGRES_MIGRATIONS.load()]


def test_sqlite_has_every_agreed_table(tmp_path: Path) -> None:
    cols = _sqlite_columns(tmp_path / "b.db")
    assert set(TABLES) <= set(cols)
    assert {"mesh_id", "sender_pubkey", "client_message_id", "broker_message_id",
            "request_fingerprint", "destination_kind", "destination_ref", "first_seen_at",
            "expires_at", "history_available"} <= cols["client_message_dedupe"]


@pytest.mark.postgres
async def test_postgres_tables_and_columns_match_sqlite(pg_database: str, tmp_path: Path) -> None:
    conn = await asyncpg.connect(pg_database)
    try:
        assert await POSTGRES_MIGRATIONS.apply_postgres(conn) == [
            m.version for m in POSTGRES_MIGRATIONS.load()]
        assert await POSTGRES_MIGRATIONS.apply_postgres(conn) == []
        rows = await conn.fetch("SELECT table_name, column_name FROM information_schema.columns"
                                " WHERE table_schema = 'mesh'")
    finally:
        await conn.close()
    pg: dict[str, set[str]] = {}
    for r in rows:
        pg.setdefault(r[0], set()).add(r[1])
    assert pg == _sqlite_columns(tmp_path / "b.db")
