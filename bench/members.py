"""bench/members: N members on one broker from one load process (issue #30), JetStream's N
durable consumers beside it in the same run.

Each member is a real joined member with its own key, speaking the daemon's protocol through
the daemon's own client of it (``daemon/link/websocket.py``): join once (a multi-use
invite), then in the storm hello, profile, resume, topic_subscribe, and cumulative acks of
what it receives. The broker is a real ``tidemesh broker up`` process on PostgreSQL (or
``--store sqlite``).

Phases, for each N:

* connect storm: all N at once; time to all connected, handshakes failed the first try;
* idle window: broker and PostgreSQL CPU % over it (``bench/proc_cpu.py``);
* 20 lone messages to one topic all N subscribe to, one at a time: all N received + acked
  (p50 / p99) and the accept of that message;
* a 500-message burst: deliveries/s;
* CPU of broker and PostgreSQL per delivery (lone and burst), broker RSS before / after the
  burst (and after a pause), rows and WAL bytes per message (PostgreSQL).

JetStream: a private ``nats-server`` (default sync) on a free port, one file stream, N
durable push consumers with explicit acks, from one connection: the same phases where they
apply. The load process runs every member in one event loop on a 2-core machine shared with
the broker and the database; its own CPU is printed for each phase: when it is near 100 %
of a core, the figure is the load process's limit, not the server's. Its garbage collector
is off during each run (collected between runs): it would walk all N members' objects.

    .venv/bin/python bench/members.py [--members 50,200,500,1000] [--store postgres|sqlite]
                                      [--lone 20] [--lone-gap-ms 0] [--burst 500]
                                      [--idle-s 25] [--no-jetstream] [--trim-probe] [--again K]
                                      [--presence feed|on-demand]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from nacl.signing import SigningKey
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import PG_DSN, _pct, _port, start_sync_always_nats
from proc_cpu import cpu_seconds, postgres_cpu_seconds

from tidemesh.broker.store import open_store
from tidemesh.core import features
from tidemesh.core.invite import new_token, token_hash
from tidemesh.daemon.link.websocket import BrokerLink, LinkError

TOPIC = "all"
PROFILE = {"status": "idle", "summary": "bench member"}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Meter:
    """CPU seconds of the server, PostgreSQL and this process over a phase."""

    def __init__(self, pid: int, pg: bool) -> None:
        self.pid, self.pg = pid, pg

    def __enter__(self) -> Meter:
        self.t0 = time.perf_counter()
        self.c0 = (cpu_seconds(self.pid), postgres_cpu_seconds() if self.pg else 0.0,
                   _self_cpu())
        return self

    def __exit__(self, *_exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        c1 = (cpu_seconds(self.pid), postgres_cpu_seconds() if self.pg else 0.0, _self_cpu())
        self.server, self.postgres, self.load = (b - a for a, b in zip(self.c0, c1, strict=True))

    def pct(self, seconds: float) -> float:
        return 100 * seconds / self.wall if self.wall else float("nan")


@dataclass
class Tally:
    """Who has received and acked each message (by body)."""

    n: int
    count: dict[str, int] = field(default_factory=dict)
    done_at: dict[str, float] = field(default_factory=dict)
    total: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, bodies: list[str], at: float) -> None:
        for b in bodies:
            c = self.count.get(b, 0) + 1
            self.count[b] = c
            if c == self.n:
                self.done_at[b] = at
        self.total += len(bodies)
        self.changed.set()

    async def until(self, pred: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not pred():
                self.changed.clear()
                await self.changed.wait()


async def _consume(link: BrokerLink, tally: Tally) -> None:
    """Receive, then ack cumulatively what each frame carried (as the daemon does after its
    inbox commit); the message counts as received + acked once the ack is written."""
    with contextlib.suppress(LinkError, asyncio.CancelledError):
        while True:
            batch = await link.deliveries.get()
            last = batch[-1]
            await link.ack(last["epoch"], last["seq"])
            tally.add([d["body"] for d in batch], time.perf_counter())


async def _lone(tally: Tally, count: int, publish: Any, gap_s: float = 0.0
                ) -> dict[str, list[float]]:
    """``count`` messages one at a time (after 2 that warm up), each once every member has
    received + acked the one before and ``gap_s`` more has passed (with a gap, the accept is
    an idle server's; without, it queues behind the previous message's N acks, which the
    members have sent but the server may still be reading): the accept and the all-acked
    times, in ms."""
    accept, all_acked = [], []
    for i in range(count + 2):
        body = f"lone-{i}-{secrets.token_hex(3)}"
        t0 = time.perf_counter()
        await publish(body)
        t_acc = time.perf_counter()
        await tally.until(lambda b=body: b in tally.done_at, 60)
        await asyncio.sleep(gap_s)
        if i >= 2:
            accept.append((t_acc - t0) * 1000)
            all_acked.append((tally.done_at[body] - t0) * 1000)
    return {"accept": accept, "all_acked": all_acked}


# -- tidemesh ------------------------------------------------------------------------------


async def _prepare(store_url: str, n: int) -> tuple[str, str]:
    """The mesh, its topic and a multi-use invite: (mesh_id, token)."""
    store = await open_store(store_url)
    try:
        mesh = await store.create_mesh("bench", _now_ms())
        await store.create_topic(mesh.id, TOPIC, None, _now_ms())
        token = new_token()
        await store.create_invite(mesh.id, token_hash(token), n + 10, None, _now_ms())
        return mesh.id, token
    finally:
        await store.close()


def _start_broker(store_url: str, home: Path, extra: list[str], probed: bool = False
                  ) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_LEVEL": "warning"}
    # BENCH_PROFILE=FILE: the broker runs under cProfile, its stats written to FILE at exit.
    # BENCH_PYSPY=PREFIX: py-spy records it over the lone messages (``_pyspy``).
    prof = os.environ.get("BENCH_PROFILE")
    # --trim-probe, BENCH_TRACEMALLOC: it runs with probes (``bench/probed_broker.py``).
    wrap = ["-m", "cProfile", "-o", prof] if prof else []
    main = (["-m", "tidemesh"] if not probed
            else [str(Path(__file__).resolve().parent / "probed_broker.py")])
    proc = subprocess.Popen([sys.executable, *wrap, *main, "broker", "up", "--store",
                             store_url, "--listen", f"127.0.0.1:{port}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()   # broker_ready
    return proc, f"ws://127.0.0.1:{port}"


async def _presence_told(url: str) -> dict[str, float]:
    """The broker's cm_broker_presence_entries_total by kind, from its /metrics."""
    metrics = "http" + url.removeprefix("ws") + "/metrics"

    def get() -> str:
        with urllib.request.urlopen(metrics, timeout=10) as r:   # noqa: S310 (our broker)
            return str(r.read().decode())

    return {sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(await asyncio.to_thread(get))
            for sample in family.samples
            if sample.name == "cm_broker_presence_entries_total"}


async def _pg(dsn: str, sql: str) -> Any:
    """One statement on its own connection (CREATE DATABASE cannot run in a transaction)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


ROWS_SQL = ("SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_all_tables"
            " WHERE schemaname = 'mesh'")


async def run_tidemesh(store_kind: str, n: int, args: argparse.Namespace, root: Path
                       ) -> dict[str, Any]:
    pg = store_kind == "postgres"
    db = f"tm_members_{secrets.token_hex(4)}"
    if pg:   # a database of its own, dropped afterwards
        await _pg(args.pg_dsn, f'CREATE DATABASE "{db}"')
        if os.environ.get("BENCH_PG_LOG"):   # every statement's duration in the server's log
            await _pg(args.pg_dsn, f'ALTER DATABASE "{db}" SET log_min_duration_statement = 0')
    store_url = (args.pg_dsn.rsplit("/", 1)[0] + "/" + db if pg
                 else f"sqlite:///{root / f'broker-{n}.db'}")
    mesh_id, token = await _prepare(store_url, n)
    home = root / f"home-{store_kind}-{n}"
    home.mkdir()
    broker, url = _start_broker(store_url, home, args.broker_arg,
                                probed=args.trim_probe or bool(os.environ.get("BENCH_TRACEMALLOC")))
    out: dict[str, Any] = {}
    keys = [SigningKey.generate() for _ in range(n)]
    sender_key = SigningKey.generate()
    links: list[BrokerLink] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        # Join: each member redeems the invite once (not measured), in slices.
        for i in range(0, n + 1, 50):
            joined = await asyncio.gather(*(
                BrokerLink.connect(url, mesh_id, k, invite_token=token, display_name=f"m{j}",
                                   open_timeout=120)
                for j, k in enumerate([*keys, sender_key][i:i + 50], start=i)))
            await asyncio.gather(*(link.close() for link in joined))

        # Connect storm: all at once; each retries until in (a first failure is counted).
        # --presence on-demand: members as daemons with presence.feed false.
        optional = features.optional_for(args.presence == "feed")
        failed = 0
        acked: list[float] = []

        async def member(k: SigningKey) -> BrokerLink:
            nonlocal failed
            while True:
                try:
                    link = await BrokerLink.connect(url, mesh_id, k, open_timeout=60,
                                                    optional=optional)
                    break
                except LinkError:
                    failed += 1
                    await asyncio.sleep(0.5)
            acked.append(time.perf_counter())
            await link.set_profile(PROFILE)
            await link.resume(0, 0)
            await link.request("topic_subscribe", TOPIC)
            return link

        told0 = await _presence_told(url)
        async with _pyspy(broker.pid, n, "storm"):
            with Meter(broker.pid, pg) as storm:
                links = list(await asyncio.gather(*(member(k) for k in keys)))
        out["storm"] = storm
        out["failed"] = failed
        out["handshaken"] = max(acked) - storm.t0
        tally = Tally(n)
        tasks = [asyncio.create_task(_consume(link, tally)) for link in links]
        sender = await BrokerLink.connect(url, mesh_id, sender_key, open_timeout=60)
        await asyncio.sleep(2)   # presence and subscriptions settle
        told = await _presence_told(url)
        out["presence_told"] = {k: v - told0.get(k, 0.0) for k, v in told.items()}

        async with _pyspy(broker.pid, n, "idle"):
            with Meter(broker.pid, pg) as idle:
                await asyncio.sleep(args.idle_s)
        out["idle"] = idle

        # Lone messages: the next once every member has received + acked the last. They
        # are sent by a process of its own, which times each accept without the wait this
        # process adds (the N pushes reach its one loop with the answer).
        await sender.close()
        child = await SenderChild.start(url, mesh_id, sender_key)
        try:
            async with _pyspy(broker.pid, n, "lone"):
                with Meter(broker.pid, pg) as lone:
                    out.update(await _lone(tally, args.lone, child.publish,
                                           args.lone_gap_ms / 1000))
        finally:
            await child.stop()
        out.update(lone=lone, lone_deliveries=n * (args.lone + 2), accept_own=child.took[2:])
        sender = await BrokerLink.connect(url, mesh_id, sender_key, open_timeout=60)

        out.update(await _burst(args, n, broker.pid, store_url if pg else None, tally,
                                sender))
        await sender.close()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        broker.terminate()
        broker.wait(30)
        if pg:
            await _pg(args.pg_dsn, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return out


class SenderChild:
    """The member that sends the lone messages, in a process of its own: this process
    writes each body on its stdin, it sends it and answers with the accept's time (ms) as it
    saw it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.took: list[float] = []

    @classmethod
    async def start(cls, url: str, mesh_id: str, key: SigningKey) -> SenderChild:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--sender-child", url, mesh_id, bytes(key).hex(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert ready == b"ready\n", ready
        return cls(proc)

    async def publish(self, body: str) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(body.encode() + b"\n")
        await self.proc.stdin.drain()
        self.took.append(float(await asyncio.wait_for(self.proc.stdout.readline(), 60)))

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 30)


async def _sender_child(url: str, mesh_id: str, seed_hex: str) -> int:
    """``SenderChild``'s process: one line in, one send, one line out."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    link = await BrokerLink.connect(url, mesh_id, SigningKey(bytes.fromhex(seed_hex)),
                                    open_timeout=60)
    loop = asyncio.get_running_loop()
    lines = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(lines), sys.stdin)
    print("ready", flush=True)
    while body := (await lines.readline()).decode().strip():
        t0 = time.perf_counter()
        r = await link.send(body, _payload(body))
        assert r.get("status") in (200, 201), r
        print(f"{(time.perf_counter() - t0) * 1000:.3f}", flush=True)
    await link.close()
    return 0


async def _burst(args: argparse.Namespace, n: int, pid: int, pg_url: str | None, tally: Tally,
                 sender: BrokerLink) -> dict[str, Any]:
    """The burst phase: deliveries/s, CPU, the broker's RSS around it, rows and WAL."""
    out: dict[str, Any] = {}
    await _snapshot(pid, "before")
    if args.trim_probe:
        out["rss_trimmed_before"] = await _trimmed_rss(pid)
    rss0 = _rss_mb(pid)
    wal0 = await _pg(pg_url, "SELECT pg_current_wal_lsn()::text") if pg_url else None
    rows0 = await _pg(pg_url, ROWS_SQL) if pg_url else None

    async def burst_once() -> None:
        base = tally.total
        bodies = [f"burst-{i}-{secrets.token_hex(3)}" for i in range(args.burst)]
        for i in range(0, len(bodies), 100):
            results = await sender.send_many([(b, _payload(b)) for b in bodies[i:i + 100]],
                                             within=120)
            assert all(r is not None for r in results)
        await tally.until(lambda: tally.total - base >= n * args.burst, 600)

    with Meter(pid, pg_url is not None) as burst:
        await burst_once()
    out["burst"] = burst
    out["burst_deliveries"] = n * args.burst
    out["rss"] = (rss0, _rss_mb(pid))
    if pg_url:
        await asyncio.sleep(1.5)   # the backends' table statistics are flushed each second
        out["wal"] = await _pg(
            pg_url, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{wal0}')")
        out["rows"] = int(await _pg(pg_url, ROWS_SQL)) - int(rows0 or 0)
    await asyncio.sleep(5)
    out["rss_later"] = _rss_mb(pid)
    await _snapshot(pid, "after")
    if args.trim_probe:
        out["rss_trimmed"] = await _trimmed_rss(pid)
    out["rss_again"] = []
    for _ in range(args.again):   # is what a burst left a high-water mark, or does it grow?
        await burst_once()
        await asyncio.sleep(5)
        out["rss_again"].append(_rss_mb(pid))
    return out


@contextlib.asynccontextmanager
async def _pyspy(pid: int, n: int, phase: str) -> AsyncIterator[None]:
    """BENCH_PYSPY=PREFIX: py-spy records the broker over one phase (BENCH_PYSPY_PHASE: lone,
    the default, storm or idle), its collapsed stacks written to PREFIX-N.txt (feed them to
    flamegraph.pl or speedscope); BENCH_PYSPY_RATE: samples a second (250)."""
    prefix = os.environ.get("BENCH_PYSPY")
    if not prefix or os.environ.get("BENCH_PYSPY_PHASE", "lone") != phase:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    rate = os.environ.get("BENCH_PYSPY_RATE", "250")   # samples a second
    spy = subprocess.Popen([exe, "record", "-p", str(pid), "-r", rate, "--nonblocking",
                            "--format", "raw", "-o", f"{prefix}-{n}.txt"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.sleep(1)   # attached before the first message
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)   # py-spy writes its file on SIGINT
        spy.wait(60)


async def _snapshot(pid: int, name: str) -> None:
    """BENCH_TRACEMALLOC=PREFIX: the broker (``bench/probed_broker.py``) writes a tracemalloc
    snapshot, PREFIX-1.snap before the burst and PREFIX-2.snap after it."""
    if os.environ.get("BENCH_TRACEMALLOC"):
        os.kill(pid, signal.SIGUSR2)
        # A snapshot of a traced heap takes a while; the members keep answering pings.
        await asyncio.sleep(10)


async def _trimmed_rss(pid: int) -> float:
    """The broker's RSS once glibc has handed its free pages back (``malloc_trim(0)``, called
    by ``bench/probed_broker.py`` on SIGUSR1): what RSS keeps beyond that is held by Python
    (its live objects, or its allocator's partly used arenas), not by the C heap's free lists."""
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(2)
    return _rss_mb(pid)


def _payload(body: str) -> dict[str, Any]:
    return {"to": {"kind": "topic", "ref": TOPIC}, "body": body, "body_encoding": "utf8",
            "priority": "next", "meta": None, "reply_to": None}


# -- JetStream -----------------------------------------------------------------------------


async def run_jetstream(pid: int, url: str, n: int, args: argparse.Namespace
                        ) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url, max_reconnect_attempts=1)
    js = nc.jetstream()
    stream = f"M{secrets.token_hex(3)}"
    subject = f"{stream}.x"
    await js.add_stream(name=stream, subjects=[subject], storage="file")
    tally = Tally(n)

    def handler() -> Any:
        async def cb(msg: Any) -> None:
            await msg.ack()
            tally.add([msg.data.decode()], time.perf_counter())
        return cb

    out: dict[str, Any] = {}
    subs: list[Any] = []
    try:
        with Meter(pid, False) as storm:
            subs = list(await asyncio.gather(*(
                js.subscribe(subject, durable=f"c{i}", cb=handler(), manual_ack=True,
                             pending_msgs_limit=100_000) for i in range(n))))
        out["storm"] = storm
        await asyncio.sleep(2)
        with Meter(pid, False) as idle:
            await asyncio.sleep(args.idle_s)
        out["idle"] = idle
        async def publish(body: str) -> None:
            await js.publish(subject, body.encode(), headers={"Nats-Msg-Id": body})

        with Meter(pid, False) as lone:
            out.update(await _lone(tally, args.lone, publish, args.lone_gap_ms / 1000))
        out.update(lone=lone, lone_deliveries=n * (args.lone + 2))
        rss0 = _rss_mb(pid)
        base = tally.total
        with Meter(pid, False) as burst:
            futs = [await js.publish_async(subject, f"burst-{i}".encode(),
                                           headers={"Nats-Msg-Id": f"burst-{i}"})
                    for i in range(args.burst)]
            await asyncio.gather(*futs)
            await tally.until(lambda: tally.total - base >= n * args.burst, 600)
        out.update(burst=burst, burst_deliveries=n * args.burst, rss=(rss0, _rss_mb(pid)))
        await asyncio.sleep(5)
        out["rss_later"] = _rss_mb(pid)
    finally:
        for s in subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await nc.close()
    return out


# -- report --------------------------------------------------------------------------------


def _report(label: str, n: int, r: dict[str, Any]) -> None:
    st, idle, lone, burst = r["storm"], r["idle"], r["lone"], r["burst"]
    print(f"  {label}")
    failed = (f" (handshakes done in {r['handshaken']:.2f} s), {r['failed']} handshakes failed"
              " the first try" if "failed" in r else "")
    pgs = f", PostgreSQL {1e3 * st.postgres / n:6.2f}" if st.postgres else ""
    print(f"    connect storm      {st.wall:7.2f} s to all {n} connected{failed};"
          f" server {1e3 * st.server / n:6.2f} ms CPU per connection{pgs};"
          f" load process {st.pct(st.load):4.0f} %")
    if "presence_told" in r:   # the N members' daemons decode these between them
        told = r["presence_told"]
        total = sum(told.values())
        print(f"      presence told    {total:10.0f} entries ({total / n ** 2:.2f} N²):"
              f" {told.get('snapshot', 0):.0f} in snapshots, {told.get('event', 0):.0f}"
              f" events; the load process {1e6 * st.load / max(total, 1):.1f} µs CPU each")
    pg = f", PostgreSQL {idle.pct(idle.postgres):5.2f} %" if idle.postgres else ""
    print(f"    idle               server {idle.pct(idle.server):5.2f} % CPU{pg}"
          f" over {idle.wall:.1f} s")
    print(f"    lone message       all received + acked p50 {_pct(r['all_acked'], .5):7.1f} ms"
          f"  p99 {_pct(r['all_acked'], .99):7.1f} ms;  accept p50 {_pct(r['accept'], .5):6.1f}"
          f" ms  p99 {_pct(r['accept'], .99):6.1f} ms"
          + (f" (timed by the sending process itself: p50 {_pct(r['accept_own'], .5):.1f}"
             f" ms, p99 {_pct(r['accept_own'], .99):.1f} ms)" if "accept_own" in r else ""))
    ld = r["lone_deliveries"]
    pgd = f", PostgreSQL {1e6 * lone.postgres / ld:6.0f}" if lone.postgres else ""
    print(f"      per delivery     server {1e6 * lone.server / ld:6.0f} µs CPU{pgd};"
          f" load process {lone.pct(lone.load):4.0f} %")
    bd = r["burst_deliveries"]
    pgb = f", PostgreSQL {1e6 * burst.postgres / bd:6.1f}" if burst.postgres else ""
    print(f"    burst              {bd / burst.wall:9.0f} deliveries/s ({bd} in"
          f" {burst.wall:.1f} s); server {1e6 * burst.server / bd:6.1f} µs CPU per delivery"
          f"{pgb}; load process {burst.pct(burst.load):4.0f} %")
    rss0, rss1 = r["rss"]
    trimmed = (f", {r['rss_trimmed']:7.1f} MB after malloc_trim" if "rss_trimmed" in r
               else "")
    again = ("; after more bursts " + ", ".join(f"{m:.1f}" for m in r["rss_again"]) + " MB"
             if r.get("rss_again") else "")
    print(f"    server RSS         {rss0:7.1f} MB before the burst, {rss1:7.1f} MB after,"
          f" {r['rss_later']:7.1f} MB 5 s later{trimmed}{again}")
    if "wal" in r:
        print(f"    burst writes       {r['rows'] / r['burst_deliveries'] * n:8.1f} rows and"
              f" {float(r['wal']) / (r['burst_deliveries'] / n):9.0f} WAL bytes per message"
              f" ({float(r['wal']) / r['burst_deliveries']:6.0f} per delivery)")


@contextlib.contextmanager
def _no_collector() -> Iterator[None]:
    """No garbage collection in this process during a run; what the run left is collected
    after it. The one load process plays N daemons, so its collector walks all N daemons'
    objects: at N=1000 a full collection stopped it for 80-760 ms at a time, a third of the
    storm's wall time and each outlier of the lone messages (a daemon holds 1/N of them)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


async def amain(args: argparse.Namespace) -> int:
    # N links' lines would be most of this process's work.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    root = Path(tempfile.mkdtemp(prefix="tm-members-", dir="/tmp"))
    nats_server = None if args.no_jetstream else start_sync_always_nats(root, "default")
    try:
        for n in (int(x) for x in args.members.split(",")):
            print(f"--- N = {n} members, one topic all subscribe to;"
                  f" {args.lone} lone messages, a {args.burst}-message burst")
            with _no_collector():
                r = await run_tidemesh(args.store, n, args, root)
            _report(f"tidemesh broker on {args.store}", n, r)
            if nats_server is not None:
                with _no_collector():
                    js = await run_jetstream(nats_server[0].pid, nats_server[1], n, args)
                _report(f"JetStream, {n} durable consumers on one stream", n, js)
            sys.stdout.flush()
    finally:
        if nats_server is not None:
            nats_server[0].terminate()
            nats_server[0].wait(10)
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--sender-child"]:
        return asyncio.run(_sender_child(*sys.argv[2:5]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="50,200,500,1000")
    ap.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    ap.add_argument("--pg-dsn", default=PG_DSN)
    ap.add_argument("--lone", type=int, default=20)
    ap.add_argument("--lone-gap-ms", type=float, default=0.0,
                    help="wait this long after each lone message is all acked before the next")
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--idle-s", type=float, default=25.0,
                    help="long enough for one round of the members' keepalive pings (20 s)")
    ap.add_argument("--presence", choices=("feed", "on-demand"), default="feed",
                    help="on-demand: each member as a daemon with presence.feed false (no "
                         "presence sent to it; it asks peers when it needs them)")
    ap.add_argument("--no-jetstream", action="store_true")
    ap.add_argument("--trim-probe", action="store_true",
                    help="after the burst, have the broker call malloc_trim(0) and show "
                         "its RSS again: is what it keeps free memory or live objects?")
    ap.add_argument("--again", type=int, default=0, metavar="K",
                    help="K more bursts after the first, and the broker's RSS after each")
    ap.add_argument("--broker-arg", action="append", default=[],
                    help="passed to `tidemesh broker up` (repeatable)")
    args = ap.parse_args()
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
