"""The fault-injection harness: a broker on a private PostgreSQL, three daemons behind a proxy
the harness controls, local programs sending and consuming, and faults at seeded moments.
With ``brokers`` > 1, that many brokers serve the one database, each behind its own proxy, and
every daemon knows all of them, starting at a different one, so a broker fault makes its
daemons fail over.

``FaultRun(config).run()`` sets everything up, plays a ``workload.Plan``, heals the system,
waits for it to settle, and hands every store to ``checker.check``. ``tests/faults`` runs a
bounded plan in CI; ``bench/faults.py`` runs long ones by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemon.harness import (
    RunningDaemon,
    daemon_env,
    dump_stacks,
    run_cli,
    start_daemon,
)
from tests.e2e.harness import Broker, wait_for
from tests.faults.checker import ACCEPTED, Ledger, Report, SendResult, Stores, check, recipients
from tests.faults.pgcluster import PgCluster
from tests.faults.proxy import FaultProxy
from tests.faults.workload import BROKER_FAULTS, TOPIC, FaultKind, FaultOp, Plan, Reuse, SendOp
from tidemesh.client import Client, DaemonNotRunning
from tidemesh.core.errors import TidemeshError

REPO = Path(__file__).resolve().parents[2]
MESH = "m"
# Fast reconnects keep a run short; the backoff shape itself is tested elsewhere.
DAEMON_ENV = {"TIDEMESH_RECONNECT_INITIAL_BACKOFF_MS": "100",
              "TIDEMESH_RECONNECT_MAX_BACKOFF_MS": "1000"}
RETRY_STATUSES = {429, 503, 507}
GRACE_S = 10.0   # the daemons' shutdown.grace_s (the default)
# A planned stop may take its grace plus this (the CLI's own start, the process's exit).
STOP_SLACK_S = 3.0


@dataclass
class RunConfig:
    plan: Plan
    root: Path
    concurrency: int = 8  # requests in flight per sending program
    settle_timeout: float = 180.0
    audit: bool = True
    brokers: int = 1  # brokers on the one PostgreSQL database, each behind its own proxy
    # The mesh's send budget (rate per s, burst), set as an operator would; None: no budget.
    budget: tuple[float, int] | None = None
    # Runs with the stores still up, after the check (the checker's own tests use it).
    after_check: Callable[[Ledger, Stores], Awaitable[None]] | None = None
    # After each fault, every daemon must answer within this (the soak); None: not checked.
    answer_within: float | None = None


@dataclass
class Node:
    """One host: its daemon, its consuming program, and what its SSE reader saw."""

    label: str
    daemon: RunningDaemon
    pubkey: str
    consumer: subprocess.Popen[bytes] | None = None
    sse: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    sse_repeats: int = 0
    sse_last: int = 0
    restarting: bool = False  # set while a kill -9 fault has it down on purpose

    @property
    def outcomes(self) -> Path:
        return self.daemon.home / "outcomes.db"

    @property
    def crash_flag(self) -> Path:
        return self.daemon.home / "crash-before-ack"


class FaultRun:
    def __init__(self, config: RunConfig) -> None:
        self.cfg = config
        self.plan = config.plan
        self.nodes: dict[str, Node] = {}
        self.results: dict[int, SendResult] = {}
        self.done: dict[int, asyncio.Event] = {op.index: asyncio.Event() for op in self.plan.sends}
        self.faults: Counter[str] = Counter()
        self.faults_started = 0
        self.consumer_restarts = 0
        self.crashes: Counter[str] = Counter()  # processes that died without being killed
        self.broker_down: set[int] = set()  # brokers a kill -9 fault has down on purpose
        self.cluster: PgCluster | None = None
        self.brokers: list[Broker] = []
        self.proxies: list[FaultProxy] = []
        self.dsn = ""
        self.hangs: list[str] = []   # stops past their grace, daemons that did not answer

    # -- setup and teardown ----------------------------------------------------------------

    async def _start_broker_side(self) -> None:
        self.cluster = await asyncio.to_thread(PgCluster.create)
        await asyncio.to_thread(self.cluster.start)
        self.dsn = await asyncio.to_thread(self.cluster.create_database, "tidemesh")
        n = self.cfg.brokers
        for i in range(n):
            home = self.cfg.root / ("broker" if n == 1 else f"broker{i}")
            home.mkdir()
            broker = Broker(home, self.dsn)
            if i == 0:  # the mesh lives in the database, which every broker shares
                await asyncio.to_thread(broker.cli, "mesh", "create", "team")
                if self.cfg.budget is not None:
                    rate, burst = self.cfg.budget
                    await asyncio.to_thread(broker.cli, "mesh", "limits", "--mesh", "team",
                                            "--rate", str(rate), "--burst", str(burst))
            await asyncio.to_thread(broker.start)
            proxy = FaultProxy(broker.port)
            await proxy.start()
            self.brokers.append(broker)
            self.proxies.append(proxy)

    async def _join(self, index: int, label: str) -> Node:
        home = self.cfg.root / label
        home.mkdir()
        invite = await asyncio.to_thread(self.brokers[0].invite, "team")
        # Daemon i tries broker i first, so the daemons spread over the brokers.
        start = index % len(self.proxies)
        urls = [f"ws://127.0.0.1:{p.port}" for p in self.proxies[start:] + self.proxies[:start]]
        res = await asyncio.to_thread(
            run_cli, home, "daemon", "join", invite, "--mesh", MESH, "--name", label,
            *(arg for url in urls for arg in ("--broker-url", url)))
        assert res.returncode == 0, res.stderr + res.stdout
        d = await asyncio.to_thread(start_daemon, home, MESH, DAEMON_ENV)
        key = str(json.loads(d.paths.keypair.read_text())["ed25519_public"])
        return Node(label, d, key)

    async def setup(self) -> None:
        await self._start_broker_side()
        for i, label in enumerate(self.plan.labels):
            self.nodes[label] = await self._join(i, label)
        for node in self.nodes.values():
            await wait_for(lambda n=node: _connected(n.daemon), 60)  # type: ignore[misc]
            async with node.daemon.session() as s, s.post(
                    "/v1/topics/subscribe", json={"name": TOPIC, "create": True}) as r:
                assert r.status == 200, await r.text()

    async def teardown(self) -> None:
        for node in self.nodes.values():
            if node.consumer is not None and node.consumer.poll() is None:
                node.consumer.kill()
                node.consumer.wait()
            # The stores were already read; a clean shutdown is tested elsewhere.
            node.daemon.kill()
        for broker in self.brokers:
            broker.kill()
        for proxy in self.proxies:
            await proxy.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.destroy)

    # -- local programs --------------------------------------------------------------------

    def _start_consumer(self, node: Node) -> None:
        with open(node.daemon.home / "consumer.out", "ab") as log:  # the child keeps a copy
            node.consumer = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.consumer", str(node.daemon.paths.socket),
                 str(node.outcomes), "proc", str(node.crash_flag)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                env=daemon_env(node.daemon.home))

    async def _supervise(self) -> None:
        """Restart whatever died, as a service manager would; a daemon or broker that died
        without being killed is counted as a crash (the checker fails the run on it)."""
        while True:
            try:
                await self._restart_the_dead()
            except Exception as exc:  # a restart that fails is counted and retried
                self.crashes[f"restart failed: {exc!r}"[:120]] += 1
            await asyncio.sleep(0.1)

    async def _restart_the_dead(self) -> None:
        for node in self.nodes.values():
            if node.consumer is None or node.consumer.poll() is not None:
                if node.consumer is not None:
                    self.consumer_restarts += 1
                self._start_consumer(node)
            if not node.restarting and node.daemon.proc.poll() is not None:
                self.crashes[f"daemon {node.label}"] += 1
                node.restarting = True
                try:
                    node.daemon = await asyncio.to_thread(start_daemon, node.daemon.home,
                                                          MESH, DAEMON_ENV)
                finally:
                    node.restarting = False
        for i, broker in enumerate(self.brokers):
            assert broker.proc is not None
            if i not in self.broker_down and broker.proc.poll() is not None:
                self.crashes["broker" if len(self.brokers) == 1 else f"broker {i}"] += 1
                await asyncio.to_thread(broker.start)

    async def _follow_events(self, node: Node) -> None:
        """An SSE program that resumes with Last-Event-ID whenever its stream breaks."""
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                await self._read_stream(node)
            await asyncio.sleep(0.1)

    async def _read_stream(self, node: Node) -> None:
        """Read one stream until it breaks; the last id seen lives on the node, so a stream
        that breaks mid-way resumes right after what was already recorded."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        conn = aiohttp.UnixConnector(path=str(node.daemon.paths.socket))
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s, s.get(
                "http://localhost/v1/events",
                headers={"Last-Event-ID": str(node.sse_last)}) as r:
            if r.status != 200:
                return
            ev_id, ev_type = 0, ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("id: "):
                    ev_id = int(line[4:])
                elif line.startswith("event: "):
                    ev_type = line[7:]
                elif line.startswith("data: "):
                    if ev_id <= node.sse_last:
                        node.sse_repeats += 1
                    else:
                        node.sse.append((ev_id, ev_type, json.loads(line[6:])))
                        node.sse_last = ev_id

    async def _send_one(self, s: aiohttp.ClientSession, op: SendOp) -> SendResult:
        to = (f"topic:{op.dest_ref}" if op.dest_kind == "topic"
              else f"dm:{self.nodes[op.dest_ref].pubkey}")
        attempts = 0
        while True:
            attempts += 1
            try:
                async with s.post("/v1/send", json={"to": to, "body": op.body},
                                  headers={"Idempotency-Key": op.key}) as r:
                    body = await r.json(content_type=None)
                    if r.status not in RETRY_STATUSES:
                        return SendResult(op, r.status, body, attempts)
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # the daemon died under us: retry with the same key, as a program must
            await asyncio.sleep(0.1)

    async def _sender(self, label: str, ops: list[SendOp]) -> None:
        node = self.nodes[label]
        queue: asyncio.Queue[SendOp] = asyncio.Queue()
        for op in ops:
            queue.put_nowait(op)

        async def worker() -> None:
            conn = aiohttp.UnixConnector(path=str(node.daemon.paths.socket), force_close=True)
            async with aiohttp.ClientSession(base_url="http://localhost", connector=conn) as s:
                while not queue.empty():
                    while self._fault_due():
                        await asyncio.sleep(0.01)
                    try:
                        op = queue.get_nowait()
                    except asyncio.QueueEmpty:  # another worker took the last one meanwhile
                        break
                    if op.original is not None:
                        await self.done[op.original].wait()
                    self.results[op.index] = await self._send_one(s, op)
                    self.done[op.index].set()

        await asyncio.gather(*(worker() for _ in range(self.cfg.concurrency)))

    # -- faults ----------------------------------------------------------------------------

    async def _inject(self, fault: FaultOp) -> None:
        assert self.cluster is not None
        self.faults[fault.kind] += 1
        # With one broker these faults carry no target: they hit the only one.
        which = int(fault.target) if fault.kind in BROKER_FAULTS and fault.target else 0
        if fault.kind is FaultKind.DAEMON_KILL9:
            node = self.nodes[fault.target]
            while node.restarting:  # the supervisor is restarting it after a crash
                await asyncio.sleep(0.05)
            node.restarting = True
            node.daemon.kill()
            await asyncio.sleep(fault.pause)
            node.daemon = await asyncio.to_thread(start_daemon, node.daemon.home, MESH,
                                                  DAEMON_ENV)
            node.restarting = False
        elif fault.kind is FaultKind.BROKER_KILL9:
            self.broker_down.add(which)
            self.brokers[which].kill()
            await asyncio.sleep(fault.pause)
            await asyncio.to_thread(self.brokers[which].start)
            self.broker_down.discard(which)
        elif fault.kind is FaultKind.PG_RESTART:
            await asyncio.to_thread(self.cluster.restart, fault.target or "fast")
        elif fault.kind is FaultKind.WS_CUT:
            self.proxies[which].cut()
        elif fault.kind is FaultKind.WS_STALL:
            await self.proxies[which].stall(fault.pause)
        elif fault.kind is FaultKind.CONSUMER_CRASH:
            self.nodes[fault.target].crash_flag.touch()
        elif fault.kind in (FaultKind.DAEMON_DOWN_UP, FaultKind.DAEMON_SIGTERM):
            await self._stop_and_start(self.nodes[fault.target], fault)
        elif fault.kind is FaultKind.BROKER_SIGSTOP:
            proc = self.brokers[which].proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.pause)
            finally:
                proc.send_signal(signal.SIGCONT)

    async def _stop_and_start(self, node: Node, fault: FaultOp) -> None:
        """A planned stop (the CLI's ``daemon down``, or SIGTERM as a service manager sends
        it) must end within the daemon's grace; then the daemon starts again."""
        while node.restarting:
            await asyncio.sleep(0.05)
        node.restarting = True
        try:
            d = node.daemon
            began = time.monotonic()
            if fault.kind is FaultKind.DAEMON_DOWN_UP:
                res = await asyncio.to_thread(run_cli, d.home, "daemon", "down", "--mesh", MESH)
                said = (res.stdout + res.stderr).strip()
                if res.returncode != 0 or "SIGKILL" in said:
                    self.hangs.append(f"daemon down of {node.label}: {said[-300:]}")
                code = await asyncio.to_thread(d.proc.wait, 30)
            else:
                d.proc.send_signal(signal.SIGTERM)
                try:
                    code = await asyncio.to_thread(d.proc.wait, GRACE_S + 10)
                except subprocess.TimeoutExpired:
                    self.hangs.append(f"SIGTERM of {node.label}: still running after "
                                      f"{GRACE_S + 10:.0f} s")
                    d.kill()
                    code = -9
            took = time.monotonic() - began
            if took > GRACE_S + STOP_SLACK_S:
                self.hangs.append(f"{fault.kind} of {node.label} took {took:.1f} s "
                                  f"(grace {GRACE_S:.0f} s), exit {code}")
            await asyncio.sleep(fault.pause)
            node.daemon = await asyncio.to_thread(start_daemon, d.home, MESH, DAEMON_ENV)
        finally:
            node.restarting = False

    async def _check_answering(self, within: float, after: FaultOp) -> None:
        """Every daemon answers ``/v1/version`` within ``within`` seconds; one that does
        not is a hang, with its threads' stacks (py-spy) kept beside its log."""
        for node in self.nodes.values():
            while node.restarting:
                await asyncio.sleep(0.05)
            d = node.daemon
            if d.proc.poll() is not None:
                continue   # a crash: the supervisor counts and restarts it
            try:
                await asyncio.to_thread(Client(d.paths.socket, timeout=within).version)
            except (DaemonNotRunning, TidemeshError) as exc:
                stacks = await asyncio.to_thread(
                    dump_stacks, d.proc.pid, d.home / f"hang-{len(self.hangs)}.txt")
                self.hangs.append(f"daemon {node.label} did not answer within {within:.0f} s "
                                  f"after {after.kind}: {exc}; {stacks[:200]}")

    def _fault_due(self) -> bool:
        """A fault is due but not started yet: new sends wait for it. Faults take seconds
        (restarts) and sends milliseconds, so without this the plan's faults would fall ever
        further behind the traffic and end up hitting an idle system."""
        faults = self.plan.faults
        return (self.faults_started < len(faults)
                and faults[self.faults_started].at_answered <= len(self.results))

    async def _faults(self) -> None:
        for fault in self.plan.faults:
            while len(self.results) < fault.at_answered:
                await asyncio.sleep(0.01)
            self.faults_started += 1  # sends go on while this fault plays out
            await self._inject(fault)
            if self.cfg.answer_within is not None:
                await self._check_answering(self.cfg.answer_within, fault)

    # -- the run ---------------------------------------------------------------------------

    def _settled(self, expected: dict[str, int]) -> bool:
        for node in self.nodes.values():
            statuses = {r["status"] for r in node.daemon.outbox_rows()}
            if statuses & {"pending", "inflight"}:
                return False
            inbox = _count(node.daemon.paths.inbox_db, "SELECT COUNT(*), MAX(seq) FROM inbox")
            if inbox[0] < expected[node.label]:
                return False
            messages = sum(1 for _, t, _ in node.sse if t == "message")
            if messages < inbox[0] or not node.outcomes.exists():
                return False
            if _count(node.outcomes, "SELECT last_seq, 0 FROM state")[0] < (inbox[1] or 0):
                return False
        return True

    def _expected_deliveries(self) -> dict[str, int]:
        expected = dict.fromkeys(self.plan.labels, 0)
        for res in self.results.values():
            if res.status in ACCEPTED and res.op.reuse is Reuse.NONE:
                for label in recipients(res.op, self.plan.labels):
                    expected[label] += 1
        return expected

    async def run(self) -> Report:
        started = time.monotonic()
        background: list[asyncio.Task[None]] = []
        try:
            await self.setup()
            background = [asyncio.create_task(self._supervise()),
                          *(asyncio.create_task(self._follow_events(n))
                            for n in self.nodes.values())]
            by_sender = {label: [op for op in self.plan.sends if op.sender == label]
                         for label in self.plan.labels}
            await asyncio.gather(self._faults(),
                                 *(self._sender(lbl, ops) for lbl, ops in by_sender.items()))
            sent_at = time.monotonic()
            expected = self._expected_deliveries()
            try:
                await wait_for(lambda: self._settled(expected), self.cfg.settle_timeout, 0.2)
            except AssertionError:
                await self._describe_unsettled()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            report = await check(self._ledger(), self._stores(), audit=self.cfg.audit)
            if self.cfg.after_check is not None:
                await self.cfg.after_check(self._ledger(), self._stores())
            report.brokers = len(self.brokers)
            for hang in self.hangs:
                report.problem("hang", hang)
            report.failovers = sum(n.daemon.log.read_text().count('"broker_failed_over"')
                                   for n in self.nodes.values())
            report.timings = {"send_s": sent_at - started,
                              "settle_s": time.monotonic() - sent_at}
            return report
        finally:
            for task in background:
                task.cancel()
            await self.teardown()

    async def _describe_unsettled(self) -> None:
        """What a run that did not settle leaves to read (the checker then counts the rows):
        each daemon's health and the end of its log, on stdout, which pytest shows with the
        failure. The run's folder is gone by the time anyone looks."""
        for node in self.nodes.values():
            try:
                async with node.daemon.session() as s, s.get("/v1/health") as r:
                    health = await r.text()
            except (aiohttp.ClientError, OSError) as exc:
                health = f"(no answer: {exc!r})"
            rows = node.daemon.outbox_rows()
            statuses = Counter(r["status"] for r in rows)
            now_ms = int(time.time() * 1000)
            waiting = [f"  {r['client_message_id']} {r['status']} attempts={r['attempts']} "
                       f"due_in_ms={r['next_attempt_at'] - now_ms} error={r['last_error']!r}"
                       for r in rows if r["status"] in ("pending", "inflight")]
            try:
                async with node.daemon.session() as s, s.get("/v1/metrics") as r:
                    sends = [line for line in (await r.text()).splitlines()
                             if line.startswith(("cm_daemon_send_total",
                                                 "cm_daemon_reconnects_total"))]
            except (aiohttp.ClientError, OSError) as exc:
                sends = [f"(no metrics: {exc!r})"]
            # Where each of its tasks waits (SIGUSR1 logs them: core/watchdog.log_tasks).
            if node.daemon.proc.poll() is None:
                node.daemon.proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(0.5)
            lines = node.daemon.log.read_text(errors="replace").splitlines()
            tasks = [line for line in lines if '"task_waiting"' in line]
            tail = [line for line in lines if '"task_waiting"' not in line][-40:]
            print(f"--- daemon {node.label} did not settle: outbox {dict(statuses)}\n"
                  f"health: {health}\nrows waiting:\n" + "\n".join(waiting)
                  + "\nmetrics:\n" + "\n".join(sends) + "\nlog tail:\n" + "\n".join(tail)
                  + "\ntasks:\n" + "\n".join(tasks))

    def _ledger(self) -> Ledger:
        return Ledger(seed=self.plan.seed, results=[self.results[i] for i in sorted(self.results)],
                      faults=dict(self.faults), consumer_restarts=self.consumer_restarts,
                      crashes=dict(self.crashes),
                      pubkeys={n.label: n.pubkey for n in self.nodes.values()})

    def _stores(self) -> Stores:
        return Stores(
            outbox={n.label: n.daemon.paths.outbox_db for n in self.nodes.values()},
            inbox={n.label: n.daemon.paths.inbox_db for n in self.nodes.values()},
            outcomes={n.label: n.outcomes for n in self.nodes.values()},
            sse={n.label: n.sse for n in self.nodes.values()},
            sse_repeats={n.label: n.sse_repeats for n in self.nodes.values()},
            broker_dsn=self.dsn, audit_out=self.cfg.root / "audit")


def _count(db: Path, sql: str) -> tuple[int, int]:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA busy_timeout = 5000")
    try:
        row = conn.execute(sql).fetchone() or (0, 0)
        return int(row[0] or 0), int(row[1] or 0)
    except sqlite3.OperationalError:
        return 0, 0  # a consumer still creating its tables
    finally:
        conn.close()


async def _connected(d: RunningDaemon) -> bool:
    try:
        async with d.session() as s, s.get("/v1/health") as r:
            return bool((await r.json())["connected"])
    except (aiohttp.ClientError, OSError):
        return False
