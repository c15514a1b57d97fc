"""``tidemesh daemon|broker install-service|uninstall-service``: the service-manager adapter.

Owns what is specific to this host: the absolute path of the console script, the folders a
service writes (from ``core.paths`` and the broker's settings), where systemd and launchd
keep their files, and running ``systemctl``/``launchctl``. The unit and plist text comes
from ``core.service_unit``; ``--dry-run`` prints exactly those bytes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from tidemesh.broker.admin import broker_home, running, store_source
from tidemesh.broker.admin import settings as broker_config
from tidemesh.cli.commands.common import mesh_option
from tidemesh.cli.output import fail
from tidemesh.core.environment import ci_environment
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import daemon_paths
from tidemesh.core.service_unit import (
    ServiceSpec,
    launchd_plist,
    systemd_unit,
    under_tmp,
)

F = TypeVar("F", bound=Callable[..., Any])


class ServiceError(TidemeshError):
    """Install or uninstall could not be done on this host (exit 1, nothing half-written)."""

    code = "service_install_failed"

# The service sees these as the installing shell does, so `tidemesh daemon status` run later
# from that shell finds the same socket and files.
PINNED_ENV = ("TIDEMESH_HOME", "TIDEMESH_BROKER_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
              "XDG_STATE_HOME")
# Where a --system service keeps everything unless TIDEMESH_HOME says otherwise.
SYSTEM_HOME = {"systemd": "/var/lib/tidemesh", "launchd": "/usr/local/var/tidemesh"}


@dataclass(frozen=True, slots=True)
class Target:
    """Which manager and scope, and where its files go."""

    manager: str           # "systemd" | "launchd"
    scope: str             # "user" | "system"
    unit_dir: Path
    # --unit-dir: a folder the manager does not read (packaging); write the file, load nothing.
    write_only: bool = False

    def file_for(self, spec: ServiceSpec) -> Path:
        return self.unit_dir / (spec.unit_file if self.manager == "systemd" else spec.plist_file)

    def render(self, spec: ServiceSpec) -> bytes:
        return (systemd_unit(spec).encode() if self.manager == "systemd"
                else launchd_plist(spec))

    def _systemctl(self, *args: str) -> list[str]:
        return ["systemctl", *(["--user"] if self.scope == "user" else []), *args]

    def _domain(self) -> str:
        return f"gui/{os.getuid()}" if self.scope == "user" else "system"

    def probe_commands(self) -> list[list[str]]:
        """Run before writing anything: is the service manager there to talk to?"""
        return [self._systemctl("show-environment")] if self.manager == "systemd" else []

    def load_commands(self, spec: ServiceSpec, path: Path) -> list[list[str]]:
        """Load and (re)start; restart rather than start so a re-install takes effect."""
        if self.manager == "systemd":
            return [self._systemctl("daemon-reload"), self._systemctl("enable", spec.unit_file),
                    self._systemctl("restart", spec.unit_file)]
        return [["launchctl", "bootstrap", self._domain(), str(path)]]

    def prepare_commands(self, spec: ServiceSpec) -> list[list[str]]:
        """Run before loading, failures ignored: launchd refuses to bootstrap a loaded job."""
        return [] if self.manager == "systemd" else self.unload_commands(spec)

    def unload_commands(self, spec: ServiceSpec) -> list[list[str]]:
        if self.manager == "systemd":
            return [self._systemctl("disable", "--now", spec.unit_file)]
        return [["launchctl", "bootout", f"{self._domain()}/{spec.label}"]]

    def after_remove_commands(self) -> list[list[str]]:
        return [self._systemctl("daemon-reload")] if self.manager == "systemd" else []


def default_unit_dir(manager: str, scope: str, environ: Mapping[str, str]) -> Path:
    home = Path(environ.get("HOME", "~")).expanduser()
    if manager == "launchd":
        return home / "Library/LaunchAgents" if scope == "user" else Path("/Library/LaunchDaemons")
    if scope == "system":
        return Path("/etc/systemd/system")
    return Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "systemd" / "user"


def console_script(environ: Mapping[str, str]) -> str:
    """The installed ``tidemesh`` script, absolute: the one beside this Python, else PATH's."""
    beside = Path(sys.executable).parent / "tidemesh"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("tidemesh", path=environ.get("PATH"))
    if found is None:
        raise ServiceError("cannot find the installed `tidemesh` console script; install "
                            "tidemesh (pip install .) so the service has a program to run")
    return str(Path(found).absolute())


def _service_env(target: Target, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the service will run with, as far as tidemesh's paths depend on it."""
    env = {k: environ[k] for k in PINNED_ENV if environ.get(k)}
    env["HOME"] = environ.get("HOME", str(Path.home()))
    if target.scope == "system" and "TIDEMESH_HOME" not in env:
        env["TIDEMESH_HOME"] = SYSTEM_HOME[target.manager]
    if target.manager == "systemd" and target.scope == "user":
        # systemd --user always gives its services XDG_RUNTIME_DIR (/run/user/UID).
        env["XDG_RUNTIME_DIR"] = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return env


def _pinned(env: Mapping[str, str], target: Target) -> tuple[tuple[str, str], ...]:
    pairs = [(k, env[k]) for k in PINNED_ENV if k in env]
    if target.manager == "systemd":
        pairs.append(("TIDEMESH_LOG_FORMAT", "json"))
    return tuple(pairs)


def _system_state_dir(env: Mapping[str, str], target: Target) -> str | None:
    # The default system home is made by systemd (StateDirectory=) for the service account.
    if target.manager == "systemd" and target.scope == "system" and \
            env.get("TIDEMESH_HOME") == SYSTEM_HOME["systemd"]:
        return "tidemesh"
    return None


def _in_tmp(env: Mapping[str, str], folders: list[Path], *more: Path) -> bool:
    """Whether the service keeps anything under /tmp, which PrivateTmp would hide from it."""
    found = [*folders, *more, *([Path(env["TIDEMESH_HOME"])] if env.get("TIDEMESH_HOME")
                               else [])]
    return any(under_tmp(str(f.absolute())) for f in found)


def daemon_spec(mesh: str, target: Target, environ: Mapping[str, str],
                run_as: str | None) -> tuple[ServiceSpec, list[Path]]:
    """The daemon's service, and the folders install must create for it."""
    env = _service_env(target, environ)
    paths = daemon_paths(mesh, env)
    argv = [console_script(environ), "daemon", "up", "--foreground", "--mesh", mesh]
    runtime_directory = None
    folders = sorted(paths.folders)
    xdg_runtime = env.get("XDG_RUNTIME_DIR")
    if target.manager == "systemd" and xdg_runtime and \
            paths.runtime_dir.is_relative_to(xdg_runtime):
        # /run/user/UID is emptied at logout and reboot: let systemd make the folder each start.
        runtime_directory = str(paths.runtime_dir.relative_to(xdg_runtime))
        folders.remove(paths.runtime_dir)
    log_file = None
    if target.manager == "launchd":
        # No journal under launchd: the daemon rotates its own log; stray output goes beside it.
        argv += ["--log-file", str(paths.log_file)]
        log_file = str(paths.state_dir / "daemon.stderr.log")
    state_directory = _system_state_dir(env, target)
    # A folder inside another (hooks/ in the config folder) is writable through its parent.
    writable = () if state_directory else tuple(
        str(f) for f in folders if not any(f != g and f.is_relative_to(g) for g in folders))
    spec = ServiceSpec(
        name=f"tidemesh-daemon-{mesh}", label=f"dev.tidemesh.daemon.{mesh}",
        description=f"tidemesh daemon for mesh {mesh}", scope=target.scope, argv=tuple(argv),
        environment=_pinned(env, target), writable=writable,
        runtime_directory=runtime_directory, state_directory=state_directory,
        user=run_as if target.scope == "system" else None, log_file=log_file,
        reloads_on_sighup=True, private_tmp=not _in_tmp(env, folders, paths.runtime_dir),
        # Revoked from the mesh: every restart would be refused the same way.
        final_exits=(int(Exit.REVOKED),),
    )
    return spec, ([] if state_directory else folders)


def broker_store(flag: str | None, env: Mapping[str, str], environ: Mapping[str, str]
                 ) -> tuple[str | None, str]:
    """The store the service must start on: ``(url for --store or None, url)``.

    None when the service finds it by itself (broker.toml, which it reads too, or the
    embedded default). A store named only by this shell (``TIDEMESH_BROKER_STORE``) or only
    by the running broker's command line goes into ExecStart, or the service would start on
    an empty embedded store; two that disagree are refused rather than guessed between."""
    merged = {**env, **({"TIDEMESH_BROKER_STORE": environ["TIDEMESH_BROKER_STORE"]}
                        if environ.get("TIDEMESH_BROKER_STORE") else {})}
    _, resolved = broker_config.load(
        broker_config.read_file(broker_config.config_file(env)), merged,
        {"broker.store": flag})
    found, source = resolved["broker.store"].value, resolved["broker.store"].source
    live = running.find(env) or running.last(env)
    if source != "flag" and live is not None and found and live.store != found:
        where = ("TIDEMESH_BROKER_STORE" if source == "env"
                 else str(broker_config.config_file(env)))
        raise ServiceError(f"the broker (pid {live.pid}) uses another store than "
                           f"{where} names; say which one the service starts on with --store")
    if source == "file":
        return None, str(found)
    chosen = found or (live.store if live is not None else None)
    if chosen is None:
        return None, f"sqlite:///{broker_config.embedded_store(env)}"
    if store_source.has_password(chosen):
        raise ServiceError("the store's URL holds a password, and a unit file is readable by "
                           f"every user; put broker.store in {broker_config.config_file(env)} "
                           "(mode 0600) or the password in ~/.pgpass, then install again")
    return chosen, chosen


def broker_spec(target: Target, environ: Mapping[str, str], run_as: str | None,
                store: str | None = None) -> tuple[ServiceSpec, list[Path]]:
    env = _service_env(target, environ)
    home = broker_home(env)
    folders = [home]
    pinned, url = broker_store(store, env, environ)
    if url.startswith("sqlite://"):
        # The store file's folder, which WAL and journal files are created in.
        folders.append(Path(url.removeprefix("sqlite://")).parent)
    folders = sorted(set(folders))
    state_directory = _system_state_dir(env, target)
    argv = (console_script(environ), "broker", "up", *(("--store", pinned) if pinned else ()))
    spec = ServiceSpec(
        name="tidemesh-broker", label="dev.tidemesh.broker", description="tidemesh broker",
        scope=target.scope, argv=argv,
        environment=_pinned(env, target),
        writable=() if state_directory else tuple(str(f) for f in folders),
        state_directory=state_directory, user=run_as if target.scope == "system" else None,
        log_file=str(home / "broker.log") if target.manager == "launchd" else None,
        private_tmp=not _in_tmp(env, folders),
    )
    return spec, ([] if state_directory else folders)


def _no_bus_hint(argv: list[str], output: str) -> str:
    if "Failed to connect to bus" not in output and "No medium found" not in output:
        return ""
    if "--user" in argv:
        return ("; there is no user service manager to talk to (no login session: "
                "XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS unset, as under su or sudo). "
                "Log in as this user (ssh, machinectl shell USER@), run `loginctl "
                "enable-linger USER` so it keeps one, install with --system, or write the "
                "file only with --unit-dir DIR")
    return "; systemd is not running here (a container?): write the file only with --unit-dir DIR"


def _run_all(commands: list[list[str]], check: bool) -> None:
    for argv in commands:
        try:
            res = subprocess.run(argv, capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            fail(ServiceError(f"{argv[0]} is not installed here: {exc}"))
        if res.returncode != 0 and check:
            output = (res.stderr or res.stdout).strip()
            fail(ServiceError(f"`{' '.join(argv)}` failed ({res.returncode}): {output}"
                              + _no_bus_hint(argv, output)))


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    tmp.chmod(0o644)
    tmp.replace(path)  # atomic: the manager never reads half a unit


def _require_account(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        fail(ServiceError(f"there is no account {user!r} to run the service as; create it "
                           f"(useradd --system {user}) or pass --run-as USER"))


def install(spec: ServiceSpec, folders: list[Path], target: Target, dry_run: bool,
            allow_ci: bool) -> None:
    path = target.file_for(spec)
    content = target.render(spec)
    commands = [] if target.write_only else target.load_commands(spec, path)
    if spec.user:
        _require_account(spec.user)   # a dry run too: the unit would not start without it
    if not spec.private_tmp and target.manager == "systemd":
        click.echo("warning: the service's folders are under /tmp, so the unit goes without "
                   "PrivateTmp (a private /tmp would hide them); /tmp may be emptied at boot: "
                   "set TIDEMESH_HOME to a lasting folder and install again", err=True)
    if dry_run:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
        click.echo(f"# would write {path}" + (" and run: " + "; ".join(
            " ".join(c) for c in commands) if commands else " (and load nothing)"), err=True)
        return
    ci = ci_environment(os.environ)
    if ci and not allow_ci:
        click.echo(f"error: refusing to install a persistent service in a CI environment "
                   f"({ci} is set); pass --allow-ci-persistent if this host is meant to keep "
                   "it", err=True)
        sys.exit(int(Exit.USAGE))
    # A --system service runs as its own account, which must own the folders made for it.
    hand_over = spec.user if spec.user and os.geteuid() == 0 else None
    if not target.write_only:
        _run_all(target.probe_commands(), check=True)   # before anything is written
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if hand_over:
                shutil.chown(folder, user=hand_over)
        _write(path, content)
    except OSError as exc:
        hint = " (a --system service is installed as root)" if target.scope == "system" else ""
        fail(ServiceError(f"cannot write {exc.filename or path}: {exc.strerror}{hint}"))
    if target.write_only:
        click.echo(f"wrote {path}; nothing loaded ({target.unit_dir} is not the service "
                   f"manager's folder): to run it, {_load_hint(target, spec, path)}")
        return
    _run_all(target.prepare_commands(spec), check=False)
    _run_all(commands, check=True)
    name = spec.unit_file if target.manager == "systemd" else spec.label
    click.echo(f"installed {path} and started {name}")


def _load_hint(target: Target, spec: ServiceSpec, path: Path) -> str:
    if target.manager == "systemd":
        ctl = " ".join(target._systemctl())
        return f"`{ctl} link {path}` then `{ctl} enable --now {spec.unit_file}`"
    return f"`launchctl bootstrap {target._domain()} {path}`"


def uninstall(spec: ServiceSpec, target: Target, dry_run: bool) -> None:
    path = target.file_for(spec)
    commands = [] if target.write_only else target.unload_commands(spec)
    if dry_run:
        click.echo(f"would run: {'; '.join(' '.join(c) for c in commands)}; remove {path}")
        return
    # Stopping one that is not loaded fails; removing its file is still what was asked.
    _run_all(commands, check=False)
    path.unlink(missing_ok=True)
    if target.write_only:
        click.echo(f"removed {path} (--unit-dir: nothing was loaded from it)")
        return
    _run_all(target.after_remove_commands(), check=False)
    click.echo(f"stopped and removed {path}")


def target_options(fn: F) -> F:
    opts = [
        click.option("--user", "scope", flag_value="user", default=True,
                     help="Per-user service (systemctl --user, LaunchAgents). The default."),
        click.option("--system", "scope", flag_value="system",
                     help="System-wide service (run as root; runs as --run-as)."),
        click.option("--manager", type=click.Choice(["systemd", "launchd"]), default=None,
                     help="Service manager; default: launchd on macOS, systemd elsewhere."),
        click.option("--unit-dir", type=click.Path(path_type=Path), default=None,
                     help="Only write the unit, here instead of the manager's own folder "
                          "(for packaging): nothing is loaded or started."),
        click.option("--dry-run", is_flag=True, help="Print what would be written; change "
                     "nothing."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def install_options(fn: F) -> F:
    fn = click.option("--allow-ci-persistent", "allow_ci", is_flag=True,
                      help="Install even though a CI environment variable is set.")(fn)
    return click.option("--run-as", default="tidemesh", show_default=True,
                        help="Account a --system service runs as.")(fn)


def make_target(scope: str, manager: str | None, unit_dir: Path | None) -> Target:
    kind = manager or ("launchd" if sys.platform == "darwin" else "systemd")
    return Target(kind, scope, unit_dir or default_unit_dir(kind, scope, os.environ),
                  write_only=unit_dir is not None)


def _spec_or_fail(build: Callable[[], tuple[ServiceSpec, list[Path]]]
                  ) -> tuple[ServiceSpec, list[Path]]:
    try:
        return build()
    except TidemeshError as exc:
        fail(exc)
    except ValueError as exc:
        fail(ServiceError(str(exc)))


@click.command("install-service")
@mesh_option
@target_options
@install_options
def daemon_install(mesh: str, scope: str, manager: str | None, unit_dir: Path | None,
                   dry_run: bool, allow_ci: bool, run_as: str) -> None:
    """Write, load and start a service that runs this mesh's daemon."""
    target = make_target(scope, manager, unit_dir)
    spec, folders = _spec_or_fail(lambda: daemon_spec(mesh, target, os.environ, run_as))
    install(spec, folders, target, dry_run, allow_ci)


@click.command("uninstall-service")
@mesh_option
@target_options
def daemon_uninstall(mesh: str, scope: str, manager: str | None, unit_dir: Path | None,
                     dry_run: bool) -> None:
    """Stop, unload and remove this mesh's daemon service (data stays)."""
    target = make_target(scope, manager, unit_dir)
    spec, _ = _spec_or_fail(lambda: daemon_spec(mesh, target, os.environ, None))
    uninstall(spec, target, dry_run)


@click.command("install-service")
@target_options
@install_options
@click.option("--store", default=None, metavar="URL",
              help="The store the service starts on; default: broker.toml's, else "
                   "TIDEMESH_BROKER_STORE's, else the running (or last run) broker's, else "
                   "embedded SQLite.")
def broker_install(scope: str, manager: str | None, unit_dir: Path | None, dry_run: bool,
                   allow_ci: bool, run_as: str, store: str | None) -> None:
    """Write, load and start a service that runs the broker on the store it uses now (a
    store named only by this shell or the running broker goes into ExecStart)."""
    target = make_target(scope, manager, unit_dir)
    spec, folders = _spec_or_fail(lambda: broker_spec(target, os.environ, run_as, store))
    install(spec, folders, target, dry_run, allow_ci)


@click.command("uninstall-service")
@target_options
def broker_uninstall(scope: str, manager: str | None, unit_dir: Path | None,
                     dry_run: bool) -> None:
    """Stop, unload and remove the broker service (the store stays)."""
    target = make_target(scope, manager, unit_dir)
    spec, _ = _spec_or_fail(lambda: broker_spec(target, os.environ, None))
    uninstall(spec, target, dry_run)
