"""bench/store_accept: the broker process's CPU per send in a store's accept, in-process.

The accept of ``--batches`` frames of ``--frame`` topic sends (two subscribers, so two
deliveries each) through the store's engine, one frame at a time, on a fresh database (a
new PostgreSQL database, a new SQLite file). What it prints is the CPU of this process per
send (``time.process_time``: the accept sequence, the statements' parameters, the engine;
for SQLite its own work too, for PostgreSQL not the server's) and the wall time per frame,
the median of ``--rounds``. Steadier than bench/broker_accept.py's throughput on a shared
2-core machine: use it for a before and after of a change to broker/store/ (run it at both
commits).

    .venv/bin/python bench/store_accept.py [--stores sqlite,postgres] [--frame 200]
        [--batches 50] [--rounds 5] [--pg-dsn DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import asyncpg

from tidemesh.broker.accept import AcceptInput
from tidemesh.broker.store import open_store
from tidemesh.core.ids import new_ulids

MESH, SENDER, R1, R2 = "bench", "a" * 64, "b" * 64, "c" * 64


def _frame(mesh_id: str, size: int, tag: str) -> list[AcceptInput]:
    now = int(time.time() * 1000)
    ids = new_ulids(2 * size, now)
    return [AcceptInput(
        mesh_id=mesh_id, sender_pubkey=SENDER, client_message_id=f"{tag}-{i}", kind="topic",
        ref="general", body=b"x" * 64, body_encoding="utf8", priority="next", meta=None,
        reply_to=None, fingerprint=secrets.token_bytes(32), broker_message_id=ids[2 * i],
        history_id=ids[2 * i + 1], now_ms=now, expires_at=now + 7 * 86_400_000)
        for i in range(size)]


async def measure(url: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """CPU per send and wall per frame of each round, on the store at ``url``."""
    store = await open_store(url)
    try:
        now = int(time.time() * 1000)
        mesh = await store.create_mesh(MESH, now)
        for member in (SENDER, R1, R2):
            await store.add_member(mesh.id, member, now)
        await store.create_topic(mesh.id, "general", None, now)
        for member in (R1, R2):
            await store.subscribe(mesh.id, "general", member, now)
        cpu, wall = [], []
        for r in range(args.rounds + 1):   # the first round warms up
            frames = [_frame(mesh.id, args.frame, f"r{r}b{b}") for b in range(args.batches)]
            c0, w0 = time.process_time(), time.perf_counter()
            for items in frames:
                results = await store.accept_batch(items)
                assert all(res.status == 201 for res in results), results[0]
            if r:
                cpu.append((time.process_time() - c0) / (args.batches * args.frame))
                wall.append((time.perf_counter() - w0) / args.batches)
        return cpu, wall
    finally:
        await store.close()


async def on_postgres(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    db = f"tm_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(args.pg_dsn)
    await admin.execute(f"CREATE DATABASE {db}")
    try:
        return await measure(args.pg_dsn.rsplit("/", 1)[0] + f"/{db}", args)
    finally:
        await admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
        await admin.close()


async def on_sqlite(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as d:
        return await measure(f"sqlite:///{Path(d) / 'broker.db'}", args)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--frame", type=int, default=200)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()

    print(f"{args.batches} frames of {args.frame} topic sends (2 deliveries each), "
          f"median of {args.rounds} rounds [min-max]")
    for name in args.stores.split(","):
        cpu, wall = await (on_sqlite(args) if name == "sqlite" else on_postgres(args))
        print(f"  {name:9} CPU per send {statistics.median(cpu) * 1e6:7.1f} µs "
              f"[{min(cpu) * 1e6:.1f}-{max(cpu) * 1e6:.1f}]   wall per frame "
              f"{statistics.median(wall) * 1e3:7.2f} ms "
              f"[{min(wall) * 1e3:.2f}-{max(wall) * 1e3:.2f}]")


if __name__ == "__main__":
    asyncio.run(main())
