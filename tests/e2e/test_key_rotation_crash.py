"""kill -9 at each step of `daemon rotate-keypair`, of the rotating process or of the broker:
the member is left with one working key and nothing lost or repeated, whoever finishes it
(the next `daemon up` settles a pending rotation; `rotate-keypair` again carries it on)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli
from tests.e2e.harness import Mesh, connected, pubkey, two_on_topic, wait_for
from tests.e2e.test_key_rotation import _bodies_sync, _sent
from tidemesh.core.wire import CloseCode
from tidemesh.daemon.link.websocket import BrokerLink, HandshakeRejected
from tidemesh.daemon.membership.join import MeshConfig

pytestmark = pytest.mark.slow
RIGGED_DAEMON = Path(__file__).parents[1] / "daemon" / "rigged_daemon.py"
RIGGED_BROKER = Path(__file__).parents[1] / "broker" / "rigged_broker.py"


async def _waiting(mesh: Mesh, root: Path) -> tuple[RunningDaemon, RunningDaemon, str]:
    """a and b on topic ops, b stopped with a topic message and a DM to its key waiting."""
    a, b = await two_on_topic(mesh, root)
    old = pubkey(b)
    assert b.stop() == 0
    a.client.send({"to": "topic:ops", "body": "topic before"})
    a.client.send({"to": {"kind": "dm", "ref": old}, "body": "dm before"})
    await _sent(a, 2)
    return a, b, old


async def _only_key_works(b: RunningDaemon, other: SigningKey) -> int:
    """b's key connects; the other key of the rotation is refused (never both, never none).
    Returns the refusal's close code."""
    mesh = MeshConfig.load(b.paths.mesh_file)
    assert mesh.member_pubkey == pubkey(b) != bytes(other.verify_key).hex()
    link = await BrokerLink.connect(mesh.broker_url, mesh.mesh_id, _key(b))
    await link.close()
    with pytest.raises(HandshakeRejected) as refused:
        await BrokerLink.connect(mesh.broker_url, mesh.mesh_id, other)
    return int(refused.value.code or 0)


def _key(b: RunningDaemon) -> SigningKey:
    return SigningKey(bytes.fromhex(json.loads(b.paths.keypair.read_text())["ed25519_seed"]))


async def _nothing_lost_or_repeated(mesh: Mesh, a: RunningDaemon, label: str) -> None:
    b = mesh.restart(label)
    await wait_for(lambda: connected(b))
    a.client.send({"to": "topic:ops", "body": "topic after"})
    await wait_for(lambda: len(_bodies_sync(b)) >= 3)
    assert sorted(_bodies_sync(b)) == ["dm before", "topic after", "topic before"]
    assert all("tidemesh_undecryptable" not in (e.get("meta") or {})
               for e in _bodies_sync(b, full=True))


@pytest.mark.parametrize("step", ["pending_written", "broker_rotated", "archived", "promoted",
                                  "mesh_updated"])
async def test_the_rotating_process_killed_at_each_step_is_settled_by_the_next_start(
        mesh: Mesh, short_tmp: Path, step: str) -> None:
    a, b, old = await _waiting(mesh, short_tmp)
    old_key = _key(b)
    killed = subprocess.run(
        [sys.executable, str(RIGGED_DAEMON), "daemon", "rotate-keypair", "--mesh", "m"],
        env=daemon_env(b.home, {"TM_TEST_RIG": f"rotate_kill:{step}"}), capture_output=True,
        text=True, timeout=60, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert b.paths.keypair_pending.exists()
    pending = json.loads(b.paths.keypair_pending.read_text())
    new, new_key = pending["new_pubkey"], SigningKey(bytes.fromhex(pending["new_seed"]))

    await _nothing_lost_or_repeated(mesh, a, "b")   # daemon up settles it first

    assert not b.paths.keypair_pending.exists()
    # Killed before the broker heard of it: rolled back; after: finished.
    assert pubkey(b) == (old if step == "pending_written" else new)
    if step == "pending_written":
        assert await _only_key_works(b, new_key) == CloseCode.AUTH      # unknown_member
    else:
        assert await _only_key_works(b, old_key) == CloseCode.ROTATED_OUT
    if step != "pending_written":
        assert json.loads(b.paths.keypair_archive.read_text())["keys"][0][
            "ed25519_pubkey"] == old


@pytest.mark.parametrize("when", ["before_commit", "after_commit"])
async def test_the_broker_killed_during_the_step_leaves_it_to_rotate_keypair_again(
        any_mesh: Mesh, short_tmp: Path, when: str) -> None:
    mesh = any_mesh
    a, b, old = await _waiting(mesh, short_tmp)
    old_key = _key(b)
    broker = mesh.broker
    broker.stop()
    broker.env["TM_TEST_RIG"] = f"rotate_kill_{when}"
    launcher = broker.launcher
    broker.launcher = (sys.executable, str(RIGGED_BROKER))
    broker.start()
    res = run_cli(b.home, "daemon", "rotate-keypair", "--mesh", "m")
    assert res.returncode != 0 and "did not confirm the rotation" in res.stderr, res.stderr
    assert broker.proc is not None and broker.proc.wait(10) == -signal.SIGKILL
    assert pubkey(b) == old and b.paths.keypair_pending.exists()
    del broker.env["TM_TEST_RIG"]
    broker.launcher = launcher
    broker.start()
    await wait_for(lambda: connected(a))

    res = run_cli(b.home, "daemon", "rotate-keypair", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["resumed"] is True and report["old_pubkey"] == old
    # Committed before the kill: the broker knew the new key already, nothing to ask it.
    assert ("broker" in report) is (when == "before_commit")
    assert pubkey(b) == report["new_pubkey"]
    assert await _only_key_works(b, old_key) == CloseCode.ROTATED_OUT
    await _nothing_lost_or_repeated(mesh, a, "b")


async def test_a_start_that_cannot_ask_the_broker_refuses_rather_than_guess(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b, old = await _waiting(mesh, short_tmp)
    killed = subprocess.run(
        [sys.executable, str(RIGGED_DAEMON), "daemon", "rotate-keypair", "--mesh", "m"],
        env=daemon_env(b.home, {"TM_TEST_RIG": "rotate_kill:broker_rotated"}),
        capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    mesh.broker.stop()
    up = run_cli(b.home, "daemon", "up", "--mesh", "m")
    assert up.returncode == 1, up.stdout + up.stderr
    assert "key_rotation_pending" in (b.paths.log_file.read_text()
                                      + up.stderr), up.stderr
    assert pubkey(b) == old and b.paths.keypair_pending.exists()
    mesh.broker.start()
    await wait_for(lambda: connected(a))
    await _nothing_lost_or_repeated(mesh, a, "b")
    assert pubkey(b) != old and not b.paths.keypair_pending.exists()
