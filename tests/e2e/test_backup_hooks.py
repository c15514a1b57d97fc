"""A backup carries the ``hooks/`` folder: restored on a new home, the pre-send hook still
vetoes, and each file keeps its mode. A link in the folder refuses the backup (naming it),
and a bundle whose hook names climb out of the folder is refused before anything is written."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import nacl.pwhash
import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, wait_for
from tests.e2e.test_hooks import add_with_hooks
from tidemesh.core.exitcodes import Exit
from tidemesh.daemon.offline import backup

pytestmark = pytest.mark.slow

SECRET = "correct horse battery"
PRE_SEND = """#!/bin/sh
if grep -q forbidden; then echo "no forbidden words, please"; exit 1; fi
exit 0
"""


def _backup(home: Path, out: Path) -> subprocess.CompletedProcess[str]:
    pass_file = home / "pass.txt"
    pass_file.write_text(SECRET + "\n")
    return run_cli(home, "daemon", "backup", "--mesh", "m", "--out", str(out),
                   "--passphrase-file", str(pass_file), "--json")


def _restore(home: Path, file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemesh", "daemon", "restore", str(file),
                           "--json"], capture_output=True, text=True, timeout=60,
                          env=daemon_env(home, {"TIDEMESH_BACKUP_PASSPHRASE": SECRET}),
                          check=False)


async def _send(d: RunningDaemon, body: str) -> tuple[int, dict[str, Any]]:
    async with d.session() as s, s.post("/v1/send", json={"to": "topic:ops", "body": body}) as r:
        return r.status, await r.json()


async def test_a_restored_home_keeps_its_pre_send_veto_and_the_hook_modes(
        mesh: Mesh, short_tmp: Path) -> None:
    b = add_with_hooks(mesh, "b", short_tmp, {"pre-send": PRE_SEND, "words.txt": "forbidden\n"},
                       "[pre-send]\ntimeout_s = 10\n")
    folder = b.paths.hooks_dir
    (folder / "words.txt").chmod(0o640)
    (folder / "hooks.toml").chmod(0o600)
    (folder / "pre-send").chmod(0o750)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    made = _backup(b.home, short_tmp / "b.tmbk")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "hooks" in json.loads(made.stdout)["holds"]
    assert b.stop() == 0
    del mesh.daemons["b"]

    new = short_tmp / "n"
    new.mkdir()
    done = _restore(new, short_tmp / "b.tmbk")
    assert done.returncode == 0, done.stdout + done.stderr
    r = start_daemon(new, "m")
    mesh.daemons["r"] = r
    await wait_for(lambda: connected(r))
    restored = r.paths.hooks_dir
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in restored.iterdir()} == modes
    assert (restored / "pre-send").read_text() == PRE_SEND
    status, answer = await _send(r, "forbidden fruit")
    assert status == 403, answer
    assert answer["error"]["code"] == "send_vetoed"
    assert (await _send(r, "fine"))[0] == 202


def test_a_link_in_the_hooks_folder_refuses_the_backup(mesh: Mesh, short_tmp: Path) -> None:
    b = add_with_hooks(mesh, "b", short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    secret = short_tmp / "secret"
    secret.write_text("not a hook\n")
    (b.paths.hooks_dir / "on-dm").symlink_to(secret)
    out = short_tmp / "b.tmbk"
    res = _backup(b.home, out)
    assert res.returncode != 0, res.stdout
    assert "on-dm" in res.stderr and "link" in res.stderr, res.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["../../../x", "/tmp/x", "sub/x", "..", ".", "", "a\x00b"])
def test_a_bundle_whose_hooks_climb_out_is_refused_and_writes_nothing(
        mesh: Mesh, short_tmp: Path, name: str) -> None:
    b = add_with_hooks(mesh, "b", short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    assert _backup(b.home, short_tmp / "b.tmbk").returncode == 0
    contents = backup.unseal((short_tmp / "b.tmbk").read_bytes(), SECRET.encode())
    if name == "/tmp/x":
        name = str(short_tmp / "abs")
    evil = {"name": name, "mode": 0o755, "data": base64.b64encode(b"#!/bin/sh\n").decode()}
    crafted = short_tmp / "crafted.tmbk"
    crafted.write_bytes(backup.seal({**contents, "hooks": [*contents["hooks"], evil]},
                                    SECRET.encode(), nacl.pwhash.argon2id.OPSLIMIT_MIN,
                                    nacl.pwhash.argon2id.MEMLIMIT_MIN))
    jail = short_tmp / "jail"
    home = jail / "a" / "b" / "home"
    home.mkdir(parents=True)
    before = sorted(os.listdir(short_tmp))
    res = _restore(home, crafted)
    assert res.returncode == Exit.REJECTED, res.stdout + res.stderr
    assert "hook" in res.stderr, res.stderr
    assert list(home.iterdir()) == [] and sorted(os.listdir(short_tmp)) == before
    assert [p.name for p in jail.rglob("*")] == ["a", "b", "home"]
