"""A daemon whose socket file was deleted or replaced binds it again, so every CLI verb
reaches it again without a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tidemesh.client import Client, DaemonNotRunning


def _answers(d: RunningDaemon, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            Client(d.paths.socket, timeout=1.0).version()
            return True
        except DaemonNotRunning:
            time.sleep(0.1)
    return False


@pytest.mark.parametrize("damage", ["deleted", "replaced"])
def test_a_lost_socket_file_is_bound_again(short_tmp: Path, damage: str) -> None:
    d = start_daemon(short_tmp, mesh="s")
    try:
        d.paths.socket.unlink()
        if damage == "replaced":
            d.paths.socket.write_text("not a socket")
        assert _answers(d), d.log.read_text()[-2000:]
        status = run_cli(short_tmp, "daemon", "status", "--mesh", "s", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == d.proc.pid
        sent = run_cli(short_tmp, "send", "--mesh", "s", "--to", "topic:ops", "hi")
        assert sent.returncode == 0 and "via daemon" in sent.stdout, sent.stderr
        assert "ipc_socket_recreated" in d.log.read_text()
    finally:
        assert d.stop() == 0
