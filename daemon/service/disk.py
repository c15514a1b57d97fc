"""Disk pressure: refuse new sends while free space is under the floor, before SQLite fails.

Receiving goes on (the inbox is what the floor's space is kept for), and sends are accepted
again by themselves once space returns: the state is re-read at most every ``max_age_s``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from tidemesh.core.errors import InsufficientStorage
from tidemesh.core.retention import below_floor, used_pct

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DiskState:
    total_bytes: int
    free_bytes: int
    floor_bytes: int

    @property
    def low(self) -> bool:
        return below_floor(self.free_bytes, self.floor_bytes)

    @property
    def used_pct(self) -> float:
        return used_pct(self.total_bytes, self.free_bytes)


def _size(path: Path) -> int:
    """A database's bytes on disk, its WAL included."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{path}{suffix}").st_size
    return total


class Budget(Protocol):
    """A second gate on sends: the user's fleet disk budget (process/fleet.FleetDisk)."""

    @property
    def over(self) -> bool: ...

    def check_send(self) -> None: ...

    def view(self) -> dict[str, Any]: ...


class DiskMonitor:
    def __init__(self, data_dir: Path, databases: Mapping[str, Path], floor_bytes: int,
                 max_age_s: float = 0.25, monotonic: Callable[[], float] = time.monotonic,
                 budget: Budget | None = None) -> None:
        self.data_dir = data_dir
        self.budget = budget
        self.databases = dict(databases)
        self.floor_bytes = floor_bytes
        self.max_age_s = max_age_s
        self.monotonic = monotonic
        self._state: DiskState | None = None
        self._read_at = float("-inf")
        self.refused_total = 0

    def state(self) -> DiskState:
        now = self.monotonic()
        if self._state is None or now - self._read_at >= self.max_age_s:
            st = os.statvfs(self.data_dir)
            fresh = DiskState(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize,
                              self.floor_bytes)
            if self._state is not None and fresh.low != self._state.low:
                event = "disk_floor_crossed" if fresh.low else "disk_space_recovered"
                log.warning(event, free_bytes=fresh.free_bytes, floor_bytes=self.floor_bytes)
            self._state, self._read_at = fresh, now
        return self._state

    def check_send(self) -> None:
        """Raise 507 while the file system holding the databases is under the floor."""
        st = self.state()
        if st.low:
            self.refused_total += 1
            raise InsufficientStorage(
                f"only {st.free_bytes} bytes are free on the daemon's file system, under its "
                f"floor of {st.floor_bytes} (disk.reserved_bytes); new sends are refused until "
                "space is freed, nothing was stored, and messages are still being received",
                free_bytes=st.free_bytes, floor_bytes=st.floor_bytes)
        if self.budget is not None:
            try:
                self.budget.check_send()
            except InsufficientStorage:
                self.refused_total += 1
                raise

    def sizes(self) -> dict[str, int]:
        return {name: _size(path) for name, path in self.databases.items()}

    def view(self) -> dict[str, Any]:
        """For /v1/health and `daemon status`."""
        st = self.state()
        return {"free_bytes": st.free_bytes, "total_bytes": st.total_bytes,
                "used_pct": st.used_pct, "floor_bytes": st.floor_bytes,
                "sends_refused": st.low or (self.budget is not None and self.budget.over),
                "databases": self.sizes(),
                **({"fleet": self.budget.view()} if self.budget is not None else {})}
