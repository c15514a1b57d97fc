"""The statements on a message's path keep their index lookups whatever PostgreSQL knew of
the tables when it planned them.

A prepared statement's generic plan is made once, from the statistics of that moment, and
kept until something invalidates it (an ANALYZE). The broker's statements always take it
(``plan_cache_mode = force_generic_plan``, ``KEYED_SETTINGS``). A broker started on
a new database plans them on empty tables: a plan that scans a table then scans it whole at
every run as it grows. The hand-out's write had done that to ``topic_message``: under
``bench/e2e.py`` it took 5 ms at first and 50 ms thirty seconds later, until autovacuum's
first ANALYZE. Each statement here is planned on empty tables, as a new broker does, and on
a thousand members' rows, and its plan must reach the tables that grow with traffic through
their indexes only, a member's rows by the member.
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


# Statements given members (their keys): each member's rows are read by the member, never
# by its topic (a member's subscriptions read through the topic's had joined each of 1,000
# members to the topic's 1,000 subscriptions: 160 ms a run).
BY_MEMBER = {"hand-out: lags", "hand-out: cursors", "hand-out: logged", "ack",
             "cluster: unacked"}
MEMBER_COLUMN = {"topic_subscription": "member_pubkey", "recipient_cursor": "recipient_pubkey"}


def _not_by_member(node: dict[str, Any]) -> list[str]:
    found = []
    for table, column in MEMBER_COLUMN.items():
        if node.get("Index Name", "").startswith(table + "_") \
                and column not in node.get("Index Cond", ""):
            found.append(f"{node['Node Type']} using {node['Index Name']} not by member")
    for child in node.get("Plans", []):
        found += _not_by_member(child)
    return found


def _on_growing(index: str) -> bool:
    return any(index.startswith(t + "_") for t in GROWING)


# A mesh of a thousand members all subscribed to one topic, made before the plans (and never
# ANALYZEd, as with autovacuum off): what PostgreSQL then guesses from the tables' sizes.
THOUSAND = [
    "INSERT INTO mesh.mesh (id, name, created_at) VALUES ('M', 'm', 0)",
    "INSERT INTO mesh.topic (mesh_id, name, created_at, last_pos) VALUES ('M', 't', 0, 5)",
    "INSERT INTO mesh.member (mesh_id, pubkey, joined_at)"
    " SELECT 'M', lpad(to_hex(g), 64, '0'), 0 FROM generate_series(1, 1000) g",
    "INSERT INTO mesh.recipient_cursor (mesh_id, recipient_pubkey, updated_at, last_seq,"
    " acked_seq) SELECT 'M', lpad(to_hex(g), 64, '0'), 0, 5, 5 FROM generate_series(1, 1000) g",
    "INSERT INTO mesh.topic_subscription (mesh_id, topic, member_pubkey, subscribed_at,"
    " log_pos) SELECT 'M', 't', lpad(to_hex(g), 64, '0'), 0, 5 FROM generate_series(1, 1000) g",
]


@pytest.mark.parametrize("tables", ["empty", "a thousand members"])
async def test_a_brokers_statements_read_by_key_whatever_the_tables_held(
        pg_database: str, tables: str) -> None:
    store = await open_store(pg_database)   # the schema, as a new broker makes it
    await store.close()
    # As the broker's pools and writers connect: each statement on its generic plan.
    conn = await asyncpg.connect(pg_database, server_settings=KEYED_SETTINGS)
    try:
        for sql in THOUSAND if tables != "empty" else []:
            await conn.execute(sql)
        plans = {what: await _generic_plan(conn, f"s{i}", sql)
                 for i, (what, sql) in enumerate(STATEMENTS.items())}
    finally:
        await conn.close()
    whole = {what: found for what, plan in plans.items() if (found := _whole_reads(plan))}
    assert whole == {}
    by_topic = {what: found for what in BY_MEMBER if (found := _not_by_member(plans[what]))}
    assert by_topic == {}
