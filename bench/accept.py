"""bench/accept: POST /v1/send over the daemon's Unix socket at concurrency 1, 16 and 64,
then POST /v1/send_batch (100 sends per request).

Durable (synchronous=FULL, each answer after its group commit). In the same run, a trivial
aiohttp handler on the same kind of socket (uvloop, orjson, no storage) gives the ceiling in
requests/s at each concurrency. The load generator is a separate process with raw keep-alive
HTTP/1.1 connections, so the client's CPU does not share the server's event loop. Prints
sends/s (for a batch: messages/s), requests/s, p50 and p99 per request, the ratio of sends/s
to the ceiling's requests/s, and the daemon's CPU per send (user + system, all its threads,
from /proc, over the whole load including the warm-up).

    .venv/bin/python bench/accept.py [--seconds 8] [--concurrency 1,16,64]
                                     [--batch 100] [--batch-concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proc_cpu import cpu_seconds


# ---------------------------------------------------------------- trivial server (child)
def _trivial(path: str) -> None:
    import orjson
    import uvloop
    from aiohttp import web

    async def send(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        body = {"client_message_id": request.headers.get("Idempotency-Key"),
                "outbox_id": "x", "status": "queued", "n": len(data)}
        return web.Response(body=orjson.dumps(body), status=202, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/send", send)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, path).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        await runner.cleanup()

    uvloop.run(main())


# ---------------------------------------------------------------- orchestration (parent)
def _child(*args: str) -> list[str]:
    return [sys.executable, __file__, *args]


LOADGEN = str(Path(__file__).with_name("loadgen.py"))


def _run_load(sock: Path, conc: int, seconds: float, warmup: float, tag: str,
              batch: int = 0) -> dict[str, float]:
    out = subprocess.run([sys.executable, LOADGEN, str(sock), str(conc), str(seconds),
                          str(warmup), tag, "bench", str(batch)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _wait_socket(sock: Path, proc: subprocess.Popen[bytes]) -> None:
    import socket

    for _ in range(400):
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("server did not start")


def _outbox_rows(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    finally:
        conn.close()


def _trivial_cell(home: Path, conc: int, args: argparse.Namespace) -> dict[str, float]:
    sock = home / "trivial.sock"
    triv = subprocess.Popen(_child("--trivial", str(sock)), stdout=subprocess.PIPE)
    try:
        _wait_socket(sock, triv)
        return _run_load(sock, conc, args.seconds, args.warmup, f"t{conc}")
    finally:
        triv.send_signal(signal.SIGTERM)
        triv.wait()


def _daemon_cell(home: Path, mesh: str, conc: int, batch: int, args: argparse.Namespace
                 ) -> dict[str, float]:
    # The bench measures the accept path, not the per-token request budget: off.
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_LEVEL": "warning",
           "TIDEMESH_LOG_FORMAT": "json", "TIDEMESH_IPC_RATE_PER_S": "0"}
    with open(home / "daemon.out", "ab") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", mesh,
             "--no-tcp"], env=env, stdout=log, stderr=log)
    sock = home / "daemon" / mesh / "sock"
    try:
        _wait_socket(sock, daemon)
        time.sleep(0.3)
        cpu = cpu_seconds(daemon.pid)
        r = _run_load(sock, conc, args.seconds, args.warmup, mesh, batch)
        r["cpu_us"] = 1e6 * (cpu_seconds(daemon.pid) - cpu) / max(r["all_ok"], 1)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
    r["rows"] = _outbox_rows(home / "daemon" / mesh / "outbox.db")
    return r


def _line(server: str, conc: int, r: dict[str, float], ceiling: float) -> None:
    cpu = f"{r['cpu_us']:>11.0f}" if "cpu_us" in r else ""
    print(f"{server:9} {conc:>4} {r['mps']:>9.0f} {r['rps']:>8.0f} {r['p50_ms']:>7.2f} "
          f"{r['p99_ms']:>7.2f} {r['errors']:>6.0f} {r['mps'] / ceiling:>10.0%} {cpu}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", default="1,16,64",
                    help="levels of single sends, comma-separated ('' for none)")
    ap.add_argument("--batch", type=int, default=100,
                    help="sends per /v1/send_batch request (0: no batch cell)")
    ap.add_argument("--batch-concurrency", type=int, default=4,
                    help="batch requests in flight")
    args = ap.parse_args()
    cells = [(int(c), 0) for c in args.concurrency.split(",") if c]
    if args.batch:
        cells.append((args.batch_concurrency, args.batch))
    home = Path(tempfile.mkdtemp(prefix="tm-bench-", dir="/tmp"))
    print(f"bench/accept: {args.seconds:.0f} s per cell after {args.warmup:.0f} s warm-up; "
          f"durable: synchronous=FULL, one answer per committed request")
    print(f"{'server':9} {'conc':>4} {'sends/s':>9} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'errors':>6} {'vs ceiling':>10} {'cpu µs/send':>11}")
    ratios = []
    for conc, batch in cells:
        ceiling = _trivial_cell(home, conc, args)
        r = _daemon_cell(home, f"bench{conc}{'b' if batch else ''}", conc, batch, args)
        _line("trivial", conc, ceiling, ceiling["rps"])
        _line(f"batch{batch}" if batch else "daemon", conc, r, ceiling["rps"])
        ratios.append(r["mps"] / ceiling["rps"])
        print(f"          (daemon outbox rows after the run: {r['rows']:.0f})")
    print(f"median ratio to ceiling: {statistics.median(ratios):.0%}; data in {home}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trivial":
        _trivial(sys.argv[2])
    else:
        main()
