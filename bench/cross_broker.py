"""Delivery latency across brokers on one PostgreSQL, against delivery on the same broker
measured in the same run (the peer).

    .venv/bin/python bench/cross_broker.py [--messages 300] [--pg-dsn DSN]

Two brokers (``tidemesh broker up``) on a fresh database. A sender connected to broker X
sends DMs one at a time, alternating between a recipient on X (woken in process when the
accept commits) and one on broker Y (woken by X's NOTIFY, heard on Y's LISTEN connection).
Each message's latency is from sending the ``send`` frame to its ``deliver`` reaching the
recipient; prints p50 and p99 of each and their ratio. The safety poll is pushed out of
reach (``cluster.poll_s`` = 3600), so every cross-broker delivery was woken by NOTIFY.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
from nacl.signing import SigningKey

from tidemesh.broker.store import open_store
from tidemesh.core.wire import decode, encode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_accept import Member, start_broker  # a sibling script, not a package


class Recipient(Member):
    """Resumes its stream and resolves the waiter of each delivered client_message_id."""

    delivered: dict[str, asyncio.Future[float]]

    async def start(self) -> None:
        self.delivered = {}
        await self.ws.send(encode({"type": "resume", "id": "r", "epoch": 0, "last_seq": 0}))

    async def _read(self) -> None:
        async for raw in self.ws:
            frame = decode(raw)
            items = (frame["deliveries"] if frame["type"] == "deliver_batch"
                     else [frame] if frame["type"] == "deliver" else [])
            for item in items:
                fut = self.delivered.pop(item["client_message_id"], None)
                if fut is not None:
                    fut.set_result(time.perf_counter())


async def prepare(url: str) -> tuple[str, list[SigningKey]]:
    store = await open_store(url)
    try:
        now = int(time.time() * 1000)
        mesh = await store.create_mesh("bench", now)
        keys = [SigningKey.generate() for _ in range(3)]
        for k in keys:
            await store.add_member(mesh.id, bytes(k.verify_key).hex(), now)
        return mesh.id, keys
    finally:
        await store.close()


def quantiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=100)
    return q[49] * 1000, q[98] * 1000


async def measure(px: int, py: int, mesh_id: str, keys: list[SigningKey],
                  messages: int) -> dict[str, list[float]]:
    sender = await Member.connect(px, mesh_id, keys[0])
    near = await Recipient.connect(px, mesh_id, keys[1])
    far = await Recipient.connect(py, mesh_id, keys[2])
    for r in (near, far):
        await r.start()
    out: dict[str, list[float]] = {"same broker": [], "other broker": []}
    loop = asyncio.get_running_loop()
    for i in range(messages * 2):
        name, r, key = (("same broker", near, keys[1]) if i % 2 == 0
                        else ("other broker", far, keys[2]))
        cmid = f"m{i}"
        delivered: asyncio.Future[float] = loop.create_future()
        r.delivered[cmid] = delivered
        started = time.perf_counter()
        answer = await sender.call({"type": "send", "id": cmid, "client_message_id": cmid,
                                    "to": {"kind": "dm", "ref": bytes(key.verify_key).hex()},
                                    "body": "x" * 200, "body_encoding": "utf8",
                                    "priority": "next"})
        assert answer["status"] == 201
        out[name].append(await asyncio.wait_for(delivered, 30) - started)
    for m in (sender, near, far):
        await m.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=300, help="per recipient")
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    os.environ["TIDEMESH_CLUSTER_POLL_S"] = "3600"  # read by the brokers start_broker starts
    db = "tm_bench_" + secrets.token_hex(4)
    admin = await asyncpg.connect(args.pg_dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    url = args.pg_dsn.rsplit("/", 1)[0] + "/" + db
    procs = []
    try:
        mesh_id, keys = await prepare(url)
        with tempfile.TemporaryDirectory() as hx, tempfile.TemporaryDirectory() as hy:
            (x, px), (y, py) = start_broker(url, hx), start_broker(url, hy)
            procs = [x, y]
            out = await measure(px, py, mesh_id, keys, args.messages)
        (n50, n99), (f50, f99) = quantiles(out["same broker"]), quantiles(out["other broker"])
        print(f"send → deliver, {args.messages} DMs each, one at a time")
        print(f"  same broker   p50 {n50:6.2f} ms  p99 {n99:6.2f} ms")
        print(f"  other broker  p50 {f50:6.2f} ms  p99 {f99:6.2f} ms")
        print(f"  other/same    p50 {f50 / n50:5.2f}x    p99 {f99 / n99:5.2f}x")
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
