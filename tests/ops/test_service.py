"""install-service / uninstall-service: the unit text (checked by the real systemd-analyze and
plistlib), what install writes and runs, and the refusal inside CI."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.e2e.harness import Broker
from tests.ops.conftest import Host
from tidemesh.core.environment import ci_environment
from tidemesh.core.exitcodes import Exit
from tidemesh.core.service_unit import ServiceSpec, systemd_unit

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).parent / "tidemesh")
ROLES = {"daemon": ("daemon", "install-service", "--mesh", "ops"),
         "broker": ("broker", "install-service")}
UNIT_NAMES = {"daemon": "tidemesh-daemon-ops.service", "broker": "tidemesh-broker.service"}
HARDENING = ("Restart=on-failure", "NoNewPrivileges=yes", "PrivateTmp=",
             "ProtectSystem=strict", "ProtectHome=read-only", "LimitNOFILE=4096",
             "MemoryMax=", "TasksMax=", "StartLimitBurst=")


def _console_script_name() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (name,) = [n for n, target in scripts.items() if target == "tidemesh.cli.main:main"]
    return str(name)


def _verify(unit: Path, scope: str, runtime: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        unavailable("systemd-analyze is not installed (scripts/system-deps installs `systemd`)")
    assert tool is not None
    runtime.mkdir(mode=0o700, exist_ok=True)
    res = subprocess.run([tool, "verify", f"--{scope}", str(unit)], capture_output=True,
                         text=True, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
                         check=False)
    # systemd-analyze only warns (exit 0) about a directive it could not parse; any line
    # naming our unit is such a warning.
    warnings = [line for line in res.stderr.splitlines() if unit.name in line]
    assert res.returncode == 0 and warnings == [], res.stderr


@pytest.mark.parametrize("scope", ["user", "system"])
@pytest.mark.parametrize("role", ["daemon", "broker"])
def test_generated_unit_passes_systemd_analyze_and_runs_the_console_script(
        host: Host, role: str, scope: str) -> None:
    code, unit, err = host.run(*ROLES[role], f"--{scope}", "--manager", "systemd", "--dry-run",
                               "--run-as", "daemon")
    assert code == 0, err
    path = host.root / "units" / UNIT_NAMES[role]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(unit)
    _verify(path, scope, host.root / "rt")
    text = unit.decode()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    program = exec_start.removeprefix("ExecStart=").split()
    assert program[0] == SCRIPT and Path(program[0]).name == _console_script_name()
    assert program[1:3] == [role, "up"]
    for directive in HARDENING:
        assert directive in text, directive
    if scope == "user":
        assert f"Environment=TIDEMESH_HOME={host.env['TIDEMESH_HOME']}" in text
        assert "ReadWritePaths=" + host.env["TIDEMESH_HOME"] in text
    else:
        assert "User=daemon" in text
    if role == "daemon":
        assert "--foreground" in program and "ExecReload=/bin/kill -HUP $MAINPID" in text


@pytest.mark.parametrize("role", ["daemon", "broker"])
def test_a_revoked_daemon_is_not_restarted_by_systemd(host: Host, role: str) -> None:
    code, unit, err = host.run(*ROLES[role], "--manager", "systemd", "--dry-run")
    assert code == 0, err
    prevent = [line for line in unit.decode().splitlines()
               if line.startswith("RestartPreventExitStatus=")]
    # The broker never exits "revoked"; only the daemon's unit names the code.
    assert prevent == ([f"RestartPreventExitStatus={int(Exit.REVOKED)}"]
                       if role == "daemon" else [])


def test_paths_with_blanks_and_percent_are_quoted_for_systemd(short_tmp: Path) -> None:
    odd = "/srv/tide mesh/100%"
    spec = ServiceSpec(name="tidemesh-daemon-x", label="dev.tidemesh.daemon.x",
                       description="x", scope="system", argv=("/bin/true", "--dir", odd),
                       environment=(("TIDEMESH_HOME", odd),), writable=(odd,))
    text = systemd_unit(spec)
    assert 'ExecStart=/bin/true --dir "/srv/tide mesh/100%%"' in text
    assert 'Environment="TIDEMESH_HOME=/srv/tide mesh/100%%"' in text
    unit = short_tmp / "tidemesh-daemon-x.service"
    unit.write_text(text)
    _verify(unit, "system", short_tmp / "rt")


@pytest.mark.parametrize("role", ["daemon", "broker"])
def test_launchd_plist_parses_and_has_the_expected_keys(host: Host, role: str) -> None:
    code, out, err = host.run(*ROLES[role], "--manager", "launchd", "--dry-run")
    assert code == 0, err
    plist = plistlib.loads(out)
    assert plist["Label"] == ("dev.tidemesh.daemon.ops" if role == "daemon"
                              else "dev.tidemesh.broker")
    assert plist["ProgramArguments"][:3] == [SCRIPT, role, "up"]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardOutPath"] == plist["StandardErrorPath"]
    assert plist["StandardOutPath"].startswith(host.env["TIDEMESH_HOME"])
    assert plist["EnvironmentVariables"]["TIDEMESH_HOME"] == host.env["TIDEMESH_HOME"]
    if role == "daemon":
        # No journal under launchd: the daemon rotates its own log file.
        args = plist["ProgramArguments"]
        assert args[args.index("--log-file") + 1].endswith("daemon.log")


@pytest.mark.parametrize(("manager", "scope"), [("systemd", "user"), ("launchd", "user")])
def test_dry_run_prints_exactly_what_install_writes_then_uninstall_removes_it(
        host: Host, manager: str, scope: str) -> None:
    units = (host.root / "home" / ".config/systemd/user" if manager == "systemd"
             else host.root / "home" / "Library/LaunchAgents")
    args = (*ROLES["daemon"], f"--{scope}", "--manager", manager)
    code, dry, err = host.run(*args, "--dry-run")
    assert code == 0, err
    assert not units.exists() and host.calls == [], "a dry run changes nothing"
    code, _, err = host.run(*args)
    assert code == 0, err
    (written,) = units.iterdir()
    assert written.read_bytes() == dry
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    if manager == "systemd":
        ctl = "systemctl --user"
        assert host.calls == [f"{ctl} show-environment", f"{ctl} daemon-reload",
                              f"{ctl} enable {written.name}", f"{ctl} restart {written.name}"]
    else:
        assert host.calls[-1] == f"launchctl bootstrap gui/{os.getuid()} {written}"
    data_dir = Path(host.env["TIDEMESH_HOME"]) / "daemon" / "ops"
    assert data_dir.is_dir(), "install makes the folders the service may write"
    before = len(host.calls)
    code, _, err = host.run("daemon", "uninstall-service", "--mesh", "ops", f"--{scope}",
                            "--manager", manager)
    assert code == 0, err
    assert list(units.iterdir()) == []
    stop = host.calls[before]
    assert ("disable --now" in stop) if manager == "systemd" else stop.startswith(
        "launchctl bootout")


@pytest.mark.parametrize(("manager", "scope"), [("systemd", "user"), ("systemd", "system"),
                                                ("launchd", "user")])
def test_unit_dir_only_writes_the_file_and_says_how_to_load_it(
        host: Host, manager: str, scope: str) -> None:
    units = host.root / "units"
    args = (*ROLES["daemon"], f"--{scope}", "--manager", manager, "--unit-dir", str(units),
            "--run-as", "nobody")
    code, dry, err = host.run(*args, "--dry-run")
    assert code == 0 and "load nothing" in err, err
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         text=True, env=host.env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    (written,) = units.iterdir()
    assert written.read_bytes() == dry
    assert host.calls == [], "a folder the manager does not read: nothing to load"
    assert "nothing loaded" in res.stdout and str(written) in res.stdout
    assert ("link" in res.stdout) if manager == "systemd" else ("bootstrap" in res.stdout)
    data_dir = Path(host.env["TIDEMESH_HOME"]) / "daemon" / "ops"
    assert data_dir.is_dir(), "install makes the folders the service may write"
    if scope == "system" and os.geteuid() == 0:
        assert data_dir.owner() == "nobody", "and gives them to the account it runs as"
    code, _, err = host.run("daemon", "uninstall-service", "--mesh", "ops", f"--{scope}",
                            "--manager", manager, "--unit-dir", str(units))
    assert code == 0, err
    assert list(units.iterdir()) == [] and host.calls == []


def test_no_user_bus_is_explained_before_anything_is_written(host: Host) -> None:
    code, _, err = host.run(*ROLES["daemon"], "--manager", "systemd", extra={
        "FAKE_MANAGER_EXIT": "1",
        "FAKE_MANAGER_STDERR": "Failed to connect to bus: No medium found"})
    assert code == 1 and "Failed to connect to bus" in err
    assert "loginctl enable-linger" in err and "--unit-dir" in err
    assert host.calls == ["systemctl --user show-environment"]
    assert not (host.root / "home" / ".config/systemd/user").exists()


def test_a_system_dry_run_refuses_a_missing_service_account(host: Host) -> None:
    code, unit, err = host.run(*ROLES["broker"], "--system", "--dry-run",
                               "--run-as", "no-such-tidemesh-user")
    assert code == 1 and unit == b"" and "no-such-tidemesh-user" in err and "--run-as" in err


def test_a_home_under_tmp_goes_without_private_tmp_and_says_so(host: Host) -> None:
    assert host.env["TIDEMESH_HOME"].startswith("/tmp/")
    for role in ROLES:
        code, unit, err = host.run(*ROLES[role], "--manager", "systemd", "--dry-run")
        assert code == 0, err
        assert "PrivateTmp=no" in unit.decode().splitlines() and "/tmp" in err, err
        code, unit, err = host.run(*ROLES[role], "--manager", "systemd", "--dry-run", extra={
            "TIDEMESH_HOME": str(Path.home() / "tm-not-made")})
        assert code == 0 and "PrivateTmp=yes" in unit.decode().splitlines(), err
        assert "warning" not in err


def test_a_failing_service_manager_fails_the_install(host: Host) -> None:
    code, _, err = host.run(*ROLES["broker"], "--manager", "systemd",
                            extra={"FAKE_MANAGER_EXIT": "1"})
    assert code != 0 and "systemctl" in err


@pytest.mark.parametrize("variable", ["CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE",
                                      "CIRCLECI", "JENKINS_URL"])
def test_install_refuses_inside_ci_unless_allowed(host: Host, variable: str) -> None:
    units = host.root / "units"
    args = (*ROLES["daemon"], "--unit-dir", str(units))
    ci = {variable: "true" if variable != "JENKINS_URL" else "https://jenkins.example/"}
    code, _, err = host.run(*args, extra=ci)
    assert code == 2 and variable in err and "--allow-ci-persistent" in err
    assert not units.exists() and host.calls == []
    code, dry, err = host.run(*args, "--dry-run", extra=ci)
    assert code == 0 and dry, "a dry run writes nothing, so CI may run it"
    code, _, err = host.run(*args, "--allow-ci-persistent", extra=ci)
    assert code == 0, err
    assert len(list(units.iterdir())) == 1


def test_ci_detection_ignores_false_values() -> None:
    assert ci_environment({"CI": "false", "GITHUB_ACTIONS": ""}) is None
    assert ci_environment({"CI": "0", "BUILDKITE": "true"}) == "BUILDKITE"


def test_a_missing_service_account_is_named(host: Host) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root hands folders over to a service account")
    code, _, err = host.run(*ROLES["daemon"], "--system", "--unit-dir", str(host.root / "u"),
                            "--run-as", "no-such-tidemesh-user")
    assert code == 1 and "no-such-tidemesh-user" in err and "--run-as" in err
    assert not (host.root / "u").exists() and host.calls == []
    assert not Path(host.env["TIDEMESH_HOME"]).exists()


def test_an_unwritable_unit_folder_is_one_error_line_not_a_traceback(host: Host) -> None:
    blocker = host.root / "not-a-folder"
    blocker.write_text("")
    code, _, err = host.run(*ROLES["broker"], "--unit-dir", str(blocker / "units"))
    assert code == 1 and "cannot write" in err and "Traceback" not in err
    assert host.calls == []


def test_xdg_layout_gets_a_runtime_directory_and_writable_data_folders(host: Host) -> None:
    env = {k: v for k, v in host.env.items() if k != "TIDEMESH_HOME"}
    runtime = host.root / "run"
    xdg = Host(host.root, {**env, "XDG_RUNTIME_DIR": str(runtime)})
    code, unit, err = xdg.run(*ROLES["daemon"], "--user", "--manager", "systemd", "--dry-run")
    assert code == 0, err
    lines = unit.decode().splitlines()
    assert "RuntimeDirectory=tidemesh/daemon/ops" in lines
    home = host.env["HOME"]
    assert [x for x in lines if x.startswith("ReadWritePaths=")] == [
        f"ReadWritePaths={home}/.config/tidemesh/daemon/ops",
        f"ReadWritePaths={home}/.local/share/tidemesh/daemon/ops",
        f"ReadWritePaths={home}/.local/state/tidemesh/daemon/ops"]
    path = host.root / UNIT_NAMES["daemon"]
    path.write_bytes(unit)
    _verify(path, "user", host.root / "rt")


def _exec_start(unit: bytes) -> list[str]:
    line = next(x for x in unit.decode().splitlines() if x.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def test_the_broker_unit_starts_on_the_store_the_running_broker_uses(host: Host) -> None:
    elsewhere = host.root / "elsewhere"
    elsewhere.mkdir()
    store = f"sqlite://{elsewhere}/broker.db"
    broker = Broker(Path(host.env["TIDEMESH_HOME"]), store)
    Path(host.env["TIDEMESH_HOME"]).mkdir()
    broker.start()
    try:
        code, unit, err = host.run(*ROLES["broker"], "--manager", "systemd", "--dry-run")
        assert code == 0, err
        assert _exec_start(unit)[1:] == ["broker", "up", "--store", store]
        assert f"ReadWritePaths={elsewhere}" in unit.decode().splitlines()
        # The same store named by this shell too: pinned, not guessed.
        code, unit, err = host.run(*ROLES["broker"], "--dry-run",
                                   extra={"TIDEMESH_BROKER_STORE": store})
        assert code == 0 and _exec_start(unit)[-2:] == ["--store", store], err
        # This shell names another store than the running broker's: which one is meant?
        other = f"sqlite://{host.root}/other.db"
        code, unit, err = host.run(*ROLES["broker"], "--dry-run",
                                   extra={"TIDEMESH_BROKER_STORE": other})
        assert code == 1 and unit == b"" and "--store" in err and "TIDEMESH_BROKER_STORE" in err
        code, unit, err = host.run(*ROLES["broker"], "--dry-run", "--store", other)
        assert code == 0 and _exec_start(unit)[-2:] == ["--store", other], err
    finally:
        broker.stop()


def test_a_store_named_only_by_this_shell_is_pinned_unless_it_holds_a_password(
        host: Host) -> None:
    url = "postgresql://tm@db.example/tidemesh"
    code, unit, err = host.run(*ROLES["broker"], "--dry-run",
                               extra={"TIDEMESH_BROKER_STORE": url})
    assert code == 0 and _exec_start(unit)[-2:] == ["--store", url], err
    code, unit, err = host.run(*ROLES["broker"], "--dry-run",
                               extra={"TIDEMESH_BROKER_STORE": "postgresql://tm:s3cret@db/x"})
    assert code == 1 and unit == b"" and "password" in err and "s3cret" not in err
    # Named by broker.toml, which the service reads too: nothing to pin.
    toml = Path(host.env["TIDEMESH_HOME"]) / "broker" / "broker.toml"
    toml.parent.mkdir(parents=True)
    toml.write_text(f'[broker]\nstore = "{url}"\n')
    code, unit, err = host.run(*ROLES["broker"], "--dry-run")
    assert code == 0 and _exec_start(unit)[1:] == ["broker", "up"], err
