"""Ephemeral members in CI and `join --remint`, with real daemons and a real broker.

In CI (the CI variable, as a CI system sets it) `daemon join` makes a key kept in the
runtime folder; the daemon runs with it and, when it stops or at its next start after a
kill, leaves the mesh at the broker and removes it. `join --remint` gives a cloned data dir a
member key of its own in one step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.daemon.test_environment import CI, health, logged
from tests.e2e.harness import Broker, Mesh, connected, inbox, pubkey, wait_for
from tidemesh.core.paths import daemon_paths
from tidemesh.daemon.membership import identity

pytestmark = pytest.mark.slow


def _members(broker: Broker) -> dict[str, Any]:
    rows = json.loads(broker.cli("member", "list", "--mesh", "team", "--json"))
    return {r["pubkey"]: r for r in (rows["items"] if isinstance(rows, dict) else rows)}


def _ci_join(mesh: Mesh, home: Path) -> str:
    """Join ``home`` in CI; the ephemeral key's public half."""
    home.mkdir()
    res = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--name", home.name, "--json", extra_env=CI)
    assert res.returncode == 0, res.stderr + res.stdout
    joined = json.loads(res.stdout)
    assert joined["ephemeral"] is True
    paths = daemon_paths("m", {"TIDEMESH_HOME": str(home)})
    assert not paths.keypair.exists(), "no key in the data folder"
    key = identity.load_ephemeral(paths.ephemeral_keypair)
    assert key is not None and key.claimed_by is None
    assert key.keypair.public_hex == joined["member_pubkey"]
    return str(joined["member_pubkey"])


async def _ci_daemon(mesh: Mesh, home: Path, member: str) -> RunningDaemon:
    d = start_daemon(home, "m", extra_env=CI)
    mesh.daemons[home.name] = d
    await wait_for(lambda: connected(d))
    h = await health(d)
    assert h["member_pubkey"] == member and h["environment"]["persistent_keypair"] is False
    return d


async def test_a_ci_daemon_leaves_the_mesh_and_removes_its_key_when_it_stops(
        mesh: Mesh, short_tmp: Path) -> None:
    member = _ci_join(mesh, short_tmp / "job")
    d = await _ci_daemon(mesh, short_tmp / "job", member)
    key = identity.load_ephemeral(d.paths.ephemeral_keypair)
    assert key is not None and key.claimed_by == d.proc.pid
    assert _members(mesh.broker)[member]["revoked_at"] is None
    assert d.stop() == 0
    assert not d.paths.ephemeral_keypair.exists() and not d.paths.keypair.exists()
    assert not d.paths.mesh_file.exists()
    assert _members(mesh.broker)[member]["revoked_at"] is not None, "left at the broker"
    [removed] = logged(d, "ephemeral_identity_removed")
    assert (removed["why"], removed["left"], removed["pubkey"]) == ("daemon_stopped", True,
                                                                     member)
    # A plain send afterwards says the member left and how to name a mesh, not only that
    # the default mesh's socket is silent.
    sent = run_cli(short_tmp / "job", "send", "--to", "topic:ops", "hi", extra_env=CI)
    assert sent.returncode != 0
    assert "left the mesh when its daemon stopped" in sent.stderr, sent.stderr
    assert member[:16] in sent.stderr and "tidemesh daemon join INVITE" in sent.stderr


async def test_after_a_kill_the_next_start_leaves_and_removes_the_leftover_key(
        mesh: Mesh, short_tmp: Path) -> None:
    member = _ci_join(mesh, short_tmp / "job")
    d = await _ci_daemon(mesh, short_tmp / "job", member)
    d.kill()
    assert d.paths.ephemeral_keypair.exists(), "kill -9 left it"
    again = start_daemon(d.home, "m", extra_env=CI)
    mesh.daemons["job"] = again
    try:
        assert not again.paths.ephemeral_keypair.exists() and not again.paths.keypair.exists()
        assert (await health(again))["member_pubkey"] != member
        assert _members(mesh.broker)[member]["revoked_at"] is not None
        [removed] = logged(again, "ephemeral_identity_removed")
        assert (removed["why"], removed["left"]) == ("left_by_killed_daemon", True)
        # Not a member any more: the next job joins again with its invite.
        assert logged(again, "broker_link_disabled")
    finally:
        assert again.stop() == 0
    assert not again.paths.ephemeral_keypair.exists()


async def test_without_a_broker_the_key_goes_anyway_and_the_member_is_said_to_remain(
        mesh: Mesh, short_tmp: Path) -> None:
    member = _ci_join(mesh, short_tmp / "job")
    d = await _ci_daemon(mesh, short_tmp / "job", member)
    mesh.broker.stop()
    assert d.stop() == 0
    assert not d.paths.ephemeral_keypair.exists() and not d.paths.mesh_file.exists()
    [removed] = logged(d, "ephemeral_identity_removed")
    assert removed["left"] is False and "cannot reach" in removed["error"]
    [warned] = logged(d, "ephemeral_member_not_left")
    assert warned["pubkey"] == member and "member revoke" in warned["hint"]


def test_daemon_leave_uses_the_ephemeral_key_of_a_job_that_never_started(
        mesh: Mesh, short_tmp: Path) -> None:
    member = _ci_join(mesh, short_tmp / "job")
    res = run_cli(short_tmp / "job", "daemon", "leave", "--mesh", "m", "--yes", "--json",
                  extra_env=CI)
    assert res.returncode == 0, res.stderr + res.stdout
    assert json.loads(res.stdout)["broker"]["left"] is True
    assert _members(mesh.broker)[member]["revoked_at"] is not None
    assert not daemon_paths("m", {"TIDEMESH_HOME": str(short_tmp / "job")}
                            ).ephemeral_keypair.exists()


async def test_a_ci_job_joins_again_after_a_run(mesh: Mesh, short_tmp: Path) -> None:
    home = short_tmp / "job"
    first = _ci_join(mesh, home)
    assert (await _ci_daemon(mesh, home, first)).stop() == 0
    res = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--json", extra_env=CI)
    assert res.returncode == 0, res.stderr + res.stdout
    second = json.loads(res.stdout)["member_pubkey"]
    assert second != first
    assert (await _ci_daemon(mesh, home, second)).stop() == 0


async def test_remint_gives_a_clone_its_own_member_key(mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    old = pubkey(a)
    clone = short_tmp / "clone"
    shutil.copytree(a.home, clone, ignore=shutil.ignore_patterns("sock", "*.lock", "*.out",
                                                                   "http.port"))
    res = run_cli(clone, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--remint", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    joined = json.loads(res.stdout)
    new = joined["member_pubkey"]
    assert new != old and joined["moved_aside"] is not None
    assert (Path(joined["moved_aside"]) / "keypair.json").exists()
    members = _members(mesh.broker)
    assert members[old]["revoked_at"] is None, "the original host keeps its member"
    assert members[new]["revoked_at"] is None
    b = start_daemon(clone, "m", {identity.HOST_ID_ENV: "host-b"})
    mesh.daemons["b"] = b
    await wait_for(lambda: connected(b))
    assert pubkey(b) == new
    async with a.session() as s, s.post("/v1/send", json={"to": f"dm:{new}", "body": "to b"},
                                        headers={"Idempotency-Key": "a-1"}) as r:
        assert r.status == 202, await r.text()
    async with b.session() as s, s.post("/v1/send", json={"to": f"dm:{old}", "body": "to a"},
                                        headers={"Idempotency-Key": "b-1"}) as r:
        assert r.status == 202, await r.text()
    await wait_for(lambda: _bodies(b, "to b"))
    await wait_for(lambda: _bodies(a, "to a"))
    health_a, health_b = await health(a), await health(b)
    assert not health_a["clone_suspected"] and not health_b["clone_suspected"]


async def _bodies(d: RunningDaemon, body: str) -> bool:
    return body in [e["body"] for e in await inbox(d)]


def test_remint_refuses_an_invite_of_another_mesh(mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    assert a.stop() == 0
    del mesh.daemons["a"]
    mesh.broker.cli("mesh", "create", "other")
    res = run_cli(a.home, "daemon", "join", mesh.broker.invite("other"), "--mesh", "m",
                  "--remint")
    assert res.returncode == 2 and "--remint" in res.stderr, res.stderr
    assert pubkey(a)   # the old key is where it was


def test_a_ci_daemon_that_cannot_link_is_refused_not_started_healthy(
        mesh: Mesh, short_tmp: Path) -> None:
    # Joined in CI with --persistent (the key in the data folder), then started without it:
    # an ephemeral daemon would run with a fresh key no broker knows, its link off.
    home = short_tmp / "job"
    home.mkdir()
    res = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--persistent", "--json", extra_env=CI)
    assert res.returncode == 0, res.stderr + res.stdout
    member = json.loads(res.stdout)["member_pubkey"]
    up = run_cli(home, "daemon", "up", "--mesh", "m", extra_env=CI)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "not starting the daemon of mesh m" in up.stderr
    assert "--persistent" in up.stderr and "daemon started" not in up.stdout
    # Under a service manager (the foreground daemon) the refusal is the same.
    fg = run_cli(home, "daemon", "up", "--mesh", "m", "--foreground", extra_env=CI)
    assert fg.returncode == 2, fg.stdout + fg.stderr
    status = run_cli(home, "daemon", "status", "--mesh", "m", extra_env=CI)
    assert status.returncode == 3, status.stdout + status.stderr
    # With the key the join made, it links.
    up = run_cli(home, "daemon", "up", "--mesh", "m", "--persistent", extra_env=CI)
    assert up.returncode == 0 and "connected to the broker" in up.stdout, up.stderr
    status = run_cli(home, "daemon", "status", "--mesh", "m", "--json", extra_env=CI)
    assert status.returncode == 0 and json.loads(status.stdout)["member_pubkey"] == member
    assert run_cli(home, "daemon", "down", "--mesh", "m", extra_env=CI).returncode == 0
