"""A mesh name becomes a folder name, so every way a name comes in checks it against the one
pattern of ``core.paths`` before any path is built: an invite whose mesh name was edited to
climb out of the home (or be absolute), a backup bundle sealed with such a name, ``--mesh``
and ``TIDEMESH_DAEMON_MESH`` on the command line, and the broker's ``mesh create``. Each is
refused (exit 2, ``invalid_name``, naming the name) and writes nothing anywhere."""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import nacl.pwhash
import pytest

from tests.daemon.harness import daemon_env, run_cli
from tests.e2e.harness import Mesh
from tidemesh.core.exitcodes import Exit
from tidemesh.core.invite import PREFIX
from tidemesh.daemon.offline import backup

pytestmark = pytest.mark.slow

SECRET = "correct horse battery"


def _jail(root: Path) -> tuple[Path, Path]:
    """A home three folders deep in a jail folder: ``../../../x`` from the home's daemon
    folder lands inside the jail, where the test can see it."""
    jail = root / "jail"
    home = jail / "a" / "b" / "home"
    home.mkdir(parents=True)
    return jail, home


def _outside(jail: Path, home: Path) -> list[str]:
    """Every file and folder of the jail that is not the home or under it."""
    return sorted(str(p.relative_to(jail)) for p in jail.rglob("*")
                  if p != home and home not in p.parents and p not in home.parents)


def _bad_names(jail: Path) -> list[str]:
    return ["../../../x", str(jail / "abs"), "..", "a/b", ".hidden", "x" * 65, "sp ace"]


def _with_mesh(invite: str, name: str) -> str:
    body = invite.removeprefix(PREFIX)
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data["mesh"] = name
    raw = json.dumps(data, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_an_invite_with_an_edited_mesh_name_is_refused_and_writes_nothing(
        mesh: Mesh, short_tmp: Path) -> None:
    jail, home = _jail(short_tmp)
    invite = mesh.broker.invite("team", uses=64)
    for name in _bad_names(jail):
        res = run_cli(home, "daemon", "join", _with_mesh(invite, name), "--json")
        assert res.returncode == Exit.USAGE, (name, res.stdout, res.stderr)
        error = json.loads(res.stdout)["error"]
        assert error["code"] == "invalid_name" and error["name"] == name, error
        human = run_cli(home, "daemon", "join", _with_mesh(invite, name))
        assert human.returncode == Exit.USAGE and repr(name) in human.stderr, human.stderr
        assert _outside(jail, home) == [], name
        assert list(home.iterdir()) == [], name
    # The same invite unedited still joins: the refusals used none of its uses.
    ok = run_cli(home, "daemon", "join", invite, "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["mesh"] == "team" and _outside(jail, home) == []


def _restore(home: Path, file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemesh", "daemon", "restore", str(file),
                           "--json", *extra], capture_output=True, text=True, timeout=60,
                          env=daemon_env(home, {"TIDEMESH_BACKUP_PASSPHRASE": SECRET}),
                          check=False)


def test_a_backup_with_a_crafted_mesh_name_is_refused_and_writes_nothing(
        mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    pass_file = short_tmp / "pass.txt"
    pass_file.write_text(SECRET + "\n")
    made = run_cli(a.home, "daemon", "backup", "--mesh", "m", "--out",
                   str(short_tmp / "a.tmbk"), "--passphrase-file", str(pass_file))
    assert made.returncode == 0, made.stdout + made.stderr
    contents = backup.unseal((short_tmp / "a.tmbk").read_bytes(), SECRET.encode())
    jail, home = _jail(short_tmp)
    for name in _bad_names(jail):
        crafted = short_tmp / "crafted.tmbk"
        crafted.write_bytes(backup.seal({**contents, "mesh": name}, SECRET.encode(),
                                        nacl.pwhash.argon2id.OPSLIMIT_MIN,
                                        nacl.pwhash.argon2id.MEMLIMIT_MIN))
        res = _restore(home, crafted)
        assert res.returncode == Exit.USAGE, (name, res.stdout, res.stderr)
        assert f"invalid_name: mesh name {name!r}" in res.stderr, res.stderr
        # Under a good local name the bundle is still refused: its name is not to be trusted.
        assert _restore(home, crafted, "--mesh", "fine").returncode == Exit.USAGE
        assert _outside(jail, home) == [] and list(home.iterdir()) == [], name
    # A bad --mesh with a good bundle is refused the same way.
    res = _restore(home, short_tmp / "a.tmbk", "--mesh", "../../../x")
    assert res.returncode == Exit.USAGE and "'../../../x'" in res.stderr, res.stderr
    assert _outside(jail, home) == [] and list(home.iterdir()) == []


def test_the_command_line_and_the_broker_refuse_a_bad_name(
        mesh: Mesh, short_tmp: Path) -> None:
    jail, home = _jail(short_tmp)
    up = run_cli(home, "daemon", "up", "--foreground", "--mesh", "../../../x")
    assert up.returncode == Exit.USAGE and "'../../../x'" in up.stderr, up.stderr
    by_env = run_cli(home, "inbox", extra_env={"TIDEMESH_DAEMON_MESH": str(jail / "abs")})
    assert by_env.returncode == Exit.USAGE and str(jail / "abs") in by_env.stderr
    assert _outside(jail, home) == [] and list(home.iterdir()) == []
    created = run_cli(mesh.broker.home, "broker", "mesh", "create", "../../x",
                      "--store", mesh.broker.store)
    assert created.returncode == Exit.USAGE, created.stdout + created.stderr
    assert "invalid_name" in created.stderr and "'../../x'" in created.stderr


def test_the_broker_refuses_a_join_to_a_mesh_named_before_names_were_checked(
        mesh: Mesh, short_tmp: Path) -> None:
    """A store may hold a name made before the check: the broker refuses the join rather
    than hand a host a name it would make a folder (an older host would)."""
    mesh_id = json.loads(run_cli(mesh.broker.home, "broker", "mesh", "create", "old",
                                 "--json", "--store", mesh.broker.store).stdout)["id"]
    db = mesh.broker.store.removeprefix("sqlite://")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE mesh SET name = ? WHERE id = ?", ("../../../x", mesh_id))
    invite = mesh.broker.invite(mesh_id, uses=1)    # by id: the name no longer fits
    jail, home = _jail(short_tmp)
    # The invite says the bad name; the host refuses it before dialling...
    assert run_cli(home, "daemon", "join", invite).returncode == Exit.USAGE
    # ...and with the name edited to a good one, the broker refuses it.
    res = run_cli(home, "daemon", "join", _with_mesh(invite, "old"))
    assert res.returncode == Exit.REJECTED, res.stdout + res.stderr
    assert "invalid_mesh_name" in res.stderr, res.stderr
    assert _outside(jail, home) == []
