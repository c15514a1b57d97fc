"""bench/topic_fanout: what one topic message costs the broker's PostgreSQL store at N
subscribers (issue #30.4-5), in-process, on a fresh database.

For each N: the accept of one topic message (wall ms, rows added to the store's
tables, WAL bytes from ``pg_current_wal_lsn()`` before and after), then its delivery to all
N as their pumps do it when woken together (hand-out where the store has one, one page
read each, a cumulative ack each; wall ms, WAL bytes), the median of ``--rounds``. Runs on
the code it is imported from: run it at two commits for a before and after (a store
without ``hand_out`` is read and acked the old way).

    .venv/bin/python bench/topic_fanout.py [--subscribers 50,200,1000] [--rounds 5]
        [--pg-dsn DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from typing import Any

import asyncpg

from tidemesh.broker.accept import AcceptInput
from tidemesh.broker.store import open_store
from tidemesh.core.ids import new_ulids

SENDER = "a" * 64
TABLES = ("client_message_dedupe", "topic_message", "message_history", "delivery_queue",
          "topic_delivery", "recipient_cursor")


def _send(mesh_id: str, tag: str) -> AcceptInput:
    now = int(time.time() * 1000)
    ids = new_ulids(2, now)
    return AcceptInput(
        mesh_id=mesh_id, sender_pubkey=SENDER, client_message_id=tag, kind="topic",
        ref="general", body=b"x" * 64, body_encoding="utf8", priority="next", meta=None,
        reply_to=None, fingerprint=secrets.token_bytes(32), broker_message_id=ids[0],
        history_id=ids[1], now_ms=now, expires_at=now + 7 * 86_400_000)


async def _inserted(conn: Any) -> int:
    """Rows in the store's tables (nothing is deleted while this runs)."""
    total = 0
    for t in TABLES:
        if await conn.fetchval("SELECT to_regclass($1)", f"mesh.{t}") is not None:
            total += int(await conn.fetchval(f"SELECT count(*) FROM mesh.{t}"))  # noqa: S608
    return total


async def _wal(conn: Any) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def measure(dsn: str, n: int, rounds: int) -> dict[str, float]:
    store = await open_store(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        now = int(time.time() * 1000)
        mesh = await store.create_mesh(f"bench{n}", now)
        await store.add_member(mesh.id, SENDER, now)
        await store.create_topic(mesh.id, "general", None, now)
        members = [secrets.token_hex(32) for _ in range(n)]
        for m in members:
            await store.add_member(mesh.id, m, now)
            await store.subscribe(mesh.id, "general", m, now)
        got: dict[str, list[float]] = {k: [] for k in (
            "accept_ms", "accept_rows", "accept_wal", "deliver_ms", "deliver_wal")}
        hand_out = getattr(store, "hand_out", None)
        for r in range(rounds + 1):   # the first round warms up
            rows0, wal0, t0 = await _inserted(conn), await _wal(conn), time.perf_counter()
            result = await store.accept(_send(mesh.id, f"r{r}"))
            t1 = time.perf_counter()
            rows1, wal1 = await _inserted(conn), await _wal(conn)
            assert result.status == 201, result

            async def pump(m: str, r: int = r) -> None:
                if hand_out is not None:
                    await hand_out(mesh.id, m, now)
                page = await store.deliveries_after(mesh.id, m, 1, r, 256)
                assert len(page) == 1, (m, r, len(page))
                await store.ack(mesh.id, m, 1, page[-1].seq, now)

            t2 = time.perf_counter()
            await asyncio.gather(*(pump(m) for m in members))
            t3 = time.perf_counter()
            wal2 = await _wal(conn)
            if r:
                got["accept_ms"].append((t1 - t0) * 1000)
                got["accept_rows"].append(rows1 - rows0)
                got["accept_wal"].append(wal1 - wal0)
                got["deliver_ms"].append((t3 - t2) * 1000)
                got["deliver_wal"].append(wal2 - wal1)
        return {k: statistics.median(v) for k, v in got.items()}
    finally:
        await conn.close()
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", default="50,200,1000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    admin = await asyncpg.connect(args.pg_dsn)
    name = "bench_fanout_" + secrets.token_hex(4)
    await admin.execute(f'CREATE DATABASE "{name}"')
    base = args.pg_dsn.rpartition("/")[0]
    try:
        print(f"{'N':>5} {'accept ms':>10} {'rows':>5} {'WAL B':>8} {'deliver ms':>11}"
              f" {'WAL B/delivery':>15}")
        for n in (int(x) for x in args.subscribers.split(",")):
            m = await measure(f"{base}/{name}", n, args.rounds)
            print(f"{n:>5} {m['accept_ms']:>10.1f} {m['accept_rows']:>5.0f}"
                  f" {m['accept_wal']:>8.0f} {m['deliver_ms']:>11.1f}"
                  f" {m['deliver_wal'] / n:>15.0f}")
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
