"""The columns the audit reads exist in the broker's migrations, with the types it expects.

Checked against both flavours as the broker's own migrations create them, so a renamed or
retyped column fails here, by name, before any nightly run meets it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tidemesh.broker.store.base import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS

pytestmark = pytest.mark.spark

# Spark type of a read column -> what the broker may declare for it.
PG_TYPES = {"string": {"text"}, "bigint": {"bigint"}, "boolean": {"boolean"}}
SQLITE_TYPES = {"string": {"TEXT"}, "bigint": {"BIGINT", "INTEGER"}, "boolean": {"INTEGER"}}


def _audited() -> list[tuple[str, str, str]]:
    if importlib.util.find_spec("pyspark") is None:
        unavailable("pyspark is not installed (pip install -e '.[spark]')")
    from tidemesh.spark.schemas import AUDITED_TABLES, MEMBER, MESH

    return [(t.name, f.name, f.dataType.simpleString())
            for t in (*AUDITED_TABLES, MESH, MEMBER) for f in t.schema]


def test_audited_columns_exist_in_sqlite_migrations(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "broker.db")
    try:
        SQLITE_MIGRATIONS.apply_sqlite(conn)
        declared = {(table, row[1]): row[2].upper()
                    for table in {t for t, _, _ in _audited()}
                    for row in conn.execute(f"PRAGMA table_info({table})")}
    finally:
        conn.close()
    for table, column, kind in _audited():
        assert declared.get((table, column)) in SQLITE_TYPES[kind], (table, column)


@pytest.mark.postgres
def test_audited_columns_exist_in_postgres_migrations(pg_database: str) -> None:
    import asyncpg

    async def columns() -> dict[tuple[str, str], str]:
        conn = await asyncpg.connect(pg_database)
        try:
            await POSTGRES_MIGRATIONS.apply_postgres(conn)
            rows = await conn.fetch("SELECT table_name, column_name, data_type FROM"
                                    " information_schema.columns WHERE table_schema = 'mesh'")
            return {(r["table_name"], r["column_name"]): r["data_type"] for r in rows}
        finally:
            await conn.close()

    declared = asyncio.run(columns())
    for table, column, kind in _audited():
        assert declared.get((table, column)) in PG_TYPES[kind], (table, column)
