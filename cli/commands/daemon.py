"""``tidemesh daemon up|down|restart|status|version|accept-host`` (``--all`` for every
joined mesh); ``ps`` and ``logs`` are in ``fleet``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

import tidemesh
from tidemesh.cli.commands.common import (
    all_option,
    client_for,
    json_option,
    mesh_option,
    paths_for,
)
from tidemesh.cli.lazy import LazyGroup
from tidemesh.cli.output import emit_json, fail, fields
from tidemesh.client import Client, DaemonNotRunning
from tidemesh.client.endpoint import joined_meshes
from tidemesh.core.environment import CONTAINER, KINDS
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import DaemonPaths
from tidemesh.core.settings import ConfigError
from tidemesh.daemon import admin

START_TIMEOUT_S = 20.0
# How long `up` waits for the broker's first answer once the daemon serves its socket: long
# enough for a refusal (revoked) to arrive, short enough not to hold up an unreachable broker.
LINK_WAIT_S = 5.0


C = "tidemesh.cli.commands."
SUBCOMMANDS = {
    "outbox": C + "outbox:outbox_group",
    "inbox": C + "outbox:inbox_group",
    "hooks": C + "hooks:hooks_group",
    "ps": C + "fleet:ps",
    "metrics": C + "metrics:metrics_cmd",
    "logs": C + "fleet:logs",
    "join": C + "join:join_cmd",
    "install-service": C + "service:daemon_install",
    "backup": C + "backup:backup",
    "restore": C + "backup:restore",
    "rotate-token": C + "backup:rotate_token",
    "rotate-keypair": C + "keypair:rotate_keypair",
    "archive-cleanup": C + "keypair:archive_cleanup",
    "leave": C + "departure:leave",
    "reset": C + "departure:reset",
    "recover": C + "departure:recover",
    "uninstall-service": C + "service:daemon_uninstall",
}


@click.group("daemon", cls=LazyGroup, lazy_subcommands=SUBCOMMANDS)
def daemon_group() -> None:
    """Run and operate the per-host daemon."""


@daemon_group.command("up")
@all_option
@mesh_option
@click.option("--foreground", is_flag=True, help="Run in this process instead of detaching.")
@click.option("--no-tcp", is_flag=True, help="Serve only the Unix socket.")
@click.option("--http-port", type=int, default=None, help="Loopback TCP port (0 = any free).")
@click.option("--log-file", default=None, metavar="PATH",
              help="Write JSON log lines to PATH, rotated by size (setting log.file).")
@click.option("--environment", "environment", default=None,
              type=click.Choice(["auto", *KINDS]),
              help="host, container or ci instead of the detected one (setting "
                   "environment.kind): it sets the defaults of TCP, hooks and the keypair.")
@click.option("--container", is_flag=True,
              help="Run as in a container (--environment container): the Unix socket only.")
@click.option("--persistent/--ephemeral", "persistent", default=None,
              help="Keep the member keypair across runs, or not (setting "
                   "identity.persistent); default: persistent, except in CI.")
@json_option
def up(all_meshes: bool, mesh: str, foreground: bool, no_tcp: bool, http_port: int | None,
       log_file: str | None, environment: str | None, container: bool,
       persistent: bool | None, as_json: bool) -> None:
    """Start the daemon (detached unless --foreground); --all starts every joined mesh's.

    In a container it serves the Unix socket only, in CI too and it is ephemeral, with no
    hooks (docs/threat-model.md, Environments); settings given explicitly win.

    With --json, prints {mesh, pid, socket, started} ({"items": [...]} with --all)."""
    if container:
        if environment not in (None, CONTAINER):
            raise click.UsageError("--container is --environment container")
        environment = CONTAINER
    env_args = _environment_args(environment, persistent)
    if all_meshes:
        if foreground or http_port is not None or log_file is not None:
            raise click.UsageError("--all starts detached daemons with their own settings; "
                                   "--foreground, --http-port and --log-file name one daemon")
        started: list[dict[str, object]] = []
        code = _each_mesh(lambda m: _up_one(m, no_tcp, started, as_json, env_args))
        if as_json:
            emit_json({"items": started})
        sys.exit(int(code))
    flags = {"ipc.tcp_enabled": False if no_tcp else None, "ipc.http_port": http_port,
             "log.file": log_file, "environment.kind": environment,
             "identity.persistent": persistent}
    # A child detached from a service manager's process would escape its supervision: the
    # manager sees its main process exit and stops the service.
    if foreground or admin.under_service_manager(os.environ):
        if _revoked(paths_for(mesh)):
            sys.exit(int(Exit.REVOKED))
        from tidemesh.daemon import main as daemon_main  # the daemon itself: only to run it

        sys.exit(daemon_main.run(mesh, os.environ, flags))
    report: list[dict[str, object]] = []
    code = _start_detached(mesh, no_tcp, http_port, log_file, report, as_json, env_args)
    if as_json and report:
        emit_json(report[0])
    sys.exit(int(code))


def _each_mesh(action: Callable[[str], Exit]) -> Exit:
    """Run ``action`` for every joined mesh; the result is the first failure, else OK."""
    meshes = joined_meshes()
    if not meshes:
        click.echo("no mesh is joined on this host (tidemesh daemon join INVITE)", err=True)
        return Exit.NOT_RUNNING
    results = [action(m) for m in meshes]
    return next((r for r in results if r != Exit.OK), Exit.OK)


def _environment_args(environment: str | None, persistent: bool | None) -> list[str]:
    """The environment flags again, for the detached daemon's command line."""
    out = ["--environment", environment] if environment is not None else []
    return out + ([] if persistent is None else
                  ["--persistent" if persistent else "--ephemeral"])


def _up_one(mesh: str, no_tcp: bool, report: list[dict[str, object]], as_json: bool,
            env_args: list[str]) -> Exit:
    code = _start_detached(mesh, no_tcp, None, None, report, as_json, env_args)
    return Exit.OK if code == Exit.ALREADY_RUNNING else code


def _start_detached(mesh: str, no_tcp: bool, http_port: int | None, log_file: str | None,
                    report: list[dict[str, object]] | None = None,
                    as_json: bool = False, env_args: list[str] | None = None) -> Exit:
    """Start a detached daemon and wait for it to answer; appends {mesh, pid, socket,
    started} to ``report`` when it runs (``started`` false: it already ran)."""
    paths = paths_for(mesh)
    report = [] if report is None else report
    if admin.is_held(paths.lock_file):
        pid = admin.holder_pid(paths.lock_file)
        report.append({"mesh": mesh, "pid": pid, "socket": str(paths.socket), "started": False})
        click.echo(f"a daemon for mesh {mesh} is already running (pid {pid})", err=True)
        return Exit.ALREADY_RUNNING
    if _revoked(paths):
        return Exit.REVOKED
    refused = admin.fleet.refusal(mesh, os.environ) or _link_refusal(paths, env_args)
    if refused is not None:
        click.echo(f"error: not starting the daemon of mesh {mesh}: {refused}", err=True)
        return Exit.USAGE
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", mesh]
    argv += ["--no-tcp"] if no_tcp else []
    argv += ["--http-port", str(http_port)] if http_port is not None else []
    argv += env_args or []
    # The daemon writes its own size-rotated log; the stderr file only catches what is printed
    # before logging starts (a bad config) or a crash, and is emptied at each start.
    argv += ["--log-file", log_file or str(paths.log_file)]
    with open(_stderr_file(paths), "wb") as errf:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                                 start_new_session=True, env={**os.environ,
                                                              "TIDEMESH_LOG_FORMAT": "json"})
    code = _wait_ready(child, paths, quiet=as_json)
    if code == Exit.OK:
        report.append({"mesh": mesh, "pid": child.pid, "socket": str(paths.socket),
                       "started": True})
    return code


def _link_refusal(paths: DaemonPaths, env_args: list[str] | None) -> str | None:
    """Why the daemon would be refused as unable to reach its broker (its key is not the
    joined member's), said before it is started; None when it may start (a bad config is the
    daemon's to report)."""
    args = env_args or []
    persistent = True if "--persistent" in args else False if "--ephemeral" in args else None
    kind = args[args.index("--environment") + 1] if "--environment" in args else None
    try:
        env = admin.ephemeral.environment_of(paths, os.environ, persistent, kind)
    except (ConfigError, ValueError):
        return None
    return admin.ephemeral.start_refusal(paths, env.persistent)


def _revoked(paths: DaemonPaths) -> bool:
    """Say so when an operator removed this member: starting again cannot help."""
    found = admin.revocation.load(paths.revoked_file)
    if found is not None:
        click.echo(f"error: {found.message}", err=True)
    return found is not None


def _stderr_file(paths: DaemonPaths) -> Path:
    return paths.state_dir / "daemon.stderr.log"


def _wait_ready(child: subprocess.Popen[bytes], paths: DaemonPaths, quiet: bool = False
                ) -> Exit:
    """Wait until the daemon answers on its socket, then a moment for the broker's first
    answer, so that a member revoked while its daemon was down hears it from ``up`` (exit
    12) instead of "started" followed by a silent exit."""
    client = Client(paths.socket, timeout=1.0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if (code := child.poll()) is not None:
            return _exited(code, paths)
        try:
            v = client.version()
        except DaemonNotRunning:
            time.sleep(0.05)
            continue
        connected = _first_link(child, client)
        if connected is None:
            return _exited(child.wait(), paths)
        if not quiet:
            tail = "connected to the broker" if connected else (
                "not connected to the broker yet; it keeps trying (`tidemesh daemon status`)")
            click.echo(f"daemon started: mesh {v['mesh']}, pid {child.pid}, "
                       f"socket {paths.socket}; {tail}")
        return Exit.OK
    click.echo(f"the daemon did not answer within {START_TIMEOUT_S:.0f} s; see {paths.log_file}",
               err=True)
    return Exit.UNHEALTHY


def _first_link(child: subprocess.Popen[bytes], client: Client) -> bool | None:
    """Whether the daemon reached the broker within ``LINK_WAIT_S``; None when it stopped
    meanwhile (refused as revoked, say)."""
    deadline = time.monotonic() + LINK_WAIT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return None
        try:
            if client.health().get("connected"):
                return True
        except DaemonNotRunning:
            pass  # exiting: the next poll says how
        time.sleep(0.1)
    return False


def _exited(code: int, paths: DaemonPaths) -> Exit:
    click.echo(f"the daemon exited during start-up with code {code}; see {paths.log_file}",
               err=True)
    _tail(paths)
    if code == Exit.REVOKED:
        _revoked(paths)
    return Exit(code) if code in Exit._value2member_map_ else Exit.FAILURE


def _tail(paths: DaemonPaths, lines: int = 5) -> None:
    for path in (paths.log_file, _stderr_file(paths)):
        try:
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in text[-lines:]:
            click.echo("  " + line, err=True)


timeout_option = click.option(
    "--timeout", type=float, default=None,
    help="Seconds to wait for the daemon to stop before it gets SIGKILL; default: the "
         "daemon's shutdown.grace_s plus 10.")


@daemon_group.command("down")
@all_option
@mesh_option
@timeout_option
def down(all_meshes: bool, mesh: str, timeout: float | None) -> None:
    """Stop the daemon gracefully: finish in-flight work, remove the socket, exit 0;
    --all stops every joined mesh's. A daemon still running past --timeout gets SIGKILL
    (said, with its pid)."""
    if all_meshes:
        sys.exit(int(_each_mesh(lambda m: _stop(m, timeout, quiet_if_stopped=True))))
    sys.exit(int(_stop(mesh, timeout)))


@daemon_group.command("restart")
@all_option
@mesh_option
@timeout_option
def restart(all_meshes: bool, mesh: str, timeout: float | None) -> None:
    """Stop the daemon gracefully, then start it again detached (with daemon.toml's
    settings; flags given to the earlier `daemon up` are not kept). The configuration is
    checked first: one that cannot start (exit 2) leaves the running daemon alone."""
    def again(m: str) -> Exit:
        if (problem := _config_problem(m)) is not None:
            pid = admin.holder_pid(paths_for(m).lock_file)
            still = (f"the daemon is still running (pid {pid})"
                     if admin.is_held(paths_for(m).lock_file) else "nothing was stopped")
            click.echo(f"error: mesh {m}: the configuration would not start: {problem}; "
                       f"{still}: fix it, then restart", err=True)
            return Exit.USAGE
        stopped = _stop(m, timeout, quiet_if_stopped=True)
        return stopped if stopped != Exit.OK else _start_detached(m, False, None, None)

    sys.exit(int(_each_mesh(again) if all_meshes else again(mesh)))


def _stop(mesh: str, timeout: float | None, quiet_if_stopped: bool = False) -> Exit:
    paths = paths_for(mesh)
    pid = admin.holder_pid(paths.lock_file)
    if not admin.is_held(paths.lock_file) or pid is None:
        click.echo(f"no daemon is running for mesh {mesh}")
        return Exit.OK if quiet_if_stopped else Exit.NOT_RUNNING
    if timeout is None:
        timeout = _grace_s(mesh) + 10.0
    os.kill(pid, signal.SIGTERM)
    if _released(paths, timeout):
        click.echo(f"daemon stopped: mesh {mesh} (pid {pid})")
        return Exit.OK
    # The daemon bounds its own stop by its grace; one still here is stuck past that. Its
    # commits are atomic, so killing it loses nothing it accepted.
    click.echo(f"daemon of mesh {mesh} (pid {pid}) was still running {timeout:.0f} s after "
               f"SIGTERM; sent SIGKILL (see {paths.log_file})", err=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if _released(paths, _KILL_WAIT_S):
        click.echo(f"daemon stopped: mesh {mesh} (pid {pid}, killed)")
        return Exit.OK
    click.echo(f"daemon of mesh {mesh} (pid {pid}) still holds its lock after SIGKILL",
               err=True)
    return Exit.FAILURE


# How long a SIGKILLed daemon may take to be gone (its lock released by the kernel).
_KILL_WAIT_S = 10.0


def _released(paths: DaemonPaths, within: float) -> bool:
    """Whether the daemon's instance lock is free within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not admin.is_held(paths.lock_file):
            return True
        time.sleep(0.05)
    return not admin.is_held(paths.lock_file)


def _config_problem(mesh: str) -> str | None:
    """What stops this mesh's daemon from starting (settings, hooks.toml), or None."""
    from tidemesh.daemon import main as daemon_main

    try:
        daemon_main.prepare(mesh, os.environ, {})
    except ConfigError as exc:
        return exc.message
    return None


def _grace_s(mesh: str) -> float:
    """The drain deadline the daemon reads, so `down` waits at least as long as it drains."""
    try:
        from tidemesh.daemon import main as daemon_main

        return float(daemon_main.prepare(mesh, os.environ, {}).settings.shutdown_grace_s)
    except ConfigError:
        return 30.0


@daemon_group.command("status")
@mesh_option
@json_option
def status(mesh: str, as_json: bool) -> None:
    """Show whether the daemon runs and is healthy (exit 0 healthy, 3 not running, 6 unhealthy,
    12 revoked from the mesh)."""
    paths = paths_for(mesh)
    report: dict[str, object] = {
        "running": False, "mesh": mesh, "pid": None, "socket": str(paths.socket),
        "http_port": _read_port(paths), "token_file": str(paths.token_file),
        "data_dir": str(paths.data_dir), "log_file": str(paths.log_file),
        "version": tidemesh.__version__,
    }
    code = Exit.NOT_RUNNING
    revoked = None
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
        elif (revoked := admin.revocation.load(paths.revoked_file)) is not None:
            report.update(revoked=True, error=revoked.error().to_body()["error"])
            code = Exit.REVOKED
    except TidemeshError as exc:
        report["error"] = exc.to_body()["error"]
        health = None
        code = Exit.UNHEALTHY
    if health is not None:
        report.update(running=True, pid=health["pid"], healthy=health["healthy"],
                      connected=health["connected"], outbox=health["queue_depth"],
                      member_pubkey=health["member_pubkey"], uptime_s=health["uptime_s"],
                      daemon_version=health["daemon_version"], disk=health.get("disk"),
                      broker_url=health.get("broker_url"),
                      broker_version=health.get("broker_version"),
                      link_state=health.get("link_state"),
                      environment=health.get("environment"))
        if health.get("clone_suspected"):
            report["clone_suspected"] = True
        code = Exit.OK if health["healthy"] else Exit.UNHEALTHY
    if as_json:
        emit_json(report)
    else:
        fields({**report, "environment": _environment_line(report["environment"])}
               if report.get("environment") else report)
        if revoked is not None:
            click.echo(f"error: {revoked.message}", err=True)
    sys.exit(int(code))


def _environment_line(env: object) -> str:
    """e.g. ``ci (CI variable CI); changed: ipc.tcp_enabled, hooks.enabled``."""
    assert isinstance(env, dict)
    changed = env.get("changed") or []
    return f"{env['kind']} ({env['reason']})" + (f"; changed: {', '.join(changed)}"
                                                 if changed else "")


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
