"""Start-up, shutdown and recovery of a real daemon process."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

from tests.daemon.harness import run_cli, spawn, start_daemon
from tidemesh.core.exitcodes import Exit

BODY = {"to": "topic:ops", "body": "hello"}


def test_status_json_reports_what_an_operator_needs(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, mesh="ops")
    try:
        d.client.send(BODY, "s1")
        res = run_cli(short_tmp, "daemon", "status", "--json", "--mesh", "ops")
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)
        assert st["running"] is True and st["healthy"] is True
        assert st["pid"] == d.proc.pid and st["mesh"] == "ops"
        assert st["socket"] == str(d.paths.socket) and st["http_port"] == d.port
        assert st["token_file"] == str(d.paths.token_file)
        assert st["data_dir"] == str(d.paths.data_dir) and st["version"]
        assert st["outbox"]["pending"] == 1 and st["outbox"]["dead"] == 0
    finally:
        assert d.stop() == 0
    res = run_cli(short_tmp, "daemon", "status", "--json", "--mesh", "ops")
    assert res.returncode == Exit.NOT_RUNNING
    assert json.loads(res.stdout)["running"] is False


def test_sigterm_drains_removes_the_socket_and_exits_0(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    d.client.send(BODY, "before-stop")
    assert d.stop() == 0
    assert not d.paths.socket.exists() and not d.paths.port_file.exists()
    assert [r["client_message_id"] for r in d.outbox_rows()] == ["before-stop"]


def test_cli_up_down_cycle(short_tmp: Path) -> None:
    up = run_cli(short_tmp, "daemon", "up", "--mesh", "m1")
    assert up.returncode == 0, up.stderr
    again = run_cli(short_tmp, "daemon", "up", "--mesh", "m1")
    assert again.returncode == Exit.ALREADY_RUNNING
    down = run_cli(short_tmp, "daemon", "down", "--mesh", "m1")
    assert down.returncode == 0, down.stderr
    assert run_cli(short_tmp, "daemon", "down", "--mesh", "m1").returncode == Exit.NOT_RUNNING


def test_a_second_daemon_for_the_same_mesh_is_refused(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        second = spawn(short_tmp, "t")
        assert second.wait(timeout=20) == Exit.ALREADY_RUNNING
        other_mesh = start_daemon(short_tmp, mesh="other")
        assert other_mesh.stop() == 0
    finally:
        assert d.stop() == 0


def test_host_fingerprint_mismatch_refuses_with_code_4_until_accept_host(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    pub = json.loads(d.paths.keypair.read_text())["ed25519_public"]
    assert d.stop() == 0
    d.paths.host_fingerprint.write_text(json.dumps({"version": 1, "fingerprint": "0" * 64}))
    refused = spawn(short_tmp, "t")
    assert refused.wait(timeout=20) == Exit.HOST_MISMATCH
    assert "accept-host" in (short_tmp / "t.out").read_text()
    res = run_cli(short_tmp, "daemon", "accept-host", "--mesh", "t")
    assert res.returncode == 0, res.stderr
    d2 = start_daemon(short_tmp)
    assert json.loads(d2.paths.keypair.read_text())["ed25519_public"] == pub
    assert d2.stop() == 0


def test_restart_resets_inflight_rows_to_pending(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    d.client.send(BODY, "was-inflight")
    d.sql("UPDATE outbox SET status='inflight' WHERE client_message_id='was-inflight'")
    d.kill()
    d2 = start_daemon(short_tmp)
    try:
        (row,) = d2.outbox_rows()
        assert row["status"] == "pending"
    finally:
        assert d2.stop() == 0


def test_damaged_outbox_refuses_to_start_with_a_clear_message(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    assert d.stop() == 0
    db = d.paths.outbox_db
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 200)
    refused = spawn(short_tmp, "t")
    assert refused.wait(timeout=20) == Exit.UNHEALTHY
    log = (short_tmp / "t.out").read_text()
    assert "outbox_unusable" in log and "backup" in log
    assert db.read_bytes().startswith(b"this is not a database"), "the outbox must be left as is"


def test_damaged_inbox_is_moved_aside_and_rebuilt_empty(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    assert d.stop() == 0
    inbox = d.paths.inbox_db
    for suffix in ("-wal", "-shm"):
        Path(str(inbox) + suffix).unlink(missing_ok=True)
    inbox.write_bytes(b"garbage" * 1000)
    d2 = start_daemon(short_tmp)
    try:
        aside = [p for p in inbox.parent.iterdir() if p.name.startswith("inbox.db.corrupt-")]
        assert len(aside) == 1
        conn = sqlite3.connect(inbox)
        assert conn.execute("SELECT COUNT(*) FROM inbox").fetchone() == (0,)
        conn.close()
        assert "inbox_corruption_recovered" in (short_tmp / "t.out").read_text()
    finally:
        assert d2.stop() == 0


def test_socket_path_too_long_is_refused_with_a_hint(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    proc = spawn(deep, "t")
    assert proc.wait(timeout=20) == Exit.USAGE
    assert "TIDEMESH_HOME" in (deep / "t.out").read_text()


def test_sigint_also_stops_gracefully(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    d.proc.send_signal(signal.SIGINT)
    assert d.proc.wait(timeout=20) == 0


def test_restart_with_a_broken_configuration_leaves_the_daemon_running(short_tmp: Path
                                                                       ) -> None:
    d = start_daemon(short_tmp, mesh="ops")
    try:
        d.paths.hooks_dir.mkdir(parents=True, exist_ok=True)
        (d.paths.hooks_dir / "hooks.toml").write_text("[pre-send\ntimeout_s = 3\n")
        res = run_cli(short_tmp, "daemon", "restart", "--mesh", "ops")
        assert res.returncode == Exit.USAGE, res.stdout + res.stderr
        assert "hooks.toml" in res.stderr and "still running" in res.stderr
        assert "daemon stopped" not in res.stdout
        assert d.proc.poll() is None, "a start that cannot succeed must not stop it first"
        assert run_cli(short_tmp, "daemon", "status", "--mesh", "ops").returncode == 0
    finally:
        assert d.stop() == 0


def test_an_impossible_setting_is_refused_at_start_and_on_sighup(short_tmp: Path) -> None:
    # Each was once taken: max_inflight -5 answered every request 429, a hooks.concurrency
    # of 0 never ran a hook, a nan (a keepalive here: the harness sets the rate itself) and a
    # body limit of 1e22 meant nothing.
    d = start_daemon(short_tmp)
    try:
        d.paths.config_file.write_text("[ipc]\nmax_inflight = -5\n")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "config_reload_failed" not in d.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "ipc.max_inflight" in d.log.read_text()
        assert run_cli(short_tmp, "daemon", "status", "--mesh", "t").returncode == 0
    finally:
        assert d.stop() == 0
    for text in ("[ipc]\nmax_inflight = -5\n", "[ipc]\nsse_keepalive_s = nan\n",
                 "[hooks]\nconcurrency = 0\n", "[ipc]\nmax_body_bytes = 10000000000000000000000\n"):
        d.paths.config_file.write_text(text)
        before = d.log.stat().st_size
        proc = spawn(short_tmp, "t")
        assert proc.wait(timeout=20) == Exit.USAGE, text
        section, line = text.splitlines()
        assert f"{section.strip('[]')}.{line.split(' =')[0]}" in d.log.read_text()[before:]
