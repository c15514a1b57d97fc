"""The statements on a message's path keep their index lookups whatever PostgreSQL knew of
the tables when it planned them.

A prepared statement's generic plan is made once, from the statistics of that moment, and
kept until something invalidates it (an ANALYZE). The broker's statements always take it
(``plan_cache_mode = force_generic_plan``, ``KEYED_SETTINGS``). A broker started on
a new database plans them on empty tables: a plan that scans a table then scans it whole at
every run as it grows. The hand-out's write had done that to ``topic_message``: under
``bench/e2e.py`` it took 5 ms at first and 50 ms thirty seconds later, until autovacuum's
first ANALYZE. Each statement here is planned on empty tables, as a new broker does, and its
plan must reach the tables that grow with traffic through their indexes only.
"""

from __future__ import annotations

import json
from typing import Any, cast

import asyncpg
import pytest

from tidemesh.broker.store import open_store
from tidemesh.broker.store.postgres import (
    KEYED_SETTINGS,
    accept,
    cluster,
    delivery,
    membership,
    topiclog,
)

pytestmark = pytest.mark.postgres

# The tables whose rows grow with messages, deliveries and members.
GROWING = ("topic_message", "message_queue", "message_history", "client_message_dedupe",
           "delivery_queue", "topic_delivery", "recipient_cursor", "topic_subscription",
           "member")

STATEMENTS = {
    "accept: claim": accept.CLAIM_SQL,
    "accept: known keys": accept.KNOWN_SQL,
    "accept: destinations": accept.B2_SQL,
    "accept: topic positions": accept.TOPIC_POS_SQL,
    "accept: messages": accept.MESSAGES_SQL,
    "accept: deliveries": accept.DELIVERIES_INSERT_SQL,
    "accept: subscribers": accept.SUBSCRIBERS_SQL,
    "hand-out: lags": topiclog.LAGS_SQL,
    "hand-out: cursors": topiclog.LOCKED_CURSORS_SQL,
    "hand-out: logged": topiclog.LOGGED_SQL,
    "hand-out: write": topiclog.WRITE_SQL,
    "page: deliveries": delivery.DELIVERIES_SQL,
    "page: windows": delivery.WINDOWS_SQL,
    "page: entries": delivery.ENTRIES_SQL,
    "page: messages": delivery.MESSAGES_SQL,
    "ack": delivery.ACK_SQL,
    "hello: mesh and member": membership.MESH_MEMBER_SQL,
    "hello: session claim": cluster.CLAIM_SESSION_SQL,
    "cluster: unacked": cluster.UNACKED_SQL,
}


def _value(type_name: str) -> str:
    """An argument of the type for EXPLAIN (it runs nothing; any value of the type will do)."""
    return {"bigint": "0", "integer": "0", "bytea[]": "'{}'::bytea[]"}.get(type_name, "'{}'")


async def _generic_plan(conn: asyncpg.Connection, name: str, sql: str) -> dict[str, Any]:
    await conn.execute(f"PREPARE {name} AS {sql}")
    types = await conn.fetchval(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = $1", name)
    plan = await conn.fetchval(
        f"EXPLAIN (FORMAT JSON) EXECUTE {name}({', '.join(_value(t) for t in types)})")
    return cast(dict[str, Any], json.loads(plan)[0]["Plan"])


def _whole_reads(node: dict[str, Any]) -> list[str]:
    """The plan's reads of a growing table that are not a lookup by key: a sequential scan,
    or an index scan (plain or bitmap) with no index condition (the whole index, or the
    whole of a partial one)."""
    found = []
    kind = node["Node Type"]
    if kind == "Seq Scan" and node["Relation Name"] in GROWING:
        found.append(f"{kind} on {node['Relation Name']}")
    if kind in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") \
            and "Index Cond" not in node and _on_growing(node["Index Name"]):
        found.append(f"{kind} using {node['Index Name']} without a key")
    for child in node.get("Plans", []):
        found += _whole_reads(child)
    return found


def _on_growing(index: str) -> bool:
    return any(index.startswith(t + "_") for t in GROWING)


async def test_a_new_brokers_statements_reach_growing_tables_by_index(pg_database: str
                                                                       ) -> None:
    store = await open_store(pg_database)   # the schema, as a new broker makes it
    await store.close()
    # As the broker's pools and writers connect: each statement on its generic plan.
    conn = await asyncpg.connect(pg_database, server_settings=KEYED_SETTINGS)
    try:
        plans = {what: await _generic_plan(conn, f"s{i}", sql)
                 for i, (what, sql) in enumerate(STATEMENTS.items())}
    finally:
        await conn.close()
    whole = {what: _whole_reads(plan) for what, plan in plans.items() if _whole_reads(plan)}
    assert whole == {}
