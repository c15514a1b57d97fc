"""One local name, one mesh (DESIGN §11): `daemon join` refuses to re-bind a local mesh name
to another mesh id, naming both, unless --move-aside, which moves the old key, outbox and
inbox aside and says where; a join with a revoked key exits 12 and says what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, pubkey, wait_for
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


def _mesh_json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


async def test_a_bound_name_is_not_re_pointed_at_another_mesh(
    mesh: Mesh, short_tmp: Path
) -> None:
    mesh.broker.cli("mesh", "create", "lab")
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    team = _mesh_json(a.paths.mesh_file)
    old_key = pubkey(a)
    a.client.send({"to": "topic:nowhere", "body": "kept with team"}, "team-row")
    lab_invite = mesh.broker.invite("lab", uses=1)

    refused = run_cli(a.home, "daemon", "join", lab_invite, "--mesh", "m", "--json")
    assert refused.returncode == Exit.USAGE, refused.stdout + refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "mesh_name_bound"
    assert (error["bound_mesh"], error["bound_mesh_id"]) == ("team", team["mesh_id"])
    assert error["invite_mesh"] == "lab" and error["invite_mesh_id"] != team["mesh_id"]
    human = run_cli(a.home, "daemon", "join", lab_invite, "--mesh", "m")
    assert human.returncode == Exit.USAGE
    assert "mesh team" in human.stderr and "mesh lab" in human.stderr
    assert "--move-aside" in human.stderr
    assert _mesh_json(a.paths.mesh_file) == team, "mesh.json is untouched"

    busy = run_cli(a.home, "daemon", "join", lab_invite, "--mesh", "m", "--move-aside")
    assert busy.returncode == Exit.ALREADY_RUNNING, busy.stdout + busy.stderr
    assert "daemon down" in busy.stderr and _mesh_json(a.paths.mesh_file) == team

    assert a.stop() == 0
    moved = run_cli(a.home, "daemon", "join", lab_invite, "--mesh", "m", "--move-aside",
                    "--json")
    assert moved.returncode == 0, moved.stdout + moved.stderr   # the invite was not used up
    out = json.loads(moved.stdout)
    aside = Path(out["moved_aside"])
    assert aside.parent == a.paths.data_dir and aside.name.startswith("aside-")
    assert _mesh_json(aside / "mesh.json") == team
    assert json.loads((aside / "keypair.json").read_text())["ed25519_public"] == old_key
    assert (aside / "outbox.db").exists() and not a.paths.outbox_db.exists()
    assert out["mesh_id"] != team["mesh_id"] and out["broker_mesh"] == "lab"
    assert out["member_pubkey"] != old_key
    b = start_daemon(a.home, "m")
    mesh.daemons["a"] = b
    await wait_for(lambda: connected(b))
    assert b.client.version()["mesh"] == "m" and b.outbox_rows() == []


async def test_a_join_with_a_revoked_key_exits_12_and_says_what_to_do(
    mesh: Mesh, short_tmp: Path
) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    old_key = pubkey(a)
    mesh.broker.cli("member", "revoke", "--mesh", "team", old_key)
    assert a.proc.wait(timeout=60) == Exit.REVOKED
    again = mesh.broker.invite("team", uses=1)
    refused = run_cli(a.home, "daemon", "join", again, "--mesh", "m")
    assert refused.returncode == Exit.REVOKED, refused.stdout + refused.stderr
    assert "member_revoked" in refused.stderr and old_key in refused.stderr
    assert "tidemesh daemon join INVITE --mesh m --move-aside" in refused.stderr
    back = run_cli(a.home, "daemon", "join", again, "--mesh", "m", "--move-aside")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "moved the old key, outbox and inbox of 'm' to " in back.stdout
    b = start_daemon(a.home, "m")
    mesh.daemons["a"] = b
    await wait_for(lambda: connected(b))
    assert pubkey(b) != old_key
