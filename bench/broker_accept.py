"""Broker accept throughput, driven the way daemons drive it, on SQLite and PostgreSQL, with
NATS JetStream measured in the same run as the peer.

    .venv/bin/python bench/broker_accept.py [--seconds 10] [--members 4] [--frame 100]
        [--frames-in-flight 2] [--singles-in-flight 16] [--pg-dsn DSN] [--nats URL]
        [--profile DIR] [--brokers 1,2,3]

Two loads per store, each from ``--members`` connections (one member each, as one daemon
each):

* ``batch``: ``send_batch`` frames of ``--frame`` sends (a daemon's claimed outbox rows),
  ``--frames-in-flight`` frames on the wire per connection;
* ``single``: lone ``send`` frames, ``--singles-in-flight`` per connection.

Each prints accepts/s, the p99 of a send's answer (a batch's sends are answered together:
its frame's round trip), and the sends per accept transaction read from the broker's
``cm_broker_accept_batch_size`` histogram. The broker runs as its own process
(``tidemesh broker up``), the load generator in this one; both share the machine's cores.
Every accept is durable (SQLite synchronous=FULL, PostgreSQL synchronous_commit as
configured) before it is answered. JetStream then gets as many deduplicated publishes
(``Nats-Msg-Id``, file storage, 256 pending) as PostgreSQL's batch load accepted; its default
acks before fsync, so the ratio is against a weaker guarantee and is printed every time on
purpose. ``--profile DIR`` records the broker with py-spy during each load (raw collapsed
stacks) and prints where its samples ended.

``--brokers 1,2,3`` instead runs the batch load on PostgreSQL only, with that many broker
processes on one database and the members spread over them round robin (as daemons spread
over a mesh's brokers). Per run it prints the accepts/s in all and, per broker process, its
share of the sends and its CPU per send (from /proc: user + system time over the sends it
committed), so the capacity on a bigger machine can be worked out: a broker's CPU per send
stays put while the curve flattens on 2 cores. It also prints PostgreSQL's CPU per send,
then runs NATS with as many publishes and prints the ratio and the rate this machine's cores
allow at the brokers' and PostgreSQL's CPU per send, however cheap the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from nacl.signing import SigningKey
from proc_cpu import cpu_seconds, postgres_cpu_seconds
from websockets.asyncio.client import ClientConnection, connect

from tidemesh.broker.store import open_store
from tidemesh.core import features, handshake
from tidemesh.core.wire import decode, encode

BODY = "x" * 200
ROWS_METRIC = "cm_broker_accept_batch_size"


@dataclass
class Load:
    name: str
    sends: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    rows_per_txn: float = 0.0

    @property
    def rate(self) -> float:
        return self.sends / self.seconds

    @property
    def p99_ms(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98] * 1000


class Member:
    """One daemon's connection: writes frames, matches answers by id."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, port: int, mesh_id: str, key: SigningKey) -> Member:
        ws = await connect(f"ws://127.0.0.1:{port}", compression=None, max_size=8 << 20)
        challenge = decode(await ws.recv())
        pubkey, signature = handshake.sign(key, mesh_id, challenge["nonce"])
        await ws.send(encode({"type": "hello", "mesh_id": mesh_id, "pubkey": pubkey,
                              "nonce": challenge["nonce"], "signature": signature}))
        assert decode(await ws.recv())["type"] == "hello_ack"
        await ws.send(encode({"type": "feature_negotiation_request", "id": "f",
                              "require": list(features.REQUIRED), "optional": []}))
        while decode(await ws.recv())["type"] != "feature_negotiation_response":
            pass  # presence of the other members
        return cls(ws)

    async def _read(self) -> None:
        async for raw in self.ws:
            frame = decode(raw)
            fut = self.waiting.pop(frame.get("id") or "", None)
            if fut is not None:
                fut.set_result(frame)

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[frame["id"]] = fut
        await self.ws.send(encode(frame))
        return await fut

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self.reader, return_exceptions=True)


def send_item(cmid: str) -> dict[str, Any]:
    return {"id": cmid, "client_message_id": cmid, "to": {"kind": "topic", "ref": "bench"},
            "body": BODY, "body_encoding": "utf8", "priority": "next"}


def check(results: list[dict[str, Any]]) -> None:
    for r in results:
        if r["status"] != 201:
            raise RuntimeError(f"unexpected answer {r}")


async def batch_worker(m: Member, tag: str, frame_size: int, stop_at: float,
                       load: Load) -> None:
    n = 0
    while time.perf_counter() < stop_at:
        n += 1
        sends = [send_item(f"{tag}-{n}-{i}") for i in range(frame_size)]
        t0 = time.perf_counter()
        answer = await m.call({"type": "send_batch", "id": f"{tag}-{n}", "sends": sends})
        load.latencies.append(time.perf_counter() - t0)
        check(answer["results"])
        load.sends += len(sends)


async def single_worker(m: Member, tag: str, stop_at: float, load: Load) -> None:
    n = 0
    while time.perf_counter() < stop_at:
        n += 1
        t0 = time.perf_counter()
        answer = await m.call({"type": "send", **send_item(f"{tag}-{n}")})
        load.latencies.append(time.perf_counter() - t0)
        check([answer])
        load.sends += 1


def rows_histogram(port: int) -> tuple[float, float]:
    """(sum, count) of the broker's sends-per-accept-transaction histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    got = {}
    for line in text.splitlines():
        for part in ("_sum", "_count"):
            if line.startswith(f"{ROWS_METRIC}{part} "):
                got[part] = float(line.split()[1])
    return got["_sum"], got["_count"]


async def run_load(load: Load, port: int, members: list[Member], args: argparse.Namespace,
                   profile: Path | None, pid: int) -> Load:
    spy = start_profile(profile, pid, f"{load.name}.txt", args.seconds)
    before = rows_histogram(port)
    stop_at = time.perf_counter() + args.seconds
    t0 = time.perf_counter()
    tag = f"{load.name}-{secrets.token_hex(3)}"
    if load.name.endswith("batch"):
        await asyncio.gather(*(batch_worker(m, f"{tag}-{i}-{j}", args.frame, stop_at, load)
                               for i, m in enumerate(members)
                               for j in range(args.frames_in_flight)))
    else:
        await asyncio.gather(*(single_worker(m, f"{tag}-{i}-{j}", stop_at, load)
                               for i, m in enumerate(members)
                               for j in range(args.singles_in_flight)))
    load.seconds = time.perf_counter() - t0
    after = rows_histogram(port)
    load.rows_per_txn = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    finish_profile(spy, profile, f"{load.name}.txt")
    print(f"{load.name:15} sends={load.sends:<7} accepts/s={load.rate:8.0f} "
          f"p99={load.p99_ms:7.2f} ms  sends/txn={load.rows_per_txn:6.1f}", flush=True)
    return load


async def prepare(url: str, members: int) -> tuple[str, list[SigningKey]]:
    store = await open_store(url)
    try:
        now = int(time.time() * 1000)
        mesh = await store.create_mesh("bench", now)
        keys = [SigningKey.generate() for _ in range(members + 1)]
        for k in keys:
            await store.add_member(mesh.id, bytes(k.verify_key).hex(), now)
        await store.create_topic(mesh.id, "bench", None, now)
        await store.subscribe(mesh.id, "bench", bytes(keys[-1].verify_key).hex(), now)
        return mesh.id, keys[:-1]
    finally:
        await store.close()


def start_broker(url: str, home: str) -> tuple[subprocess.Popen[bytes], int]:
    env = {**os.environ, "TIDEMESH_HOME": home, "TIDEMESH_LOG_LEVEL": "warning",
           "TIDEMESH_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--store", url,
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    return proc, int(json.loads(proc.stdout.readline())["port"])


def start_profile(folder: Path | None, pid: int, name: str,
                  seconds: float) -> subprocess.Popen[bytes] | None:
    if folder is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200",
                             "-f", "raw", "--gil", "-o", str(folder / name), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_profile(spy: subprocess.Popen[bytes] | None, folder: Path | None,
                   name: str) -> None:
    if spy is None or folder is None:
        return
    spy.wait(30)
    print(profile_summary(folder / name), flush=True)


def profile_summary(path: Path, top: int = 8) -> str:
    """Where the broker's samples ended (leaf function), as shares of all samples."""
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.split(";")[-1]
        leaves[leaf.split(" (")[0] + " " + leaf.rsplit("/", 1)[-1].rstrip(")")] += int(count)
        total += int(count)
    rows = [f"    {n / total:5.1%} {leaf}" for leaf, n in leaves.most_common(top)]
    return f"  py-spy {path.name}: {total} samples\n" + "\n".join(rows)


async def one_store(name: str, url: str, args: argparse.Namespace) -> dict[str, Load]:
    mesh_id, keys = await prepare(url, args.members)
    out: dict[str, Load] = {}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as home:
        proc, port = start_broker(url, home)
        try:
            members = [await Member.connect(port, mesh_id, k) for k in keys]
            warm = argparse.Namespace(**{**vars(args), "seconds": 1.0})
            await run_load(Load(f"{name}-warmup-batch"), port, members, warm, None, proc.pid)
            for kind in ("batch", "single"):
                out[kind] = await run_load(Load(f"{name}-{kind}"), port, members, args,
                                           args.profile, proc.pid)
            for m in members:
                await m.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    return out


async def several_brokers(url: str, count: int, args: argparse.Namespace
                          ) -> tuple[Load, float]:
    """The load, and the CPU seconds the brokers and PostgreSQL spent per send together."""
    mesh_id, keys = await prepare(url, args.members)
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as root:
        # Each broker its own home: running.json is per process.
        brokers = [start_broker(url, f"{root}/{i}") for i in range(count)]
        try:
            members = [await Member.connect(brokers[i % count][1], mesh_id, k)
                       for i, k in enumerate(keys)]
            warm = Load("warmup")
            stop_at = time.perf_counter() + 1.0
            await asyncio.gather(*(batch_worker(m, f"w{i}", args.frame, stop_at, warm)
                                   for i, m in enumerate(members)))
            cpu0 = [cpu_seconds(p.pid) for p, _ in brokers]
            pg0 = postgres_cpu_seconds()
            rows0 = [rows_histogram(port) for _, port in brokers]
            load = Load(f"postgres-{count}-broker{'s' if count > 1 else ''}")
            tag = secrets.token_hex(3)
            stop_at = time.perf_counter() + args.seconds
            t0 = time.perf_counter()
            await asyncio.gather(*(batch_worker(m, f"{tag}-{i}-{j}", args.frame, stop_at, load)
                                   for i, m in enumerate(members)
                                   for j in range(args.frames_in_flight)))
            load.seconds = time.perf_counter() - t0
            cpu = [cpu_seconds(p.pid) - c for (p, _), c in zip(brokers, cpu0, strict=True)]
            pg = postgres_cpu_seconds() - pg0
            rows = [rows_histogram(port) for _, port in brokers]
            sent = [r[0] - r0[0] for r, r0 in zip(rows, rows0, strict=True)]
            print(f"{load.name:20} sends={load.sends:<7} accepts/s={load.rate:8.0f} "
                  f"p99={load.p99_ms:7.2f} ms", flush=True)
            for i, (c, n) in enumerate(zip(cpu, sent, strict=True)):
                print(f"  broker {i}: {n / max(1.0, sum(sent)):5.1%} of sends, "
                      f"{1e6 * c / max(1.0, n):7.1f} µs CPU per send, "
                      f"{c / load.seconds:4.0%} of a core", flush=True)
            # The database's own share: what one accepted send costs PostgreSQL, whatever
            # the brokers do. Its floor times a peer's rate says whether two cores can match it.
            print(f"  postgresql: {1e6 * pg / max(1.0, sum(sent)):7.1f} µs CPU per send, "
                  f"{pg / load.seconds:4.0%} of a core", flush=True)
            for m in members:
                await m.close()
            return load, (sum(cpu) + pg) / max(1.0, sum(sent))
        finally:
            for p, _ in brokers:
                p.send_signal(signal.SIGTERM)
            for p, _ in brokers:
                p.wait(10)


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


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--frame", type=int, default=100)
    ap.add_argument("--frames-in-flight", type=int, default=2)
    ap.add_argument("--singles-in-flight", type=int, default=16)
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--brokers", default=None, metavar="1,2,3",
                    help="batch load on PostgreSQL with that many broker processes per run")
    args = ap.parse_args()
    if args.brokers:
        await brokers_main(args)
        return
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings
    results: dict[str, dict[str, Load]] = {}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as d:
        results["sqlite"] = await one_store("sqlite", f"sqlite:///{Path(d) / 'b.db'}", args)
    db = "tm_bench_" + secrets.token_hex(4)
    admin = await asyncpg.connect(args.pg_dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    try:
        results["postgres"] = await one_store(
            "postgres", args.pg_dsn.rsplit("/", 1)[0] + "/" + db, args)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()
    count = results["postgres"]["batch"].sends
    nats_rate = await nats_run(args.nats, count)
    print(f"nats            publish_async 256 pending, Nats-Msg-Id, file storage: {count} msgs "
          f"{nats_rate:8.0f} msg/s (acks before fsync)")
    for name, loads in results.items():
        for kind, load in loads.items():
            print(f"ratio           {name}-{kind} / nats = {load.rate / nats_rate:.2f}")


async def brokers_main(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    base = args.pg_dsn.rsplit("/", 1)[0]
    for count in (int(n) for n in args.brokers.split(",")):
        db = "tm_bench_" + secrets.token_hex(4)
        admin = await asyncpg.connect(args.pg_dsn)
        await admin.execute(f'CREATE DATABASE "{db}"')
        try:
            load, per_send = await several_brokers(f"{base}/{db}", count, args)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            await admin.close()
        nats_rate = await nats_run(args.nats, load.sends)
        cores = os.cpu_count() or 1
        # What the machine allows at this CPU per send, even if the load generator cost
        # nothing: the ceiling any ratio to a peer in the same run is bounded by.
        print(f"  nats (same run): {nats_rate:8.0f} msg/s; ratio {load.rate / nats_rate:.2f}; "
              f"{cores} cores at {1e6 * per_send:.0f} µs of broker + PostgreSQL CPU a send "
              f"allow at most {cores / per_send:8.0f} sends/s "
              f"({cores / per_send / nats_rate:.2f} of nats)", flush=True)


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
