"""The daemon's environment (core.environment) as found on this machine: its variables and
the container markers under ``environment.markers_root``; and the settings it fills in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from tidemesh.core.environment import Effective, detect, settle
from tidemesh.daemon.process.config import DaemonSettings

# A marker file is small; a bigger one is read no further than this.
_MARKER_MAX = 65536


def marker_reader(root: Path) -> Callable[[str], str | None]:
    """Read a marker file (an absolute path) under ``root``; None when it cannot be read."""
    def read(path: str) -> str | None:
        try:
            with open(root / path.lstrip("/"), encoding="utf-8", errors="replace") as f:
                return f.read(_MARKER_MAX)
        except OSError:
            return None
    return read


def effective(settings: DaemonSettings, environ: Mapping[str, str]) -> Effective:
    detected = detect(settings.environment_kind, environ,
                      marker_reader(Path(settings.environment_markers_root)))
    return settle(detected, {"ipc.tcp_enabled": settings.ipc_tcp_enabled,
                             "hooks.enabled": settings.hooks_enabled,
                             "identity.persistent": settings.identity_persistent})


def settled(settings: DaemonSettings, environ: Mapping[str, str]
            ) -> tuple[DaemonSettings, Effective]:
    """``settings`` with the environment's defaults in place of the unset ones."""
    env = effective(settings, environ)
    return dataclasses.replace(settings, ipc_tcp_enabled=env.tcp_enabled,
                               hooks_enabled=env.hooks_enabled,
                               identity_persistent=env.persistent), env
