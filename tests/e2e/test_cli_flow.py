"""The CLI verbs a user types, against a real broker and daemons: topics, inbox with a named
consumer, the event stream, and the cold path when no daemon runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for
from tidemesh.client import Client
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


async def test_topic_inbox_consumer_and_events_from_the_cli(mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    sub = run_cli(b.home, "topic", "subscribe", "--mesh", "m", "news")
    assert sub.returncode == Exit.REJECTED, "subscribing to a topic that does not exist fails"
    assert run_cli(a.home, "topic", "create", "--mesh", "m", "news").returncode == 0
    joined = run_cli(b.home, "topic", "subscribe", "--mesh", "m", "news", "--json")
    assert json.loads(joined.stdout)["name"] == "news", joined.stderr
    listed = json.loads(run_cli(b.home, "topic", "list", "--mesh", "m", "--json").stdout)
    assert [t["name"] for t in listed["items"]] == ["news"]
    human = run_cli(b.home, "topic", "list", "--mesh", "m").stdout
    assert "Z" in human.splitlines()[1], "since is a time, not epoch milliseconds"
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


async def test_the_only_joined_mesh_is_the_default_and_several_must_be_named(
    mesh: Mesh, short_tmp: Path
) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    # Joined as "m" only: no --mesh needed anywhere (the daemon, a send, status).
    status = json.loads(run_cli(a.home, "daemon", "status", "--json").stdout)
    assert (status["mesh"], status["running"]) == ("m", True)
    sent = run_cli(a.home, "send", "--to", "topic:nosuch", "hi", "--id", "d1", "--json")
    assert json.loads(sent.stdout)["path"] == "daemon", sent.stderr
    up = run_cli(a.home, "daemon", "up")
    assert up.returncode == Exit.ALREADY_RUNNING and "mesh m" in up.stderr, up.stderr
    assert Client.for_mesh(environ=daemon_env(a.home)).health()["connected"] is True
    # A second joined mesh: guessing could send to the wrong one, so commands ask.
    other = a.home / "daemon" / "other"
    other.mkdir(mode=0o700)
    (other / "mesh.json").write_bytes((a.home / "daemon" / "m" / "mesh.json").read_bytes())
    ambiguous = run_cli(a.home, "send", "--to", "topic:nosuch", "hi", "--id", "d2")
    assert ambiguous.returncode == Exit.USAGE, ambiguous.stderr
    assert "several meshes are joined (m, other)" in ambiguous.stderr
    named = run_cli(a.home, "daemon", "status", "--mesh", "m", "--json")
    assert json.loads(named.stdout)["mesh"] == "m"


async def test_join_answers_in_json_and_printed_keys_are_ones_send_accepts(
    mesh: Mesh, short_tmp: Path
) -> None:
    home = short_tmp / "j"
    home.mkdir()
    joined = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                     "--name", "j", "--json")
    assert joined.returncode == 0, joined.stderr
    body = json.loads(joined.stdout)
    assert (body["mesh"], body["broker_mesh"]) == ("m", mesh.name)
    assert len(body["member_pubkey"]) == 64
    assert body["config"].endswith("mesh.json")
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    # A key copied from the human `peers` table is a key `--to dm:` takes as it is.
    await wait_for(lambda: pubkey(b) in run_cli(a.home, "peers").stdout)
    sent = run_cli(a.home, "send", "--to", f"dm:{pubkey(b)}", "copied key", "--id", "k1")
    assert sent.returncode == 0, sent.stderr
    await wait_for(lambda: _has_bodies(b, ["copied key"]))
    assert pubkey(a) in run_cli(b.home, "inbox").stdout


async def _has_bodies(d: RunningDaemon, bodies: list[str]) -> bool:
    return [e["body"] for e in await inbox(d)] == bodies
