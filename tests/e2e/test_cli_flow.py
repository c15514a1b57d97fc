"""The CLI verbs a user types, against a real broker and daemons: topics, inbox with a named
consumer, the event stream, and the cold path when no daemon runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


async def test_topic_inbox_consumer_and_events_from_the_cli(mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    sub = run_cli(b.home, "topic", "subscribe", "--mesh", "m", "news")
    assert sub.returncode == Exit.REJECTED, "subscribing to a topic that does not exist fails"
    assert run_cli(a.home, "topic", "create", "--mesh", "m", "news").returncode == 0
    assert run_cli(b.home, "topic", "subscribe", "--mesh", "m", "news").returncode == 0
    listed = json.loads(run_cli(b.home, "topic", "list", "--mesh", "m", "--json").stdout)
    assert [t["name"] for t in listed["items"]] == ["news"]
    for i in range(3):
        res = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:news", f"item {i}",
                      "--id", f"n{i}")
        assert res.returncode == 0 and "via daemon" in res.stdout, res.stderr
    await wait_for(lambda: _n(b, 3))
    first = json.loads(run_cli(b.home, "inbox", "--mesh", "m", "--consumer", "w", "--limit",
                               "2", "--json").stdout)
    again = json.loads(run_cli(b.home, "inbox", "--mesh", "m", "--consumer", "w", "--limit",
                               "2", "--ack", "--json").stdout)
    assert [e["body"] for e in first["items"]] == [e["body"] for e in again["items"]]
    rest = json.loads(run_cli(b.home, "inbox", "--mesh", "m", "--consumer", "w",
                              "--json").stdout)
    assert [e["body"] for e in rest["items"]] == ["item 2"]
    ev = run_cli(b.home, "events", "--mesh", "m", "--since", "0", "--idle-exit", "3",
                 "--json")
    types = [json.loads(line)["type"] for line in ev.stdout.splitlines()]
    assert types.count("message") == 3


async def _n(d: object, n: int) -> bool:
    return len(await inbox(d)) >= n  # type: ignore[arg-type]


async def test_cold_path_when_no_daemon_runs_shares_the_members_keys(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    assert run_cli(b.home, "topic", "subscribe", "--mesh", "m", "cold").returncode != 0
    assert run_cli(a.home, "topic", "create", "--mesh", "m", "cold").returncode == 0
    assert run_cli(b.home, "topic", "subscribe", "--mesh", "m", "cold").returncode == 0
    assert a.stop() == 0
    cold = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:cold", "direct", "--id", "c1",
                   "--json")
    assert cold.returncode == 0, cold.stderr
    out = json.loads(cold.stdout)
    assert (out["path"], out["status"]) == ("cold", "done")
    again = json.loads(run_cli(a.home, "send", "--mesh", "m", "--to", "topic:cold", "direct",
                               "--id", "c1", "--json").stdout)
    assert again["duplicate"] is True and again["broker_message_id"] == out["broker_message_id"]
    clash = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:cold", "other", "--id", "c1")
    assert clash.returncode == Exit.CONFLICT
    a = mesh.restart("a")
    await wait_for(lambda: connected(a))
    via_daemon = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:cold", "direct",
                         "--id", "c1", "--json")
    assert json.loads(via_daemon.stdout)["path"] == "daemon"
    await wait_for(lambda: any(r["status"] == "done" for r in a.outbox_rows()))
    await wait_for(lambda: _n(b, 1))
    assert [e["body"] for e in await inbox(b)] == ["direct"], "the daemon's retry was a duplicate"


async def test_dm_sent_via_daemon_then_retried_on_the_cold_path_is_one_send(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    args = ("send", "--mesh", "m", "--to", f"dm:{pubkey(b)}", "--id", "dm-1", "--json")
    first = run_cli(a.home, *args, "sealed once")
    assert first.returncode == 0 and json.loads(first.stdout)["path"] == "daemon", first.stderr
    await wait_for(lambda: any(r["status"] == "done" for r in a.outbox_rows()))
    assert a.stop() == 0
    again = run_cli(a.home, *args, "sealed once")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["path"], out["duplicate"]) == ("cold", True), "same id and body: one send"
    clash = run_cli(a.home, *args, "another body")
    assert clash.returncode == Exit.CONFLICT, clash.stderr
    assert [e["body"] for e in await inbox(b)] == ["sealed once"]
