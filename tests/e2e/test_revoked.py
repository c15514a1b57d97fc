"""A member an operator revoked: the daemon exits with its own code (which the service
units do not restart), and status, `daemon up` and the cold path all say "revoked" instead
of "not running" or "retry"."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Mesh, connected, pubkey, wait_for
from tidemesh.client import Client, DaemonNotRunning
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow

SAID = "revoked: this member was removed from mesh team; ask an operator for a new invite"


async def test_a_revoked_daemon_exits_for_good_and_every_verb_says_revoked(
        mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    mesh.broker.cli("member", "revoke", "--mesh", "team", pubkey(a))
    assert a.proc.wait(timeout=60) == Exit.REVOKED, a.log.read_text()[-2000:]
    assert _revoked_events(a) == 1, "the event log says why the daemon stopped"

    status = run_cli(a.home, "daemon", "status", "--mesh", "m", "--json")
    assert status.returncode == Exit.REVOKED, status.stderr
    report = json.loads(status.stdout)
    assert report["running"] is False and report["revoked"] is True
    assert report["error"]["code"] == "member_revoked" and report["error"]["message"] == SAID
    human = run_cli(a.home, "daemon", "status", "--mesh", "m")
    assert human.returncode == Exit.REVOKED and SAID in human.stderr

    up = run_cli(a.home, "daemon", "up", "--mesh", "m")
    assert up.returncode == Exit.REVOKED and SAID in up.stderr
    assert "started" not in up.stdout
    ps = json.loads(run_cli(a.home, "daemon", "ps", "--json").stdout)
    assert [(r["mesh"], r["state"]) for r in ps["items"]] == [("m", "revoked")]
    _assert_cold_send_says_revoked(a)
    _assert_sdk_says_revoked(a)


def _assert_sdk_says_revoked(a: RunningDaemon) -> None:
    """A program on the host hears that starting the daemon cannot help."""
    env = {"TIDEMESH_HOME": str(a.home)}
    for tcp in (False, True):
        with pytest.raises(DaemonNotRunning) as caught:
            Client.for_mesh("m", tcp=tcp, environ=env).health()
        said = str(caught.value)
        assert "revoked" in said and "new invite" in said, said
        assert "start it" not in said and "daemon up" not in caught.value.hint, said


async def _revoked_while_down(mesh: Mesh, short_tmp: Path) -> RunningDaemon:
    """Daemon a joins and connects, stops cleanly, and is revoked while it is down."""
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    assert a.stop() == 0
    mesh.broker.cli("member", "revoke", "--mesh", "team", pubkey(a))
    return a


async def test_revoked_while_down_the_cold_path_finds_out_and_up_then_refuses(
        mesh: Mesh, short_tmp: Path) -> None:
    a = await _revoked_while_down(mesh, short_tmp)
    _assert_cold_send_says_revoked(a)
    up = run_cli(a.home, "daemon", "up", "--mesh", "m")
    assert up.returncode == Exit.REVOKED and SAID in up.stderr


async def test_revoked_while_down_up_hears_it_from_the_broker_and_says_so(
        mesh: Mesh, short_tmp: Path) -> None:
    a = await _revoked_while_down(mesh, short_tmp)
    # No cold send told this host: only the broker's refusal can, and `up` waits for it.
    up = run_cli(a.home, "daemon", "up", "--mesh", "m")
    assert up.returncode == Exit.REVOKED, up.stdout + up.stderr
    assert SAID in up.stderr and "started" not in up.stdout


def _assert_cold_send_says_revoked(d: RunningDaemon) -> None:
    sent = run_cli(d.home, "send", "--mesh", "m", "--to", "topic:news", "hello")
    assert sent.returncode == Exit.REVOKED, sent.stderr + sent.stdout
    assert SAID in sent.stderr and "retry" not in sent.stderr


def _revoked_events(d: RunningDaemon) -> int:
    conn = sqlite3.connect(d.paths.inbox_db)
    try:
        rows = conn.execute("SELECT data FROM events WHERE type = 'broker_status'").fetchall()
    finally:
        conn.close()
    return sum(json.loads(data).get("state") == "revoked" for (data,) in rows)
