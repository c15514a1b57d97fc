"""Both migration sets build the same tables and columns, and re-running applies nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from tests.broker.conftest import accept_input, new_pubkey, now_ms
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS, TABLES
from tidemesh.core.sqlscript import split_statements


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


# A store as the broker before the topic log left it: a topic message written as a delivery
# row per subscriber, bob's first acked, his second not yet delivered.
OLD_ROWS = """
INSERT INTO {s}mesh (id, name, created_at) VALUES ('m1', 'm', 1);
INSERT INTO {s}member (mesh_id, pubkey, joined_at) VALUES ('m1', '{a}', 1), ('m1', '{b}', 1);
INSERT INTO {s}topic (mesh_id, name, created_at) VALUES ('m1', 'ops', 1);
INSERT INTO {s}topic_subscription (mesh_id, topic, member_pubkey, subscribed_at)
    VALUES ('m1', 'ops', '{a}', 1), ('m1', 'ops', '{b}', 1);
INSERT INTO {s}topic_message (id, mesh_id, sender_pubkey, client_message_id, topic, body,
    body_encoding, priority, created_at) VALUES
    ('t1', 'm1', '{a}', 'c1', 'ops', {one}, 'utf8', 'next', 1),
    ('t2', 'm1', '{a}', 'c2', 'ops', {two}, 'utf8', 'next', 2);
INSERT INTO {s}message_history (history_id, broker_message_id, mesh_id, sender_pubkey,
    destination_kind, destination_ref, created_at) VALUES
    ('h1', 't1', 'm1', '{a}', 'topic', 'ops', 1), ('h2', 't2', 'm1', '{a}', 'topic', 'ops', 2);
INSERT INTO {s}recipient_cursor (mesh_id, recipient_pubkey, last_seq, acked_seq, updated_at)
    VALUES ('m1', '{b}', 2, 1, 2);
INSERT INTO {s}delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,
    created_at, acked_at) VALUES ('m1', '{b}', 1, 1, 't1', 1, 2),
    ('m1', '{b}', 1, 2, 't2', 2, NULL);
"""


async def _fill_old_schema(store_url: str, a: str, b: str) -> None:
    """Migrations up to the one before the topic log, then that version's rows."""
    if store_url.startswith("sqlite"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
                         " name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
            for mg in SQLITE_MIGRATIONS.load()[:7]:
                for stmt in split_statements(mg.sql):
                    conn.execute(stmt)
                conn.execute("INSERT INTO schema_migrations (version, name, applied_at)"
                             " VALUES (?, ?, 0)", (mg.version, mg.name))
            for stmt in split_statements(OLD_ROWS.format(s="", a=a, b=b, one="X'6f6e65'",
                                                          two="X'74776f'")):
                conn.execute(stmt)
        finally:
            conn.close()
        return
    conn = await asyncpg.connect(store_url)
    try:
        await conn.execute("CREATE SCHEMA mesh; CREATE TABLE mesh.schema_migrations (version"
                           " INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
        for mg in POSTGRES_MIGRATIONS.load()[:7]:
            await conn.execute(mg.sql.replace("CREATE SCHEMA IF NOT EXISTS mesh;", ""))
            await conn.execute("INSERT INTO mesh.schema_migrations VALUES ($1, $2, 0)",
                               mg.version, mg.name)
        await conn.execute(OLD_ROWS.format(s="mesh.", a=a, b=b, one="'one'::bytea",
                                           two="'two'::bytea"))
    finally:
        await conn.close()


async def test_a_store_from_before_the_topic_log_delivers_its_rows_once_then_the_log(
        store_url: str) -> None:
    a, b = new_pubkey(), new_pubkey()
    await _fill_old_schema(store_url, a, b)
    store = await open_store(store_url)   # migrates forward
    try:
        await store.hand_out("m1", b, now_ms())
        cur = await store.cursor("m1", b)
        assert (cur.last_seq, cur.acked_seq) == (2, 1)
        # Resumed after what it stored (seq 1): the undelivered row comes, once.
        rows = await store.deliveries_after("m1", b, 1, 1, 100)
        assert [(r.seq, r.body) for r in rows] == [(2, b"two")]
        await store.accept(accept_input("m1", a, "c3", body="three"))
        await store.hand_out("m1", b, now_ms())
        rows = await store.deliveries_after("m1", b, 1, 0, 100)
        assert [(r.seq, r.body) for r in rows] == [(1, b"one"), (2, b"two"), (3, b"three")]
        assert await store.ack("m1", b, 1, 3, now_ms()) == 2
    finally:
        await store.close()
