"""JDBC reads keep the broker's types: epoch milliseconds stay 64-bit, NULLs stay NULL.

SQLite's default JDBC mapping reads INTEGER as a 32-bit int and silently truncates epoch
milliseconds; only ``customSchema`` prevents it, so dropping it fails this test at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.spark.broker_stores import NOW, execute, fill

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

PLAN = {"one": ("alpha", "topic", 60_000), "two": ("alpha", "dm", 120_000)}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'broker.db'}"
    return str(request.getfixturevalue("pg_database"))


def test_read_table_bigint_ms_and_nulls_survive(spark: SparkSession, store_url: str) -> None:
    from tidemesh.spark.readers import read_table, table_stats
    from tidemesh.spark.schemas import DEDUPE
    from tidemesh.spark.store import parse_store

    fill(store_url, PLAN)
    execute(store_url, [("UPDATE client_message_dedupe SET expires_at = NULL"
                         " WHERE client_message_id = ?", ("cm-two",))])
    target = parse_store(store_url)
    stats = table_stats(spark, target, [DEDUPE], 100)[DEDUPE.name]
    assert stats.rows == 2
    df = read_table(spark, target, DEDUPE, partitions=3, fetch_size=100, stats=stats)
    assert df.rdd.getNumPartitions() > 1          # partitioned, not one query
    types = dict(df.dtypes)
    assert types["first_seen_at"] == "bigint"
    assert types["history_available"] == "boolean"
    rows = {r["client_message_id"]: r for r in df.collect()}
    assert rows["cm-one"]["first_seen_at"] == NOW - 60_000 > 2**31
    assert rows["cm-two"]["expires_at"] is None
    assert rows["cm-one"]["history_available"] is True


def test_parse_store_keeps_password_out_of_url_and_display() -> None:
    from tidemesh.spark.store import Dialect, parse_store

    t = parse_store("postgresql://audit:s3cret@db.example:6543/broker?sslmode=require")
    assert t.dialect is Dialect.POSTGRES
    assert t.url == "jdbc:postgresql://db.example:6543/broker"
    assert "s3cret" not in t.url + t.display
    assert t.options == {"user": "audit", "password": "s3cret", "sslmode": "require"}
    assert t.table("delivery_queue") == "mesh.delivery_queue"
    s = parse_store("sqlite:////var/lib/x/broker.db")
    assert s.url == "jdbc:sqlite:/var/lib/x/broker.db"
    assert s.options["open_mode"] == "1"
