"""Broker accept throughput: sends over the WebSocket at 1 and 64 in flight, on SQLite and
PostgreSQL, then the same number of deduplicated publishes to NATS JetStream, and the ratio.

    .venv/bin/python bench/broker_accept.py [--seconds 10] [--pg-dsn DSN] [--nats URL]

The broker runs as its own process (``tidemesh broker up``), the load generator here; both
share the machine's cores. Every accept is durable (SQLite synchronous=FULL, PostgreSQL
synchronous_commit as configured) before it is answered. JetStream's default acks before
fsync, so the ratio is against a weaker guarantee; it is printed every time on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from nacl.signing import SigningKey

from tidemesh.broker.store import open_store
from tidemesh.daemon.link import BrokerLink

BODY = "x" * 200


async def prepare(url: str) -> tuple[str, SigningKey]:
    store = await open_store(url)
    try:
        now = int(time.time() * 1000)
        mesh = await store.create_mesh("bench", now)
        keys = [SigningKey.generate() for _ in range(2)]
        for k in keys:
            await store.add_member(mesh.id, bytes(k.verify_key).hex(), now)
        await store.create_topic(mesh.id, "bench", None, now)
        await store.subscribe(mesh.id, "bench", bytes(keys[1].verify_key).hex(), now)
        return mesh.id, keys[0]
    finally:
        await store.close()


def start_broker(url: str, home: str) -> tuple[subprocess.Popen[bytes], int]:
    env = {**os.environ, "TIDEMESH_HOME": home, "TIDEMESH_LOG_LEVEL": "warning",
           "TIDEMESH_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--store", url,
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    return proc, int(json.loads(proc.stdout.readline())["port"])


async def drive(port: int, mesh_id: str, key: SigningKey, inflight: int, seconds: float,
                tag: str) -> tuple[int, float, float]:
    link = await BrokerLink.connect(f"ws://127.0.0.1:{port}", mesh_id, key)
    lat: list[float] = []
    stop_at = time.perf_counter() + seconds
    payload = {"to": {"kind": "topic", "ref": "bench"}, "body": BODY, "body_encoding": "utf8",
               "priority": "next"}

    async def worker(w: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            n += 1
            t0 = time.perf_counter()
            r = await link.send(f"{tag}-{w}-{n}", payload)
            if r["status"] != 201:
                raise RuntimeError(f"unexpected answer {r}")
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(inflight)))
    elapsed = time.perf_counter() - t0
    await link.close()
    q = statistics.quantiles(lat, n=100)
    return len(lat), len(lat) / elapsed, q[98] * 1000


async def nats_run(url: str, count: int, pending: int = 256) -> float:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = "TMBENCH" + secrets.token_hex(3).upper()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.>"],
                                     storage=StorageType.FILE, duplicate_window=120))
    data = BODY.encode()
    t0 = time.perf_counter()
    futs: list[asyncio.Future[Any]] = []
    for i in range(count):
        futs.append(await js.publish_async(f"{stream}.x", data,
                                           headers={"Nats-Msg-Id": f"m{i}"}))
        if len(futs) >= pending:
            await asyncio.gather(*futs)
            futs.clear()
    await asyncio.gather(*futs)
    rate = count / (time.perf_counter() - t0)
    await js.delete_stream(stream)
    await nc.close()
    return rate


async def one_store(name: str, url: str, seconds: float) -> dict[int, tuple[int, float, float]]:
    mesh_id, key = await prepare(url)
    out = {}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as home:
        proc, port = start_broker(url, home)
        try:
            await drive(port, mesh_id, key, 16, 1.0, "warm")
            for inflight in (1, 64):
                out[inflight] = await drive(port, mesh_id, key, inflight, seconds,
                                            f"{name}{inflight}")
                n, rate, p99 = out[inflight]
                print(f"{name:8} in_flight={inflight:<3} accepts={n:<7} accepts/s={rate:8.0f} "
                      f"p99={p99:6.2f} ms", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings
    results = {}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as d:
        results["sqlite"] = await one_store("sqlite", f"sqlite:///{Path(d) / 'b.db'}",
                                            args.seconds)
    db = "tm_bench_" + secrets.token_hex(4)
    admin = await asyncpg.connect(args.pg_dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    try:
        results["postgres"] = await one_store("postgres", args.pg_dsn.rsplit("/", 1)[0] + "/" + db,
                                              args.seconds)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()
    count = results["postgres"][64][0]
    nats_rate = await nats_run(args.nats, count)
    print(f"nats     publish_async 256 pending, Nats-Msg-Id, file storage: {count} msgs "
          f"{nats_rate:8.0f} msg/s (acks before fsync)")
    for name in ("sqlite", "postgres"):
        print(f"ratio    {name} 64-in-flight / nats = {results[name][64][1] / nats_rate:.2f}")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
