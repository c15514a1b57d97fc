"""Two meshes' daemons on one host, operated together: ps, up/down --all, restart, logs -f."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import daemon_env, run_cli
from tests.e2e.harness import Broker

pytestmark = pytest.mark.slow


@pytest.fixture
def home(sqlite_broker: Broker, short_tmp: Path) -> Iterator[Path]:
    """One user's home with two joined meshes, team and ops; every daemon stopped after."""
    sqlite_broker.cli("mesh", "create", "ops")
    home = short_tmp / "u"
    home.mkdir()
    for mesh in ("team", "ops"):
        res = run_cli(home, "daemon", "join", sqlite_broker.invite(mesh), "--mesh", mesh)
        assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        run_cli(home, "daemon", "down", "--all")


def _ps(home: Path) -> dict[str, dict[str, object]]:
    res = run_cli(home, "daemon", "ps", "--json")
    assert res.returncode == 0, res.stderr
    return {r["mesh"]: r for r in json.loads(res.stdout)["items"]}


def _wait(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_up_all_ps_restart_logs_and_down_all(home: Path) -> None:
    assert {m: r["state"] for m, r in _ps(home).items()} == {"ops": "stopped",
                                                             "team": "stopped"}
    up = run_cli(home, "daemon", "up", "--all")
    assert up.returncode == 0, up.stderr
    assert "mesh team" in up.stdout and "mesh ops" in up.stdout
    _wait(lambda: all(r["connected"] for r in _ps(home).values()))
    rows = _ps(home)
    assert {r["state"] for r in rows.values()} == {"running"}
    assert rows["team"]["pid"] != rows["ops"]["pid"]
    human = run_cli(home, "daemon", "ps").stdout
    assert "team" in human and "ops" in human and "running" in human

    # Follow ops's log while it restarts: the new process's start shows up in the stream.
    follower = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "daemon", "logs", "--mesh", "ops", "-f", "--json",
         "--since", "1h"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=daemon_env(home))
    try:
        old_pid = rows["ops"]["pid"]
        restarted = run_cli(home, "daemon", "restart", "--mesh", "ops")
        assert restarted.returncode == 0, restarted.stderr
        new_pid = _ps(home)["ops"]["pid"]
        assert new_pid not in (None, old_pid)
        assert follower.stdout is not None
        started: list[object] = []
        deadline = time.monotonic() + 30
        while new_pid not in started:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([follower.stdout], [], [], max(0.0, left))
            assert ready, f"no daemon_started for pid {new_pid} (saw {started})"
            record = json.loads(follower.stdout.readline())
            if record["event"] == "daemon_started":
                started.append(record["pid"])
        assert started[0] == old_pid, "the history before the restart comes first"
    finally:
        follower.terminate()
        follower.wait(10)
    assert _ps(home)["team"]["pid"] == rows["team"]["pid"], "restart touched one mesh only"

    pretty = run_cli(home, "daemon", "logs", "--mesh", "team")
    started_line = next(x for x in pretty.stdout.splitlines() if " daemon_started " in x)
    assert pretty.returncode == 0 and " mesh=team " in started_line
    assert not started_line.startswith("{"), "pretty by default, JSON with --json"
    assert run_cli(home, "daemon", "logs", "--mesh", "team", "--since", "5x").returncode == 2

    down = run_cli(home, "daemon", "down", "--all")
    assert down.returncode == 0, down.stderr
    assert {r["state"] for r in _ps(home).values()} == {"stopped"}
    assert run_cli(home, "daemon", "down", "--all").returncode == 0, "already stopped is fine"
    assert run_cli(home, "daemon", "down").returncode == 2, "several joined: say which"


def test_up_json_for_scripts(home: Path) -> None:
    first = run_cli(home, "daemon", "up", "--mesh", "team", "--json")
    assert first.returncode == 0, first.stderr
    started = json.loads(first.stdout)
    assert (started["mesh"], started["started"]) == ("team", True)
    again = run_cli(home, "daemon", "up", "--all", "--json")
    assert again.returncode == 0, again.stderr
    items = {i["mesh"]: i for i in json.loads(again.stdout)["items"]}
    assert items["team"] == {**started, "started": False}
    assert items["ops"]["started"] is True
