"""A daemon whose event loop stops turning says so: stacks in the log, a count, a health
state, and past the limit an exit of its own (``rigged_daemon.py`` blocks the loop)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path

import aiohttp

from tests.daemon.harness import start_daemon
from tests.e2e.harness import wait_for

RIG = (sys.executable, str(Path(__file__).with_name("rigged_daemon.py")))


async def test_a_blocked_loop_leaves_its_stack_count_and_health(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, "t", {"TM_TEST_RIG": "block"}, launcher=RIG)
    try:
        async with d.session() as s:
            async with s.get("/v1/test/block", params={"s": "6"}) as r:
                assert r.status == 200
            async with s.get("/v1/health") as r:
                health = await r.json()
            async with s.get("/v1/metrics") as r:
                metrics = await r.text()
        assert health["loop"]["state"] == "stalled", health
        assert health["loop"]["stalls"] == 1 and health["loop"]["last_stall_s"] >= 5
        assert health["healthy"] is False
        assert 'cm_daemon_loop_stalls_total{mesh="t"} 1.0' in metrics
        stalls = [json.loads(line) for line in d.log.read_text().splitlines()
                  if '"loop_stalled"' in line]
        assert len(stalls) == 1
        loop_stack = "".join(stalls[0]["stacks"].values())
        assert "_block" in loop_stack and "time.sleep" in loop_stack
        assert '"loop_stall_ended"' in d.log.read_text()
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


async def test_a_loop_stalled_past_the_limit_ends_the_daemon_with_its_code(
        short_tmp: Path) -> None:
    d = start_daemon(short_tmp, "t", {"TM_TEST_RIG": "block",
                                      "TIDEMESH_WATCHDOG_STALL_S": "0.5",
                                      "TIDEMESH_WATCHDOG_EXIT_AFTER_S": "2"}, launcher=RIG)
    try:
        async with d.session() as s:
            # The daemon is gone mid-request, as intended.
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get("/v1/test/block", params={"s": "30"}) as r:
                    await r.read()
        assert d.proc.wait(20) == 16
        assert '"loop_stall_limit_passed"' in d.log.read_text()
    finally:
        d.kill()


async def test_sigusr1_logs_where_every_task_waits(short_tmp: Path) -> None:
    # For a daemon that turns its loop and still seems stuck: the watchdog sees nothing then.
    d = start_daemon(short_tmp, "t")
    try:
        d.proc.send_signal(signal.SIGUSR1)
        await wait_for(lambda: '"tasks_logged"' in d.log.read_text(), timeout=10)
        lines = [json.loads(line) for line in d.log.read_text().splitlines()]
        waiting = {e["task"]: e["awaiting"] for e in lines if e.get("event") == "task_waiting"}
        [done] = [e for e in lines if e.get("event") == "tasks_logged"]
        assert done["count"] == len(waiting) > 0
        # The retention job sleeps between sweeps; its chain names where.
        assert "sqlite-writer-outbox.db" in waiting and "retention" in waiting, sorted(waiting)
        assert any("sleep" in step for step in waiting["retention"]), waiting["retention"]
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
