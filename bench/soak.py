"""The restart soak, by hand: ``python bench/soak.py --cycles 500``.

A broker on a private PostgreSQL cluster and three daemons under steady send and receive
traffic (the fault harness of ``tests/faults``), put through ``--cycles`` faults in a fixed
round: ``daemon down`` and up, SIGTERM and start, kill -9, broker kill -9, PostgreSQL
restart, a frozen broker (SIGSTOP), a stalled link. After each cycle every daemon must
answer within ``--answer-within`` seconds, and every planned stop must end within the
daemon's grace. Prints the checker's table (hangs, unplanned exits, lost, duplicated, ...)
and exits 1 unless all of them are 0. A daemon that does not answer has its threads' stacks
(py-spy) kept beside its log, in the run's folder, which a failed run keeps.
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
from tests.faults.workload import make_soak_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sends-per-cycle", type=int, default=40)
    ap.add_argument("--max-stall", type=float, default=3.0,
                    help="longest frozen broker or stalled link, s")
    ap.add_argument("--answer-within", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per program")
    ap.add_argument("--settle-timeout", type=float, default=600.0)
    ap.add_argument("--audit", action="store_true", help="also run the Spark orphan audit")
    ap.add_argument("--keep", action="store_true", help="keep the run's folder when clean")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tm-soak-", dir="/tmp"))
    ok = False
    try:
        plan = make_soak_plan(args.seed, args.cycles, args.sends_per_cycle, args.max_stall)
        run = FaultRun(RunConfig(plan, root, args.concurrency, args.settle_timeout,
                                 args.audit, answer_within=args.answer_within))
        report = asyncio.run(run.run())
        print(report.table())
        ok = report.ok if args.audit else not any(
            report.counts[k] for k in ("lost", "duplicated", "orphaned", "stuck",
                                       "wrong_answer", "out_of_order", "crashed", "hang"))
        print("SOAK", "OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if args.keep or not ok:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
