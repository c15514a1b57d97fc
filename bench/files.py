"""bench/files: one shared file (100 MiB by default) from alice's daemon to bob's through a
real broker, on SQLite and on PostgreSQL: MB/s of the upload (``file share``: hash, chunks
into the broker's store, announcement) and of the download (``file get``: chunks out of the
store, hash verified, fsync, rename), and the peak RSS of each of the three processes while
the file moves (sampled from /proc every 20 ms: VmHWM of a process is its peak since start,
so each process's peak before the transfer is printed too).

    .venv/bin/python bench/files.py [--mib 100] [--stores sqlite,postgres] [--pg-dsn DSN]
                                    [--dm] [--chunk-kib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tidemesh.client import Client
from tidemesh.core.errors import TidemeshError


def _tm(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         text=True, env={**os.environ, "TIDEMESH_HOME": str(home)}, check=True)
    return res.stdout.strip()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class PeakRss:
    """The highest VmRSS each process reaches while ``with`` runs."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self.before = {n: _rss_kib(p) for n, p in pids.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], _rss_kib(pid))
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _wait(check: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise SystemExit("bench/files: timed out waiting")


def run(store: str, root: Path, mib: int, dm: bool, chunk_kib: int) -> dict[str, Any]:
    homes = {n: root / n for n in ("broker", "alice", "bob")}
    for h in homes.values():
        h.mkdir(parents=True)
    env = {**os.environ, "TIDEMESH_LOG_LEVEL": "warning", "TIDEMESH_IPC_RATE_PER_S": "0",
           "TIDEMESH_FILES_CHUNK_BYTES": str(chunk_kib * 1024)}
    port = _port()
    _tm(homes["broker"], "broker", "mesh", "create", "bench", "--store", store)
    broker = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "broker", "up", "--store", store, "--listen",
         f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**env, "TIDEMESH_HOME": str(homes["broker"])})
    assert broker.stdout is not None
    broker.stdout.readline()
    procs = {"broker": broker}
    try:
        for n in ("alice", "bob"):
            inv = _tm(homes["broker"], "broker", "invite", "create", "--mesh", "bench", "--url",
                      f"ws://127.0.0.1:{port}", "--store", store)
            _tm(homes[n], "daemon", "join", inv, "--mesh", "bench")
            procs[n] = subprocess.Popen(
                [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh",
                 "bench", "--no-tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**env, "TIDEMESH_HOME": str(homes[n])})
        alice = Client(homes["alice"] / "daemon" / "bench" / "sock", timeout=30)
        bob = Client(homes["bob"] / "daemon" / "bench" / "sock", timeout=30)
        _wait(lambda: _connected(alice) and _connected(bob))
        bob.membership("topic", "subscribe", "bench", create=True)
        src = root / "payload.bin"
        with src.open("wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        to = f"dm:{bob.health()['member_pubkey']}" if dm else "topic:bench"
        pids = {n: p.pid for n, p in procs.items()}
        with PeakRss(pids) as rss:
            t0 = time.monotonic()
            shared = alice.file_share(src, to)
            t1 = time.monotonic()
            fid = shared["file"]["id"]
            _wait(lambda: any(f["id"] == fid for f in bob.file_list()["files"]))
            t2 = time.monotonic()
            bob.file_get(fid, root / "received.bin")
            t3 = time.monotonic()
        same = _sha(src) == _sha(root / "received.bin")
        size = mib * (1 << 20)
        return {"upload_mb_s": size / 1e6 / (t1 - t0), "download_mb_s": size / 1e6 / (t3 - t2),
                "end_to_end_s": t3 - t0, "identical": same, "rss_before_mib": _mib(rss.before),
                "rss_peak_mib": _mib(rss.peak)}
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(60)


def _mib(kib: dict[str, int]) -> dict[str, float]:
    return {k: round(v / 1024, 1) for k, v in kib.items()}


def _connected(c: Client) -> bool:
    try:
        return bool(c.health()["connected"])
    except TidemeshError:   # not up yet
        return False


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


async def _pg(dsn: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--dm", action="store_true", help="share to bob as a DM (sealed chunks)")
    ap.add_argument("--chunk-kib", type=int, default=256)
    args = ap.parse_args()
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix="tm-files-", dir="/tmp") as tmp:
            root = Path(tmp)
            if kind == "sqlite":
                store = f"sqlite://{root}/broker/broker.db"
            else:
                name = "tm_bench_" + secrets.token_hex(4)
                asyncio.run(_pg(args.pg_dsn, f'CREATE DATABASE "{name}"'))
                store = args.pg_dsn.rsplit("/", 1)[0] + "/" + name
            try:
                r = run(store, root, args.mib, args.dm, args.chunk_kib)
            finally:
                if kind != "sqlite":
                    asyncio.run(_pg(args.pg_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            print(f"{kind}: {args.mib} MiB {'dm (sealed)' if args.dm else 'topic'}, chunk "
                  f"{args.chunk_kib} KiB: upload {r['upload_mb_s']:.1f} MB/s, download "
                  f"{r['download_mb_s']:.1f} MB/s, end to end {r['end_to_end_s']:.1f} s, "
                  f"identical {r['identical']}")
            print(f"  RSS MiB before: {r['rss_before_mib']}  peak while moving: "
                  f"{r['rss_peak_mib']}")


if __name__ == "__main__":
    main()
