"""`[fleet]` in the user's fleet.toml, with real daemons: max_daemons refuses one more
`daemon up` (detached and foreground) naming the count and the setting; past
total_disk_budget, counted across all the user's meshes, sends get 507 naming the budget and
retention sweeps at once; `daemon ps` shows both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, spawn, start_daemon
from tidemesh.core.errors import InsufficientStorage
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


@pytest.fixture
def daemons(short_tmp: Path) -> Iterator[list[RunningDaemon]]:
    started: list[RunningDaemon] = []
    try:
        yield started
    finally:
        for d in started:
            d.stop()


def _ps(home: Path) -> dict[str, object]:
    res = run_cli(home, "daemon", "ps", "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout)["fleet"])


def test_one_daemon_past_max_daemons_is_refused_with_the_count_and_the_setting(
        short_tmp: Path, daemons: list[RunningDaemon]) -> None:
    (short_tmp / "fleet.toml").write_text("[fleet]\nmax_daemons = 2\n")
    daemons += [start_daemon(short_tmp, "a"), start_daemon(short_tmp, "b")]
    up = run_cli(short_tmp, "daemon", "up", "--mesh", "c")
    assert up.returncode == Exit.USAGE, up.stdout + up.stderr
    assert "2 daemons already run from this tidemesh home (counted in " in up.stderr
    assert ": a, b)" in up.stderr and "another TIDEMESH_HOME" in up.stderr
    assert "fleet.max_daemons (2, " in up.stderr and "fleet.toml" in up.stderr
    # The daemon itself refuses too (a service manager starts it with --foreground).
    proc = spawn(short_tmp, "c")
    assert proc.wait(timeout=30) == Exit.USAGE
    assert "fleet_max_daemons" in (short_tmp / "c.out").read_text()
    fleet = _ps(short_tmp)
    assert (fleet["running"], fleet["max_daemons"]) == (2, 2)
    assert "2 of 2 daemons running" in run_cli(short_tmp, "daemon", "ps").stdout
    # One stops: the next may start.
    daemons.pop().stop()
    daemons.append(start_daemon(short_tmp, "c"))


def test_past_the_disk_budget_of_all_meshes_sends_get_507_and_retention_runs_early(
        short_tmp: Path, daemons: list[RunningDaemon]) -> None:
    # Another mesh's data takes 2 MiB; this one's alone stays far under the 1.5 MiB budget.
    other = short_tmp / "daemon" / "other"
    other.mkdir(parents=True)
    (other / "inbox.db").write_bytes(b"\0" * (2 << 20))
    (short_tmp / "fleet.toml").write_text("[fleet]\ntotal_disk_budget = 1572864\n")
    d = start_daemon(short_tmp, "t", extra_env={"TIDEMESH_RETENTION_SWEEP_INTERVAL_S": "3600"})
    daemons.append(d)
    with pytest.raises(InsufficientStorage) as refused:
        d.client.send({"to": "topic:ops", "body": "x"})
    assert "fleet.total_disk_budget (1572864)" in refused.value.message
    assert refused.value.details["reason"] == "fleet_disk_budget"
    assert d.outbox_rows() == []
    disk = d.client.health()["disk"]
    assert disk["fleet"]["over"] is True and disk["sends_refused"] is True
    # Retention does not wait for its hour: it sweeps at once while the fleet is over.
    deadline = time.monotonic() + 30
    while "retention_sweep_early" not in d.log.read_text():
        assert time.monotonic() < deadline, d.log.read_text()[-2000:]
        time.sleep(0.1)
    fleet = _ps(short_tmp)
    assert fleet["over_disk_budget"] is True and fleet["total_disk_budget"] == 1572864
    assert int(fleet["disk_used_bytes"]) >= 2 << 20  # type: ignore[call-overload]
    # Space freed (the other mesh's data gone): sends are accepted again.
    (other / "inbox.db").unlink()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert d.client.send({"to": "topic:ops", "body": "x"})["status"] == "queued"
            break
        except InsufficientStorage:
            assert time.monotonic() < deadline
            time.sleep(0.2)
