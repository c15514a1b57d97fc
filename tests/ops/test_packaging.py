"""The example units in packaging/ are what the unit builders produce, pass systemd-analyze,
and run the console script that pyproject.toml installs.

After changing core/service_unit.py, rewrite them with
``TIDEMESH_WRITE_PACKAGING=1 .venv/bin/pytest tests/ops/test_packaging.py``.
"""

from __future__ import annotations

import os
import plistlib
from pathlib import Path

import pytest

from tests.ops.test_service import ROOT, _console_script_name, _verify
from tidemesh.core.exitcodes import Exit
from tidemesh.core.service_unit import ServiceSpec, launchd_plist, systemd_unit

SYSTEM_ENV = (("TIDEMESH_HOME", "/var/lib/tidemesh"), ("TIDEMESH_LOG_FORMAT", "json"))
MAC_HOME = "/Users/Shared/tidemesh"
MAC_ENV = (("PATH", "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin"),
           ("TIDEMESH_HOME", MAC_HOME))
# /usr/bin/env finds the script wherever pip put it; install-service writes the absolute path.
DAEMON = ("/usr/bin/env", "tidemesh", "daemon", "up", "--foreground", "--mesh", "default")
BROKER = ("/usr/bin/env", "tidemesh", "broker", "up")

EXAMPLES: dict[str, bytes] = {
    "systemd/tidemesh-daemon-default.service": systemd_unit(ServiceSpec(
        name="tidemesh-daemon-default", label="dev.tidemesh.daemon.default",
        description="tidemesh daemon for mesh default", scope="system", argv=DAEMON,
        environment=SYSTEM_ENV, state_directory="tidemesh", user="tidemesh",
        reloads_on_sighup=True, final_exits=(int(Exit.REVOKED),))).encode(),
    "systemd/tidemesh-broker.service": systemd_unit(ServiceSpec(
        name="tidemesh-broker", label="dev.tidemesh.broker", description="tidemesh broker",
        scope="system", argv=BROKER, environment=SYSTEM_ENV, state_directory="tidemesh",
        user="tidemesh")).encode(),
    "launchd/dev.tidemesh.daemon.default.plist": launchd_plist(ServiceSpec(
        name="tidemesh-daemon-default", label="dev.tidemesh.daemon.default",
        description="tidemesh daemon for mesh default", scope="user",
        argv=(*DAEMON, "--log-file", f"{MAC_HOME}/daemon/default/daemon.log"),
        environment=MAC_ENV, log_file=f"{MAC_HOME}/daemon/default/daemon.stderr.log")),
    "launchd/dev.tidemesh.broker.plist": launchd_plist(ServiceSpec(
        name="tidemesh-broker", label="dev.tidemesh.broker", description="tidemesh broker",
        scope="user", argv=BROKER, environment=MAC_ENV,
        log_file=f"{MAC_HOME}/broker/broker.log")),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_packaging_example_is_what_the_builder_produces(name: str) -> None:
    path = ROOT / "packaging" / name
    if os.environ.get("TIDEMESH_WRITE_PACKAGING"):
        path.write_bytes(EXAMPLES[name])
    assert path.read_bytes() == EXAMPLES[name], (
        f"packaging/{name} is stale; see this module's docstring to rewrite it")


@pytest.mark.parametrize("name", [n for n in sorted(EXAMPLES) if n.startswith("systemd/")])
def test_packaged_systemd_units_verify_and_run_the_console_script(
        name: str, short_tmp: Path) -> None:
    path = ROOT / "packaging" / name
    _verify(path, "system", short_tmp / "rt")
    exec_start = next(line for line in path.read_text().splitlines()
                      if line.startswith("ExecStart="))
    assert exec_start.split()[1] == _console_script_name()


@pytest.mark.parametrize("name", [n for n in sorted(EXAMPLES) if n.startswith("launchd/")])
def test_packaged_plists_parse_and_run_the_console_script(name: str) -> None:
    plist = plistlib.loads((ROOT / "packaging" / name).read_bytes())
    assert plist["ProgramArguments"][1] == _console_script_name()
    assert {"Label", "ProgramArguments", "RunAtLoad", "KeepAlive",
            "StandardOutPath", "StandardErrorPath"} <= set(plist)
