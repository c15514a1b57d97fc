"""The fleet as files show it: the user's ``fleet.toml``, which meshes' daemons run (their
instance locks), and how many bytes the meshes' databases take. The rules are core.fleet."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemesh.core import fleet
from tidemesh.core.paths import fleet_config_file, meshes_dir, runtimes_dir
from tidemesh.core.settings import ConfigError
from tidemesh.daemon.process import config as config_mod
from tidemesh.storage.lock import is_held

# What counts toward the disk budget: the databases and their journals (logs are the
# service manager's or rotated by size; keys and configs are a few bytes).
_DB_SUFFIXES = (".db", ".db-wal", ".db-shm", ".db-journal")


def settings(environ: Mapping[str, str]) -> tuple[fleet.FleetSettings, Path]:
    path = fleet_config_file(environ)
    loaded, _ = fleet.load(config_mod.read_file(path), environ)
    return loaded, path


def running(environ: Mapping[str, str], besides: str | None = None) -> list[str]:
    """Meshes whose daemon holds its instance lock now, ``besides`` left out."""
    root = runtimes_dir(environ)
    try:
        names = sorted(d.name for d in root.iterdir() if d.is_dir())
    except OSError:
        return []
    return [n for n in names if n != besides and is_held(root / n / "daemon.lock")]


def refusal(mesh: str, environ: Mapping[str, str]) -> str | None:
    """Why the daemon of ``mesh`` may not start beside the user's others
    (fleet.max_daemons, or a bad fleet.toml), or None. The daemon checks it under its own
    lock, `daemon up` before it starts one; two daemons starting in the same instant may
    both pass, which the limit tolerates (it bounds a fleet, it does not meter it)."""
    try:
        loaded, path = settings(environ)
    except ConfigError as exc:
        return exc.message
    return fleet.start_refusal(running(environ, besides=mesh), loaded.fleet_max_daemons,
                               str(path), str(runtimes_dir(environ)))


def disk_used(environ: Mapping[str, str]) -> int:
    """Bytes the databases of every mesh of this user take on this host."""
    total = 0
    root = meshes_dir(environ)
    try:
        folders = [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return 0
    for folder in folders:
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                if entry.name.endswith(_DB_SUFFIXES) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_size
    return total


@dataclass(slots=True)
class FleetDisk:
    """The fleet's disk use against its budget, re-measured at most every ``max_age_s``
    (a send checks it; the sum is a few stat calls per mesh)."""

    environ: Mapping[str, str]
    budget: int | None
    max_age_s: float = 1.0
    monotonic: Callable[[], float] = time.monotonic
    _used: int = 0
    _read_at: float = float("-inf")

    def used(self) -> int:
        now = self.monotonic()
        if now - self._read_at >= self.max_age_s:
            self._used, self._read_at = disk_used(self.environ), now
        return self._used

    @property
    def over(self) -> bool:
        return self.budget is not None and fleet.over_budget(self.used(), self.budget)

    def check_send(self) -> None:
        if self.budget is not None and fleet.over_budget(used := self.used(), self.budget):
            raise fleet.budget_exceeded(used, self.budget)

    def view(self) -> dict[str, Any]:
        return {"used_bytes": self.used(), "budget_bytes": self.budget, "over": self.over}
