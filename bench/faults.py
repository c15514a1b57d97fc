"""Long fault-injection runs by hand, e.g. ``python bench/faults.py --sends 20000 --faults 200``.

Runs the harness of ``tests/faults`` (a broker on a private PostgreSQL cluster, three daemons
behind a controllable proxy, sending and consuming programs, seeded faults), prints the
checker's table and exits 1 unless nothing was lost, duplicated or orphaned. The same seed and
numbers replay the same sends and the same faults at the same points of progress.
``--brokers 3`` runs three brokers on the one database, each behind its own proxy; the daemons
start spread over them and fail over when a broker dies or its link is cut.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.harness import FaultRun, RunConfig
from tests.faults.workload import make_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sends", type=int, default=20000)
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--brokers", type=int, default=1, help="brokers on the one database")
    ap.add_argument("--daemons", type=int, default=3, help="hosts, one daemon each")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight per program")
    ap.add_argument("--max-stall", type=float, default=3.0,
                    help="longest WebSocket stall, s (over 40 outlasts the daemon's "
                         "keepalive, over 60 the broker's server.idle_timeout_s)")
    ap.add_argument("--settle-timeout", type=float, default=600.0)
    ap.add_argument("--no-audit", action="store_true", help="skip the Spark orphan audit")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run's folder (logs, stores) even when the run is clean")
    ap.add_argument("--budget", default=None, metavar="RATE,BURST",
                    help="give the mesh a send budget (429s and the gate under faults)")
    args = ap.parse_args()
    budget = None
    if args.budget:
        rate, burst = args.budget.split(",")
        budget = (float(rate), int(burst))
    root = Path(tempfile.mkdtemp(prefix="tm-faults-", dir="/tmp"))
    ok = False
    try:
        plan = make_plan(args.seed, args.sends, args.faults, max_stall=args.max_stall,
                         daemons=args.daemons, brokers=args.brokers)
        run = FaultRun(RunConfig(plan, root, args.concurrency, args.settle_timeout,
                                 not args.no_audit, brokers=args.brokers, budget=budget))
        report = asyncio.run(run.run())
        print(report.table())
        ok = report.ok
        return 0 if ok else 1
    finally:
        # A failed run's logs are the only account of what went wrong: never delete them.
        if args.keep or not ok:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
