"""Operating tidemesh: service units, configuration, lifecycle. Real processes and files;
only the service manager (systemctl, launchctl) is a recording fake on PATH."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import mesh, sqlite_broker  # noqa: F401 - fixtures used by this folder
from tidemesh.core.environment import CI_VARIABLES

FAKE_MANAGER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_MANAGER_LOG"
if [ -n "$FAKE_MANAGER_STDERR" ]; then echo "$FAKE_MANAGER_STDERR" >&2; fi
exit "${FAKE_MANAGER_EXIT:-0}"
"""


@dataclass
class Host:
    """A pretend host: its own HOME and TIDEMESH_HOME, and a service manager that records."""

    root: Path
    env: dict[str, str]

    @property
    def calls(self) -> list[str]:
        log = Path(self.env["FAKE_MANAGER_LOG"])
        return log.read_text().splitlines() if log.exists() else []

    def run(self, *args: str, extra: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                             env={**self.env, **(extra or {})}, timeout=60, check=False)
        return res.returncode, res.stdout, res.stderr.decode()


@pytest.fixture
def host(short_tmp: Path) -> Host:
    bin_dir = short_tmp / "fakebin"
    bin_dir.mkdir()
    for name in ("systemctl", "launchctl"):
        tool = bin_dir / name
        tool.write_text(FAKE_MANAGER)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIDEMESH_", "XDG_")) and k not in CI_VARIABLES}
    env.update(HOME=str(short_tmp / "home"), TIDEMESH_HOME=str(short_tmp / "tm"),
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               FAKE_MANAGER_LOG=str(short_tmp / "manager.log"))
    return Host(short_tmp, env)
