"""bench/accept: POST /v1/send over the daemon's Unix socket at concurrency 1, 16 and 64.

Durable (synchronous=FULL, each answer after its group commit). In the same run, a trivial
aiohttp handler on the same kind of socket (uvloop, orjson, no storage) gives the ceiling.
The load generator is a separate process with raw keep-alive HTTP/1.1 connections, so the
client's CPU does not share the server's event loop. Prints sends/s, p50, p99, the ratio to
the ceiling, and the daemon's rows per transaction.

    .venv/bin/python bench/accept.py [--seconds 8] [--concurrency 1,16,64]
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


def _run_load(sock: Path, conc: int, seconds: float, warmup: float, tag: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, LOADGEN, str(sock), str(conc), str(seconds),
                          str(warmup), tag], capture_output=True, text=True, check=True)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", default="1,16,64")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    home = Path(tempfile.mkdtemp(prefix="tm-bench-", dir="/tmp"))
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_LEVEL": "warning",
           "TIDEMESH_LOG_FORMAT": "json"}
    triv_sock = home / "trivial.sock"
    print(f"bench/accept: {args.seconds:.0f} s per cell after {args.warmup:.0f} s warm-up; "
          f"durable: synchronous=FULL, one answer per committed row")
    print(f"{'server':8} {'conc':>4} {'sends/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} "
          f"{'vs ceiling':>10}")
    results: dict[tuple[str, int], dict[str, float]] = {}
    for conc in levels:
        triv = subprocess.Popen(_child("--trivial", str(triv_sock)), stdout=subprocess.PIPE)
        _wait_socket(triv_sock, triv)
        results[("trivial", conc)] = _run_load(triv_sock, conc, args.seconds, args.warmup,
                                               f"t{conc}")
        triv.send_signal(signal.SIGTERM)
        triv.wait()
        with open(home / "daemon.out", "ab") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh",
                 f"bench{conc}", "--no-tcp"], env=env, stdout=log, stderr=log)
        sock = home / "daemon" / f"bench{conc}" / "sock"
        _wait_socket(sock, daemon)
        time.sleep(0.3)
        results[("daemon", conc)] = _run_load(sock, conc, args.seconds, args.warmup, f"d{conc}")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        rows = _outbox_rows(home / "daemon" / f"bench{conc}" / "outbox.db")
        for server in ("trivial", "daemon"):
            r = results[(server, conc)]
            ratio = r["rps"] / results[("trivial", conc)]["rps"]
            print(f"{server:8} {conc:>4} {r['rps']:>9.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
                  f"{r['errors']:>6.0f} {ratio:>9.0%}")
        print(f"         (daemon outbox rows after the run: {rows})")
    ratios = [results[("daemon", c)]["rps"] / results[("trivial", c)]["rps"] for c in levels]
    print(f"median ratio to ceiling: {statistics.median(ratios):.0%}; data in {home}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trivial":
        _trivial(sys.argv[2])
    else:
        main()
