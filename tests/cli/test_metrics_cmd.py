"""``tidemesh daemon metrics`` prints the running daemon's series, filtered and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.harness import run_cli, start_daemon


def test_daemon_metrics_prints_the_series_of_the_running_daemon(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        whole = run_cli(short_tmp, "daemon", "metrics", "--mesh", "t")
        assert whole.returncode == 0, whole.stderr
        assert "# TYPE cm_daemon_ipc_request_total counter" in whole.stdout
        some = run_cli(short_tmp, "daemon", "metrics", "--mesh", "t", "--name", "cm_daemon_disk")
        assert some.returncode == 0 and some.stdout.strip()
        assert all(line.startswith("cm_daemon_disk") for line in some.stdout.splitlines())
        parsed = run_cli(short_tmp, "daemon", "metrics", "--mesh", "t", "--name",
                         "cm_daemon_disk_pct", "--json")
        samples = json.loads(parsed.stdout)["samples"]
        assert {s["labels"]["kind"] for s in samples} == {"outbox", "inbox"}
    finally:
        d.stop()
    gone = run_cli(short_tmp, "daemon", "metrics", "--mesh", "t")
    assert gone.returncode != 0 and "daemon_not_running" in gone.stderr
