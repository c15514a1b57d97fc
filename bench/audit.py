"""Benchmark of the nightly orphan audit on PostgreSQL, by hand (not part of the test suite).

    .venv/bin/python bench/audit.py                  # 1M, then 10M dedupe rows
    .venv/bin/python bench/audit.py --sizes 1000000  # one size

For each size it creates its own database (dropped afterwards), fills the broker's schema
with ``generate_series`` (dedupe rows with their messages, history and one delivery row
each, plus a known sprinkling of every kind of orphan and of legitimate retention states),
runs the audit on ``local[2]`` and prints wall time and dedupe rows/s. It then checks that
the Parquet output holds exactly the planted orphans, computed here in Python.
Needs PostgreSQL (``TIDEMESH_BENCH_PG_DSN``, default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import asyncpg

from tidemesh.broker.store.base import POSTGRES_MIGRATIONS
from tidemesh.spark.config import load
from tidemesh.spark.jobs.orphan_audit import run_audit
from tidemesh.spark.session import build_session

DSN = os.environ.get("TIDEMESH_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DAY = 86_400_000
MESHES = 4
# i % 1000 == r plants one state in every thousand sends.
PLANTS = {
    7: "dedupe_without_message",     # message, history and delivery gone
    17: "message_without_dedupe",    # dedupe row gone, message young
    27: "message_without_history",
    37: "history_without_message",   # only the history row left
    47: "delivery_without_message",  # delivery row names a message that never was
}
PRUNED, EXPIRED = 57, 67             # legitimate: pruned by retention / dedupe row expired

# Row i: mesh i % 4, one sender per 1000 ids, topic message unless i % 10 = 3 (a DM).
FILL_SQL = """
CREATE TEMP TABLE plan AS
SELECT i,
       'MESH' || (i % {meshes}) AS mesh_id,
       lpad(to_hex(i % 1000), 64, '0') AS sender,
       'c' || i AS cmid,
       'B' || lpad(i::text, 25, '0') AS bid,
       'H' || lpad(i::text, 25, '0') AS hid,
       i % 1000 AS r,
       i % 10 = 3 AS dm,
       CASE WHEN i % 1000 = {expired} THEN {now} - 40 * {day}
            ELSE {now} - 5 * {day} + (i * (4 * {day} / {n})) END AS at
FROM generate_series(1::bigint, {n}) AS i;

INSERT INTO mesh.mesh (id, name, created_at)
SELECT 'MESH' || m, 'mesh' || m, {now} - 100 * {day} FROM generate_series(0, {meshes} - 1) m;

INSERT INTO mesh.client_message_dedupe (mesh_id, sender_pubkey, client_message_id,
    broker_message_id, history_id, request_fingerprint, destination_kind, destination_ref,
    first_seen_at, expires_at, history_available)
SELECT mesh_id, sender, cmid, bid, hid, decode(repeat('00', 32), 'hex'),
       CASE WHEN dm THEN 'dm' ELSE 'topic' END, 'general', at, at + 14 * {day}, r <> {pruned}
FROM plan WHERE r NOT IN (17, 37, {expired});

INSERT INTO mesh.topic_message (id, mesh_id, sender_pubkey, client_message_id, topic, body,
    body_encoding, priority, created_at)
SELECT bid, mesh_id, sender, cmid, 'general', '\\x00'::bytea, 'utf8', 'next', at
FROM plan WHERE NOT dm AND r NOT IN (7, 37, {pruned});

INSERT INTO mesh.message_queue (id, mesh_id, sender_pubkey, client_message_id,
    destination_kind, destination_ref, body, body_encoding, priority, created_at)
SELECT bid, mesh_id, sender, cmid, 'dm', 'r', '\\x00'::bytea, 'utf8', 'next', at
FROM plan WHERE dm AND r NOT IN (7, 37, {pruned});

INSERT INTO mesh.message_history (history_id, broker_message_id, mesh_id, sender_pubkey,
    destination_kind, destination_ref, created_at)
SELECT hid, bid, mesh_id, sender, CASE WHEN dm THEN 'dm' ELSE 'topic' END, 'general', at
FROM plan WHERE r NOT IN (7, 27, {pruned});

INSERT INTO mesh.delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,
    created_at)
SELECT mesh_id, 'R', 1, i, CASE WHEN r = 47 THEN 'X' || i ELSE bid END, at
FROM plan WHERE r NOT IN (7, 37, {pruned});
"""


def expected(n: int) -> dict[str, set[tuple[str, str]]]:
    """(mesh, row key) of every planted orphan, worked out here without any SQL."""
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for r, kind in PLANTS.items():
        for i in range(r, n + 1, 1000):
            mesh, num = f"MESH{i % MESHES}", str(i).rjust(25, "0")
            key = {
                "dedupe_without_message": f"{i % 1000:x}".rjust(64, "0") + f"/c{i}",
                "message_without_dedupe": "B" + num,
                "message_without_history": "B" + num,
                "history_without_message": "H" + num,
                "delivery_without_message": f"R/1/{i}",
            }[kind]
            out[kind].add((mesh, key))
    return out


async def create_db(name: str, n: int, now: int) -> None:
    admin = await asyncpg.connect(DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(DSN.rsplit("/", 1)[0] + "/" + name)
    try:
        await conn.execute("SET synchronous_commit = off")
        for m in POSTGRES_MIGRATIONS.load():
            await conn.execute(m.sql)
        await conn.execute(FILL_SQL.format(n=n, now=now, day=f"{DAY}::bigint", meshes=MESHES,
                                           pruned=PRUNED, expired=EXPIRED))
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def drop_db(name: str) -> None:
    admin = await asyncpg.connect(DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def bench(n: int, partitions: int) -> bool:
    name = "tm_bench_audit_" + secrets.token_hex(4)
    now = time.time_ns() // 1_000_000
    try:
        t0 = time.monotonic()
        asyncio.run(create_db(name, n, now))
        fill_s = time.monotonic() - t0
        with tempfile.TemporaryDirectory(prefix="tm-bench-audit-") as tmp:
            cfg = load({}, os.environ, {
                "audit.store": DSN.rsplit("/", 1)[0] + "/" + name, "audit.out": tmp,
                "audit.master": "local[2]", "audit.partitions": partitions})
            t1 = time.monotonic()
            spark = build_session(cfg)
            start_s = time.monotonic() - t1
            t2 = time.monotonic()
            outcome = run_audit(spark, cfg)
            audit_s = time.monotonic() - t2
            assert outcome.report is not None, outcome.error
            rows = spark.read.parquet(str(Path(tmp) / outcome.report["orphans"])).collect()
            read = sum(outcome.report["table_rows"].values())
    finally:
        asyncio.run(drop_db(name))
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for row in rows:
        found[row["kind"]].add((row["mesh_id"], row["row_key"]))
    want = expected(n)
    ok = dict(found) == dict(want) and len(rows) == sum(len(v) for v in want.values())
    print(f"{n:>11,} dedupe rows  fill {fill_s:6.1f} s  session {start_s:5.1f} s  "
          f"audit {audit_s:6.1f} s  {n / audit_s:>9,.0f} dedupe rows/s  "
          f"({read / audit_s:>9,.0f} rows/s over all {read:,} rows)  "
          f"orphans {len(rows):,} ({'exact' if ok else 'MISMATCH'})", flush=True)
    if not ok:
        for kind in PLANTS.values():
            print(f"  {kind}: missed {len(want[kind] - found[kind])}, "
                  f"false {len(found[kind] - want[kind])}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--partitions", type=int, default=4)
    args = p.parse_args()
    results = [bench(int(n), args.partitions) for n in args.sizes.split(",")]
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
