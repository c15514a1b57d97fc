"""`daemon backup` and `daemon restore` with real daemons and a real broker: a restored home is
the same member on a new home and host, with a new token and its subscriptions; a wrong
passphrase, a damaged or truncated file and a newer schema each say so and write nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, pubkey, two_on_topic, wait_for
from tidemesh.client import Client
from tidemesh.core.paths import daemon_paths

pytestmark = pytest.mark.slow

SECRET = "correct horse battery"


def _secret_file(root: Path, text: str = SECRET) -> Path:
    f = root / "pass.txt"
    f.write_text(text + "\n")
    return f


def _backup(d: RunningDaemon, out: Path, *extra: str) -> dict[str, object]:
    res = run_cli(d.home, "daemon", "backup", "--mesh", "m", "--out", str(out),
                  "--passphrase-file", str(_secret_file(d.home)), "--json", *extra)
    assert res.returncode == 0, res.stderr + res.stdout
    return dict(json.loads(res.stdout))


def _restore(home: Path, file: Path, *extra: str, env: dict[str, str] | None = None,
             stdin: str | None = None) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "tidemesh", "daemon", "restore", str(file),
                          "--json", *extra], input=stdin, capture_output=True, text=True,
                         env=daemon_env(home, env), timeout=60, check=False)
    return res.returncode, res.stdout, res.stderr


def _files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*")) if home.exists() else []


async def test_restore_into_a_new_home_is_the_same_member_with_a_new_token(
        any_mesh: Mesh, short_tmp: Path) -> None:
    mesh = any_mesh
    a, b = await two_on_topic(mesh, short_tmp)        # b subscribes to "ops"
    old_token, member = b.token, pubkey(b)
    bundle = short_tmp / "b.tmbk"
    report = _backup(b, bundle)
    assert report["member_pubkey"] == member and report["subscriptions"] == 1
    assert {"keypair", "host_fingerprint", "mesh_config", "subscriptions"} <= set(
        report["holds"])  # type: ignore[arg-type]
    assert os.stat(bundle).st_mode & 0o777 == 0o600
    assert b"ed25519" not in bundle.read_bytes(), "the bundle is sealed"
    # The same bundle over IPC (what a program would call), through the SDK.
    over_ipc = Client(b.paths.socket, timeout=30).backup(SECRET)
    assert over_ipc.startswith(b"TIDEMESH-BACKUP\n")
    assert b.stop() == 0
    # The old host looked different: the restore adopts this one, as accept-host does.
    b.paths.host_fingerprint.write_text(json.dumps({"version": 1, "fingerprint": "0" * 64}))
    del mesh.daemons["b"]

    new = short_tmp / "n"
    new.mkdir()
    code, out, err = _restore(new, bundle, env={"TIDEMESH_BACKUP_PASSPHRASE": SECRET})
    assert code == 0, err + out
    done = json.loads(out)
    assert done["member_pubkey"] == member and done["mesh"] == "m"
    assert done["subscriptions"] == 1 and done["new_token"] is True

    r = start_daemon(new, "m")
    mesh.daemons["r"] = r
    await wait_for(lambda: connected(r))
    assert pubkey(r) == member and r.token != old_token
    assert os.stat(r.paths.token_file).st_mode & 0o777 == 0o600
    assert [t["name"] for t in r.client.memberships("topic")["items"]] == ["ops"]
    # The broker sees the same member: what a sends to the topic reaches the restored home.
    a.client.send({"to": "topic:ops", "body": "after restore"})
    await wait_for(lambda: _bodies(r))
    assert await _bodies(r) == ["after restore"]
    # The SDK's bundle opens too, here through the prompt (stdin).
    other = short_tmp / "o"
    other.mkdir()
    (other / "ipc.tmbk").write_bytes(over_ipc)
    code, out, err = _restore(other, other / "ipc.tmbk", stdin=SECRET + "\n")
    assert code == 0, err + out
    assert json.loads(out)["member_pubkey"] == member


async def _bodies(d: RunningDaemon) -> list[str]:
    return [e["body"] for e in await inbox(d)]


@pytest.fixture
def bundle(mesh: Mesh, short_tmp: Path) -> Path:
    a = mesh.add("a", short_tmp)
    out = short_tmp / "a.tmbk"
    _backup(a, out)
    return out


@pytest.mark.parametrize("damage", ["wrong_passphrase", "truncated", "flipped", "too_new",
                                    "not_a_backup"])
def test_a_bad_backup_says_why_and_writes_nothing(bundle: Path, short_tmp: Path,
                                                  damage: str) -> None:
    data = bundle.read_bytes()
    secret = SECRET
    if damage == "wrong_passphrase":
        secret = "not the passphrase"
    elif damage == "truncated":
        bundle.write_bytes(data[: len(data) - 40])
    elif damage == "flipped":
        bundle.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    elif damage == "too_new":
        head, _, sealed = data.partition(b"\n")[2].partition(b"\n")
        header = json.loads(head)
        header["schema_version"] = 99
        bundle.write_bytes(b"TIDEMESH-BACKUP\n" + json.dumps(header).encode() + b"\n" + sealed)
    else:
        bundle.write_bytes(b"hello\n" + data[:100])
    target = short_tmp / "t"
    target.mkdir()
    code, out, err = _restore(target, bundle, env={"TIDEMESH_BACKUP_PASSPHRASE": secret})
    assert code != 0, out
    said = {"wrong_passphrase": "wrong passphrase", "truncated": "damaged or truncated",
            "flipped": "damaged or truncated", "too_new": "schema version 99",
            "not_a_backup": "not a tidemesh backup"}[damage]
    assert said in err, err
    assert _files(target) == [], "nothing was written"


def test_restore_refuses_over_an_existing_identity(bundle: Path, short_tmp: Path) -> None:
    home = bundle.parent / "a"      # the daemon that made it: it still has its keypair
    keypair = daemon_paths("m", {"TIDEMESH_HOME": str(home)}).keypair
    before = keypair.read_bytes()
    code, _, err = _restore(home, bundle, env={"TIDEMESH_BACKUP_PASSPHRASE": SECRET})
    assert code != 0 and ("exists" in err or "daemon runs" in err), err
    assert keypair.read_bytes() == before
