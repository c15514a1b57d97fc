"""A broker whose event loop stops turning says so: its stacks in the log, a count, and
/healthz answering 503 ``stalled`` (``rigged_broker.py`` blocks the loop)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.e2e.harness import Broker

RIG = (sys.executable, str(Path(__file__).with_name("rigged_broker.py")))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - loopback
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_blocked_broker_loop_leaves_its_stack_count_and_health(short_tmp: Path) -> None:
    b = Broker(short_tmp, f"sqlite://{short_tmp}/broker.db",
               env={"TIDEMESH_WATCHDOG_STALL_S": "1", "TIDEMESH_LOG_FORMAT": "json"},
               launcher=RIG)
    b.start()
    try:
        base = f"http://127.0.0.1:{b.port}"
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/test/block?s=2.5")[0] == 200
        assert _get(f"{base}/healthz") == (503, "stalled\n")
        assert "cm_broker_loop_stalls_total 1.0" in _get(f"{base}/metrics")[1]
    finally:
        assert b.stop() == 0
    lines = [json.loads(line) for line in (short_tmp / "broker.out").read_text().splitlines()
             if line.startswith("{") and '"loop_stalled"' in line]
    assert len(lines) == 1
    assert "blocking_http" in "".join(lines[0]["stacks"].values())
