"""By hand: ``mesh_send`` in session A to the ``notifications/claude/channel`` in session B,
p50/p99 over N messages, one at a time, and B's MCP server's idle RSS and CPU.

Two daemons on one SQLite broker, each session a ``tidemesh mcp`` driven by the official MCP
SDK's stdio client, as tests/agent does (it reuses that harness):

    .venv/bin/python bench/mcp_push.py --messages 200 --idle-s 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.agent.harness import mcp_session
from tests.e2e.harness import Mesh, connected, pubkey, sqlite_broker_with_team, wait_for


def _pid_of(session: str) -> int:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and session.encode() in argv:
                return int(proc.name)
    raise RuntimeError(f"no tidemesh mcp for {session}")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run(n: int, idle_s: float) -> None:
    root = Path(tempfile.mkdtemp(prefix="tm-b-", dir="/tmp"))
    broker = sqlite_broker_with_team(root)
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        a, b = mesh.add("a", root), mesh.add("b", root)
        await wait_for(lambda: connected(a))
        await wait_for(lambda: connected(b))
        async with mcp_session(a, "bench-a") as sa, mcp_session(b, "bench-b") as sb:
            lat = []
            for i in range(n):
                t0 = time.perf_counter()
                await sa.ok("mesh_send", to=f"session:{pubkey(b)}/bench-b", body=f"m{i}")
                await sb.wait_pushed(i + 1)
                lat.append((time.perf_counter() - t0) * 1000)
            q = statistics.quantiles(lat, n=100)
            print(f"mesh_send -> channel notification, {n} messages: "
                  f"p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {max(lat):.1f} ms")
            pid = _pid_of("bench-b")
            c0 = _cpu_s(pid)
            await asyncio.sleep(idle_s)
            cpu = _cpu_s(pid) - c0
            print(f"idle tidemesh mcp: RSS {_rss_mib(pid):.1f} MiB, CPU {cpu:.2f} s over "
                  f"{idle_s:.0f} s ({100 * cpu / idle_s:.2f}%)")
    finally:
        mesh.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200)
    p.add_argument("--idle-s", type=float, default=10.0)
    args = p.parse_args()
    asyncio.run(run(args.messages, args.idle_s))


if __name__ == "__main__":
    main()
