"""Fair load: what one member's flood does to another member's accept latency, with and
without the per-member send budget, on a real broker process per store.

    .venv/bin/python bench/fair_load.py [--seconds 10] [--rate 200] [--burst 200]
        [--steady 100] [--frame 100] [--rounds 3] [--stores sqlite,postgres] [--pg-dsn DSN]

Member ``steady`` sends lone ``send`` frames at ``--steady`` a second (open loop: on a clock,
not waiting for answers); its p99 accept latency (send to answer) is the figure. The flooding
member runs in a process of its own, as another daemon would, so that its frames do not
queue the steady member's answers in the measuring process. Four phases, each ``--seconds``
long, in this order:

* ``quiet``: the steady member alone, budget on (the peer the others are compared with);
* ``flood-unlimited``: a second member floods (``send_batch`` frames of ``--frame``, two in
  flight, as fast as answered) on a broker with no budget;
* ``flood-obeying``: it floods on a broker with ``--rate``/``--burst``, waiting each
  answer's largest ``retry_after_ms`` before sending the refused sends again, as a daemon;
* ``flood-ignoring``: it floods with the budget on but sends the refused ones again at once.

The first, second and fourth run ``--rounds`` times in turn on one broker and each phase's
samples are pooled, so that a stall of the machine lands on all of them alike rather than on
one; ``flood-unlimited`` runs once, on a broker without a budget.

Prints, per phase, the steady member's sends and p99/p50, the flooder's accepted sends per
second and its 429s, and the steady p99 as a ratio of ``quiet``'s from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import signal
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from broker_accept import Member, prepare, send_item, start_broker
from nacl.signing import SigningKey

# The flooding member's process, the broker's port, the mesh and the flooder's key.
Flooder = tuple[ProcessPoolExecutor, int, str, SigningKey]


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    flood_accepted: int = 0
    flood_refused: int = 0
    seconds: float = 0.0

    def line(self, quiet_p99: float | None) -> str:
        q = statistics.quantiles(self.latencies, n=100)
        ratio = "" if quiet_p99 is None else f"  p99/quiet={q[98] / quiet_p99:5.2f}"
        flood_rate = self.flood_accepted / self.seconds
        return (f"{self.name:16} steady sends={len(self.latencies):<5} "
                f"p50={q[49] * 1000:7.2f} ms p99={q[98] * 1000:7.2f} ms  "
                f"flood accepted/s={flood_rate:7.0f} refused={self.flood_refused:<7}{ratio}")


async def steady(m: Member, per_s: float, stop_at: float, phase: Phase) -> None:
    """Open loop: a send every 1/per_s seconds, whatever the answers do."""
    tag, n, pending = secrets.token_hex(3), 0, []
    start = time.perf_counter()
    while (now := time.perf_counter()) < stop_at:
        n += 1
        pending.append(asyncio.create_task(_timed(m, f"s-{tag}-{n}", phase)))
        await asyncio.sleep(max(0.0, start + n / per_s - now))
    await asyncio.gather(*pending)


async def _timed(m: Member, cmid: str, phase: Phase) -> None:
    t0 = time.perf_counter()
    answer = await m.call({"type": "send", **send_item(cmid)})
    if answer["status"] != 201:
        raise RuntimeError(f"the steady member was answered {answer}")
    phase.latencies.append(time.perf_counter() - t0)


def flood_process(port: int, mesh_id: str, seed: bytes, frame: int, stop_at: float,
                  obey: bool) -> tuple[int, int]:
    """The flooding member, in a process of its own until ``stop_at`` (wall clock):
    (accepted, refused)."""
    async def run() -> tuple[int, int]:
        m = await Member.connect(port, mesh_id, SigningKey(seed))
        phase = Phase("flood")
        await asyncio.gather(*(flood(m, frame, stop_at, phase, obey) for _ in range(2)))
        await m.close()
        return phase.flood_accepted, phase.flood_refused

    return asyncio.run(run())


async def flood(m: Member, frame: int, stop_at: float, phase: Phase, obey: bool) -> None:
    tag, n = secrets.token_hex(3), 0
    todo: list[dict[str, Any]] = []
    while time.time() < stop_at:
        n += 1
        todo += [send_item(f"f-{tag}-{n}-{i}") for i in range(frame - len(todo))]
        answer = await m.call({"type": "send_batch", "id": f"f-{tag}-{n}", "sends": todo})
        refused = [s for s, r in zip(todo, answer["results"], strict=True) if r["status"] == 429]
        wrong = [r for r in answer["results"] if r["status"] not in (201, 429)]
        if wrong:
            raise RuntimeError(f"the flooder was answered {wrong[0]}")
        phase.flood_accepted += len(todo) - len(refused)
        phase.flood_refused += len(refused)
        # A frame id of its own each time (ids are bounded; a growing suffix would turn 400).
        todo = [{**s, "id": f"{s['client_message_id']}.{n}"} for s in refused]
        waits = [r["retry_after_ms"] for r in answer["results"] if r["status"] == 429]
        if obey and waits:
            await asyncio.sleep(max(waits) / 1000)


async def run_phase(phase: Phase, steady_m: Member, flooder: Flooder | None,
                    args: argparse.Namespace, obey: bool) -> Phase:
    t0 = time.perf_counter()
    flooding = None
    if flooder is not None:
        pool, port, mesh_id, key = flooder
        flooding = asyncio.get_running_loop().run_in_executor(
            pool, flood_process, port, mesh_id, bytes(key), args.frame,
            time.time() + args.seconds, obey)
    await steady(steady_m, args.steady, t0 + args.seconds, phase)
    if flooding is not None:
        accepted, refused = await flooding
        phase.flood_accepted += accepted
        phase.flood_refused += refused
    phase.seconds += time.perf_counter() - t0
    return phase


async def with_broker(url: str, budget: tuple[float, int] | None, mesh_id: str,
                      keys: list[Any], phases: list[tuple[Phase, bool, bool]],
                      args: argparse.Namespace, pool: ProcessPoolExecutor) -> None:
    rate, burst = budget or (0.0, 1)
    os.environ["TIDEMESH_LIMITS_MEMBER_RATE"] = str(rate)
    os.environ["TIDEMESH_LIMITS_MEMBER_BURST"] = str(burst)
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as home:
        proc, port = start_broker(url, home)
        try:
            steady_m = await Member.connect(port, mesh_id, keys[0])
            flooder = (pool, port, mesh_id, keys[1])
            await run_phase(Phase("warmup"), steady_m, None,
                            argparse.Namespace(**{**vars(args), "seconds": 1.0}), True)
            for phase, flooding, obey in phases:
                await run_phase(phase, steady_m, flooder if flooding else None, args, obey)
            await steady_m.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


async def one_store(name: str, url: str, args: argparse.Namespace) -> None:
    mesh_id, keys = await prepare(url, 2)
    quiet, unlimited = Phase("quiet"), Phase("flood-unlimited")
    obeying, ignoring = Phase("flood-obeying"), Phase("flood-ignoring")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(time.time).result()   # started before the first phase, not during it
        await with_broker(url, (args.rate, args.burst), mesh_id, keys,
                          [(quiet, False, True), (obeying, True, True),
                           (ignoring, True, False)] * args.rounds, args, pool)
        await with_broker(url, None, mesh_id, keys, [(unlimited, True, True)], args, pool)
    print(f"{name}: steady {args.steady:.0f}/s; budget {args.rate:.0f}/s burst {args.burst}",
          flush=True)
    quiet_p99 = statistics.quantiles(quiet.latencies, n=100)[98]
    print("  " + quiet.line(None))
    for p in (unlimited, obeying, ignoring):
        print("  " + p.line(quiet_p99), flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=200.0, help="the flooder's budget, sends/s")
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--steady", type=float, default=100.0, help="the other member's sends/s")
    ap.add_argument("--frame", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3,
                    help="quiet, obeying and ignoring phases this many times over, pooled")
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    stores = args.stores.split(",")
    if "sqlite" in stores:
        with tempfile.TemporaryDirectory(prefix="tm-bench-") as d:
            await one_store("sqlite", f"sqlite:///{Path(d) / 'b.db'}", args)
    if "postgres" in stores:
        db = "tm_bench_" + secrets.token_hex(4)
        admin = await asyncpg.connect(args.pg_dsn)
        await admin.execute(f'CREATE DATABASE "{db}"')
        try:
            await one_store("postgres", args.pg_dsn.rsplit("/", 1)[0] + "/" + db, args)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
