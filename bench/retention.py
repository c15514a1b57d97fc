"""bench/retention: accept latency while a retention sweep deletes a million outbox rows.

A daemon's outbox is filled with N old `done` rows (years past every cutoff). Then the same
load as bench/accept (64 connections over the Unix socket) runs twice: once with no sweep
(the baseline), once while the sweep deletes the old rows in its small transactions. Prints
sends/s, p50 and p99 of both, how many old rows the sweep deleted in the window, and how
long the whole sweep took.

    .venv/bin/python bench/retention.py [--rows 1000000] [--seconds 20] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADGEN = str(Path(__file__).with_name("loadgen.py"))
OLD = 1_600_000_000_000


def _fill(db: Path, rows: int) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, dest_kind,"
            " dest_ref, enqueued_at, next_attempt_at, status, delivered_at, broker_message_id)"
            " VALUES (?, ?, zeroblob(32), ?, 'topic', 'ops', ?, ?, 'done', ?, 'b')",
            ((f"OLD{i:010d}", f"old-{i}", b"p" * 200, OLD + i, OLD + i, OLD + i)
             for i in range(rows)))
        conn.execute("INSERT INTO outbox_meta (key, value, updated_at) VALUES"
                     " ('max_age_ms', 259200000, 0) ON CONFLICT (key) DO NOTHING")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _old_rows(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM outbox WHERE id LIKE 'OLD%'"
                                ).fetchone()[0])
    finally:
        conn.close()


def _start(home: Path, interval: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_LEVEL": "info",
           "TIDEMESH_LOG_FORMAT": "json", "TIDEMESH_RETENTION_SWEEP_INTERVAL_S": interval,
           "TIDEMESH_IPC_RATE_PER_S": "0"}
    log = open(home / "daemon.out", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground",
                             "--mesh", "ret", "--no-tcp"], env=env, stdout=log, stderr=log)
    sock = home / "daemon" / "ret" / "sock"
    for _ in range(400):
        if sock.exists():
            time.sleep(0.3)
            return proc
        time.sleep(0.05)
    raise SystemExit("daemon did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def _load(sock: Path, conc: int, seconds: float, tag: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, LOADGEN, str(sock), str(conc), str(seconds), "1",
                          tag], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tm-bench-", dir="/tmp"))
    db = home / "daemon" / "ret" / "outbox.db"
    sock = home / "daemon" / "ret" / "sock"
    _stop(_start(home, "86400"))
    t = time.monotonic()
    _fill(db, args.rows)
    print(f"bench/retention: {args.rows} old done rows written in {time.monotonic() - t:.1f} s; "
          f"{args.concurrency} connections, {args.seconds:.0f} s per run")
    daemon = _start(home, "86400")
    base = _load(sock, args.concurrency, args.seconds, "base")
    _stop(daemon)
    daemon = _start(home, "1")          # the first sweep starts a second after start-up
    started = time.monotonic()
    during = _load(sock, args.concurrency, args.seconds, "sweep")
    left = _old_rows(db)
    while _old_rows(db) and time.monotonic() - started < 1800:
        time.sleep(0.5)
    swept_s = time.monotonic() - started - 1.0
    _stop(daemon)
    print(f"{'run':14} {'sends/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}")
    for name, r in (("no sweep", base), ("during sweep", during)):
        print(f"{name:14} {r['rps']:>9.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
              f"{r['errors']:>6.0f}")
    print(f"old rows deleted during the loaded window: {args.rows - left}; whole sweep "
          f"{swept_s:.1f} s ({args.rows / max(swept_s, 0.001):.0f} rows/s); data in {home}")


if __name__ == "__main__":
    main()
