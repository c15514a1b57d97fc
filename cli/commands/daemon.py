"""``tidemesh daemon up|down|status|version|accept-host``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

import tidemesh
from tidemesh.cli.client import DaemonClient, DaemonNotRunning
from tidemesh.cli.commands.common import client_for, json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, fail, fields
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import DaemonPaths
from tidemesh.core.settings import ConfigError
from tidemesh.daemon import admin
from tidemesh.daemon import main as daemon_main

START_TIMEOUT_S = 20.0


@click.group("daemon")
def daemon_group() -> None:
    """Run and operate the per-host daemon."""


@daemon_group.command("up")
@mesh_option
@click.option("--foreground", is_flag=True, help="Run in this process instead of detaching.")
@click.option("--no-tcp", is_flag=True, help="Serve only the Unix socket.")
@click.option("--http-port", type=int, default=None, help="Loopback TCP port (0 = any free).")
@click.option("--log-file", default=None, metavar="PATH",
              help="Write JSON log lines to PATH, rotated by size (setting log.file).")
def up(mesh: str, foreground: bool, no_tcp: bool, http_port: int | None,
       log_file: str | None) -> None:
    """Start the daemon (detached unless --foreground)."""
    flags = {"ipc.tcp_enabled": False if no_tcp else None, "ipc.http_port": http_port,
             "log.file": log_file}
    # A child detached from a service manager's process would escape its supervision: the
    # manager sees its main process exit and stops the service.
    if foreground or admin.under_service_manager(os.environ):
        sys.exit(daemon_main.run(mesh, os.environ, flags))
    sys.exit(int(_start_detached(mesh, no_tcp, http_port, log_file)))


def _start_detached(mesh: str, no_tcp: bool, http_port: int | None,
                    log_file: str | None) -> Exit:
    paths = paths_for(mesh)
    if admin.is_held(paths.lock_file):
        click.echo(f"a daemon for mesh {mesh} is already running "
                   f"(pid {admin.holder_pid(paths.lock_file)})", err=True)
        return Exit.ALREADY_RUNNING
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", mesh]
    argv += ["--no-tcp"] if no_tcp else []
    argv += ["--http-port", str(http_port)] if http_port is not None else []
    # The daemon writes its own size-rotated log; the stderr file only catches what is printed
    # before logging starts (a bad config) or a crash, and is emptied at each start.
    argv += ["--log-file", log_file or str(paths.log_file)]
    with open(_stderr_file(paths), "wb") as errf:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                                 start_new_session=True, env={**os.environ,
                                                              "TIDEMESH_LOG_FORMAT": "json"})
    return _wait_ready(child, paths)


def _stderr_file(paths: DaemonPaths) -> Path:
    return paths.state_dir / "daemon.stderr.log"


def _wait_ready(child: subprocess.Popen[bytes], paths: DaemonPaths) -> Exit:
    client = DaemonClient(paths.socket, timeout=1.0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            click.echo(f"the daemon exited during start-up with code {code}; see {paths.log_file}",
                       err=True)
            _tail(paths)
            return Exit(code) if code in Exit._value2member_map_ else Exit.FAILURE
        try:
            v = client.version()
        except DaemonNotRunning:
            time.sleep(0.05)
            continue
        click.echo(f"daemon started: mesh {v['mesh']}, pid {child.pid}, socket {paths.socket}")
        return Exit.OK
    click.echo(f"the daemon did not answer within {START_TIMEOUT_S:.0f} s; see {paths.log_file}",
               err=True)
    return Exit.UNHEALTHY


def _tail(paths: DaemonPaths, lines: int = 5) -> None:
    for path in (paths.log_file, _stderr_file(paths)):
        try:
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in text[-lines:]:
            click.echo("  " + line, err=True)


@daemon_group.command("down")
@mesh_option
@click.option("--timeout", type=float, default=None,
              help="Seconds to wait for the drain before giving up; default: the daemon's "
                   "shutdown.grace_s plus 10.")
def down(mesh: str, timeout: float | None) -> None:
    """Stop the daemon gracefully: finish in-flight work, remove the socket, exit 0."""
    paths = paths_for(mesh)
    pid = admin.holder_pid(paths.lock_file)
    if not admin.is_held(paths.lock_file) or pid is None:
        click.echo(f"no daemon is running for mesh {mesh}")
        sys.exit(int(Exit.NOT_RUNNING))
    if timeout is None:
        timeout = _grace_s(mesh) + 10.0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not admin.is_held(paths.lock_file):
            click.echo(f"daemon stopped (pid {pid})")
            return
        time.sleep(0.05)
    click.echo(f"daemon (pid {pid}) did not stop within {timeout:.0f} s", err=True)
    sys.exit(int(Exit.FAILURE))


def _grace_s(mesh: str) -> float:
    """The drain deadline the daemon reads, so `down` waits at least as long as it drains."""
    try:
        return float(daemon_main.prepare(mesh, os.environ, {}).settings.shutdown_grace_s)
    except ConfigError:
        return 30.0


@daemon_group.command("status")
@mesh_option
@json_option
def status(mesh: str, as_json: bool) -> None:
    """Show whether the daemon runs and is healthy (exit 0 healthy, 3 not running, 6 unhealthy)."""
    paths = paths_for(mesh)
    report: dict[str, object] = {
        "running": False, "mesh": mesh, "pid": None, "socket": str(paths.socket),
        "http_port": _read_port(paths), "token_file": str(paths.token_file),
        "data_dir": str(paths.data_dir), "log_file": str(paths.log_file),
        "version": tidemesh.__version__,
    }
    code = Exit.NOT_RUNNING
    try:
        health = client_for(mesh, timeout=3.0).health()
    except DaemonNotRunning:
        health = None
        if admin.is_held(paths.lock_file):
            # The process lives (it holds the lock) but does not answer: hung, not stopped.
            report.update(running=True, pid=admin.holder_pid(paths.lock_file), healthy=False,
                          error={"code": "not_answering",
                                 "message": "the daemon holds its lock but its socket does "
                                            "not answer"})
            code = Exit.UNHEALTHY
    except TidemeshError as exc:
        report["error"] = exc.to_body()["error"]
        health = None
        code = Exit.UNHEALTHY
    if health is not None:
        report.update(running=True, pid=health["pid"], healthy=health["healthy"],
                      connected=health["connected"], outbox=health["queue_depth"],
                      member_pubkey=health["member_pubkey"], uptime_s=health["uptime_s"],
                      daemon_version=health["daemon_version"], disk=health.get("disk"))
        code = Exit.OK if health["healthy"] else Exit.UNHEALTHY
    if as_json:
        emit_json(report)
    else:
        fields(report)
    sys.exit(int(code))


def _read_port(paths: DaemonPaths) -> int | None:
    try:
        return int(paths.port_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


@daemon_group.command("version")
@mesh_option
@json_option
def version(mesh: str, as_json: bool) -> None:
    """Print the CLI's version and, when one runs, the daemon's."""
    out: dict[str, object] = {"cli_version": tidemesh.__version__}
    try:
        out["daemon"] = client_for(mesh, timeout=3.0).version()
    except DaemonNotRunning:
        out["daemon"] = None
    if as_json:
        emit_json(out)
        return
    click.echo(f"tidemesh {tidemesh.__version__}")
    daemon = out["daemon"]
    click.echo(f"daemon {daemon['daemon_version']} (ipc {daemon['ipc_api']})"
               if isinstance(daemon, dict) else "daemon: not running")


@daemon_group.command("accept-host")
@mesh_option
def accept_host(mesh: str) -> None:
    """Adopt this host after a clone or hardware change (keeps the keypair)."""
    paths = paths_for(mesh)
    if not paths.data_dir.exists():
        fail(TidemeshError(f"no daemon data for mesh {mesh} at {paths.data_dir}"))
    current = admin.current_host_fingerprint()
    admin.accept_host(paths.host_fingerprint, current)
    click.echo(f"host fingerprint for mesh {mesh} set to {current[:16]}…; `daemon up` will start")
