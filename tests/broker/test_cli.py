"""Operator commands on the embedded store, through the real click group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidemesh.cli.main import cli
from tidemesh.core import invite


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("TIDEMESH_HOME", str(tmp_path))
    return CliRunner()


def test_mesh_invite_member_commands(runner: CliRunner, tmp_path: Path) -> None:
    made = runner.invoke(cli, ["broker", "mesh", "create", "team", "--json"])
    assert made.exit_code == 0, made.output
    mesh_id = json.loads(made.stdout)["id"]
    assert (tmp_path / "broker" / "broker.db").exists()
    assert f"using the embedded store {tmp_path / 'broker' / 'broker.db'}" in made.stderr
    dup = runner.invoke(cli, ["broker", "mesh", "create", "team"])
    assert dup.exit_code == 7 and "exists already" in dup.output
    inv = runner.invoke(cli, ["broker", "invite", "create", "--mesh", "team", "--uses", "3",
                              "--expires", "2h", "--url", "wss://broker.example:443"])
    assert inv.exit_code == 0, inv.output
    parsed = invite.decode(inv.stdout.strip())
    assert (parsed.mesh, parsed.mesh_id, parsed.url) == ("team", mesh_id,
                                                         "wss://broker.example:443")
    members = runner.invoke(cli, ["broker", "member", "list", "--mesh", "team", "--json"])
    assert json.loads(members.stdout) == []
    gone = runner.invoke(cli, ["broker", "member", "revoke", "--mesh", "team", "f" * 64])
    assert gone.exit_code == 8
    assert runner.invoke(cli, ["broker", "topic", "create", "--mesh", "team", "ops"]).exit_code == 0
    unknown = runner.invoke(cli, ["broker", "invite", "create", "--mesh", "nope"])
    assert unknown.exit_code == 8 and "no mesh named" in unknown.output


def test_operator_commands_answer_in_json(runner: CliRunner) -> None:
    assert runner.invoke(cli, ["broker", "mesh", "create", "team"]).exit_code == 0
    inv = runner.invoke(cli, ["broker", "invite", "create", "--mesh", "team", "--json",
                              "--url", "ws://127.0.0.1:7801"])
    assert inv.exit_code == 0, inv.output
    body = json.loads(inv.stdout)
    assert body["mesh"] == "team" and body["expires_at"] > 0 and body["invite_id"]
    assert invite.decode(body["invite"]).url == "ws://127.0.0.1:7801"
    topic = runner.invoke(cli, ["broker", "topic", "create", "--mesh", "team", "ops", "--json"])
    assert json.loads(topic.stdout) == {"mesh": "team", "topic": "ops"}
    gone = runner.invoke(cli, ["broker", "member", "revoke", "--mesh", "team", "f" * 64,
                               "--json"])
    assert gone.exit_code == 8
    assert json.loads(gone.stdout)["error"]["code"] == "not_found"
