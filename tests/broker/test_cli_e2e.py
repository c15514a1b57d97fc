"""The operator flow through real processes: broker up, mesh create, invite, daemon join."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tidemesh.core.paths import daemon_paths


def _tm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json"}
    return subprocess.run([sys.executable, "-m", "tidemesh", *args], env=env, text=True,
                          capture_output=True, timeout=60, check=False)


@pytest.mark.slow
def test_invite_then_join_then_list(tmp_path: Path) -> None:
    ops, host = tmp_path / "ops", tmp_path / "host"
    assert _tm(ops, "broker", "mesh", "create", "team").returncode == 0
    env = {**os.environ, "TIDEMESH_HOME": str(ops), "TIDEMESH_LOG_FORMAT": "json"}
    broker = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--listen",
                               "127.0.0.1:0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert broker.stdout is not None
        url = json.loads(broker.stdout.readline())["url"]
        invite = _tm(ops, "broker", "invite", "create", "--mesh", "team", "--url", url)
        assert invite.returncode == 0, invite.stderr
        joined = _tm(host, "daemon", "join", invite.stdout.strip(), "--name", "laptop")
        assert joined.returncode == 0, joined.stderr
        config = json.loads(daemon_paths("team", {"TIDEMESH_HOME": str(host)})
                            .mesh_file.read_text())
        assert config["broker_url"] == url and config["mesh"] == "team"
        again = _tm(tmp_path / "other", "daemon", "join", invite.stdout.strip())
        assert again.returncode == 8 and "invite_invalid" in again.stderr
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(20) == 0
        assert broker.stdout is not None
        broker.stdout.close()
    members = json.loads(_tm(ops, "broker", "member", "list", "--mesh", "team", "--json").stdout)
    assert [(m["pubkey"], m["display_name"]) for m in members] == [
        (config["member_pubkey"], "laptop")]
