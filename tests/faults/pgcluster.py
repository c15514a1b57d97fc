"""A private PostgreSQL cluster for fault runs: initdb into a temp folder, start, restart, remove.

A PostgreSQL restart is one of the injected faults, and the shared test server serves other
people's tests at the same time, so a fault run never restarts that one: it makes its own
cluster on a free port with its socket in its own folder, and removes it at the end.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PG_USER = "postgres"


def _bin_dir() -> Path | None:
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin"):
        for found in sorted(glob.glob(pattern), reverse=True):
            if (Path(found) / "initdb").exists():
                return Path(found)
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable_reason() -> str | None:
    """Why a private cluster cannot be made here, or None when it can."""
    if _bin_dir() is None:
        return "initdb (PostgreSQL server binaries) not found"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(PG_USER)
        except KeyError:
            return "running as root and there is no postgres user to own a cluster"
    return None


@dataclass
class PgCluster:
    """One private cluster: ``start()``, ``restart()`` (the fault), ``destroy()``."""

    root: Path
    port: int

    @classmethod
    def create(cls) -> PgCluster:
        root = Path(tempfile.mkdtemp(prefix="tm-pg-", dir="/tmp"))
        cluster = cls(root, _free_port())
        if os.geteuid() == 0:
            # initdb refuses to run as root; the folder must belong to the server's user.
            shutil.chown(root, PG_USER)
        cluster._run("initdb", "-D", str(cluster.data), "-A", "trust", "-U", PG_USER,
                     "--no-sync")
        return cluster

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dsn_base(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}"

    def dsn(self, database: str = "postgres") -> str:
        return f"{self.dsn_base}/{database}"

    def _run(self, tool: str, *args: str) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None
        cmd = [str(bin_dir / tool), *args]
        if os.geteuid() == 0:
            cmd = ["su", PG_USER, "-c", " ".join(cmd)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        # fsync stays on: a restart fault must find exactly what was committed.
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w",
                  "-t", "60", "-o", f"'{opts}'", "start")
        self._wait_ready()

    def stop(self) -> None:
        """Stop the server (fast: open transactions abort) and leave it down."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Restart the server: ``fast`` aborts open transactions, ``immediate`` is a crash."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w",
                  "-t", "60", "-m", mode, "-o", f"'{opts}'", "restart")
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("private PostgreSQL did not come up")

    def create_database(self, name: str) -> str:
        bin_dir = _bin_dir()
        assert bin_dir is not None
        subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", PG_USER, name], check=True, capture_output=True, timeout=60)
        return self.dsn(name)

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
