"""The daemon refuses a broker whose dedupe window cannot cover its outbox max age (spec §4.9)."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.harness import run_cli, spawn, start_daemon
from tests.e2e.harness import Broker, connected, wait_for
from tidemesh.core.exitcodes import Exit


async def test_override_above_the_dedupe_window_stops_the_daemon_with_10(short_tmp: Path) -> None:
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db",
                    env={"TIDEMESH_DEDUPE_RETENTION_DAYS": "3"})
    broker.cli("mesh", "create", "team")
    broker.start()
    try:
        d = short_tmp / "d"
        d.mkdir()
        assert run_cli(d, "daemon", "join", broker.invite("team"), "--mesh", "m").returncode == 0
        # 3 days = 72 h; an override of 100 h would retry after the broker forgot the id.
        proc = spawn(d, "m", {"TIDEMESH_OUTBOX_MAX_AGE_HOURS_OVERRIDE": "100"})
        assert proc.wait(timeout=30) == Exit.FEATURE_UNAVAILABLE
        assert "outbox_max_age_above_dedupe_window" in (d / "m.out").read_text()
        # A shorter override inside the window is fine: the daemon gets past the
        # negotiation (connected) and keeps running. Waiting for that, not for a fixed
        # time, keeps a loaded machine from stopping it before it could start.
        ok = start_daemon(d, "m", {"TIDEMESH_OUTBOX_MAX_AGE_HOURS_OVERRIDE": "48"})
        try:
            await wait_for(lambda: connected(ok))
            assert ok.proc.poll() is None
        finally:
            assert ok.stop() == 0
    finally:
        broker.stop()
