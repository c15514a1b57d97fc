"""Start real daemon processes for tests and talk to them over their real sockets."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tidemesh.client import Client, DaemonNotRunning
from tidemesh.core.paths import DaemonPaths, daemon_paths


@dataclass
class RunningDaemon:
    home: Path
    mesh: str
    proc: subprocess.Popen[bytes]
    log: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> DaemonPaths:
        return daemon_paths(self.mesh, {"TIDEMESH_HOME": str(self.home)})

    @property
    def client(self) -> Client:
        return Client(self.paths.socket)

    @property
    def token(self) -> str:
        return self.paths.token_file.read_text().strip()

    @property
    def port(self) -> int:
        return int(self.paths.port_file.read_text().strip())

    def session(self) -> aiohttp.ClientSession:
        """An HTTP session over the daemon's Unix socket (base URL http://localhost)."""
        return aiohttp.ClientSession(
            base_url="http://localhost",
            connector=aiohttp.UnixConnector(path=str(self.paths.socket), limit=0),
        )

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def outbox_rows(self) -> list[dict[str, Any]]:
        """Read outbox.db directly (WAL lets a reader in while the daemon runs)."""
        conn = sqlite3.connect(self.paths.outbox_db)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM outbox ORDER BY id")]
        finally:
            conn.close()

    def sql(self, statement: str, *args: Any) -> None:
        """Change outbox.db behind the daemon's back, to set up states the broker would."""
        conn = sqlite3.connect(self.paths.outbox_db, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute(statement, args)
        finally:
            conn.close()


# Test programs send in bursts far past the IPC rate limit's default (100/s, 1,000 at once);
# its own tests (tests/daemon/test_rate_limit.py) set it back.
NO_RATE_LIMIT = {"TIDEMESH_IPC_RATE_PER_S": "0"}
# The suite runs in CI (CI=true) and often in a container: a test daemon is a host's (TCP,
# hooks, a persistent key) unless a test asks for another environment on purpose.
HOST_ENVIRONMENT = {"TIDEMESH_ENVIRONMENT_KIND": "host"}


def daemon_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMESH_")}
    return {**env, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json", **NO_RATE_LIMIT,
            **HOST_ENVIRONMENT, **(extra or {})}


# How a daemon process is started: the installed CLI, or a test's own launcher around it.
TIDEMESH = (sys.executable, "-m", "tidemesh")


def spawn(home: Path, mesh: str = "t", extra_env: dict[str, str] | None = None,
          args: tuple[str, ...] = (), launcher: tuple[str, ...] = TIDEMESH
          ) -> subprocess.Popen[bytes]:
    log = home / f"{mesh}.out"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*launcher, "daemon", "up", "--foreground", "--mesh", mesh, *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=daemon_env(home, extra_env),
        )


def start_daemon(home: Path, mesh: str = "t", extra_env: dict[str, str] | None = None,
                 args: tuple[str, ...] = (), timeout: float = 20.0,
                 launcher: tuple[str, ...] = TIDEMESH) -> RunningDaemon:
    proc = spawn(home, mesh, extra_env, args, launcher)
    d = RunningDaemon(home, mesh, proc, home / f"{mesh}.out", extra_env or {})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}: {d.log.read_text()[-2000:]}")
        try:
            Client(d.paths.socket, timeout=1.0).version()
            return d
        except DaemonNotRunning:
            time.sleep(0.03)
    stacks = dump_stacks(proc.pid, home / f"{mesh}.stuck.txt")
    d.kill()
    raise RuntimeError(f"daemon did not answer in {timeout}s: {d.log.read_text()[-2000:]}"
                       f"\n{stacks}")


def dump_stacks(pid: int, to: Path) -> str:
    """Every thread's Python stack of a process that stopped answering (py-spy, a dev
    dependency), written to ``to``; a line saying why not when it cannot be had."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return "(no py-spy beside this Python: no stacks)"
    try:
        out = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "(py-spy dump did not finish in 30 s)"
    to.write_text(out.stdout + out.stderr)
    return f"stacks in {to}:\n{out.stdout[-3000:]}"


def run_cli(home: Path, *args: str, stdin: bytes | None = None, timeout: float = 60.0,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``tidemesh`` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "tidemesh", *args],
        input=stdin.decode() if stdin is not None else None, capture_output=True, text=True,
        env=daemon_env(home, extra_env), timeout=timeout, check=False,
    )


def tcp_listeners(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (Linux: its socket inodes in /proc/net)."""
    fds = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:   # 0A: LISTEN
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
