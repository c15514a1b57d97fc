"""CPU time of processes from Linux /proc, for the benchmarks' per-message CPU figures: on two
shared cores the rate is set by the sum of every process's CPU per message, and that sum is
steadier from run to run than the rate."""

from __future__ import annotations

import os


def cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU seconds of a process so far, all its threads; with ``reaped``, its
    children that exited and were waited for too."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU seconds of every PostgreSQL server process on this machine together, those that
    exited included (a backend's CPU goes to the postmaster's children's when it ends: without
    it a window in which connections close reads less than nothing)."""
    total = 0.0
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() == "postgres":
                    total += cpu_seconds(int(d), reaped=True)
        except (OSError, ValueError):
            continue
    return total
