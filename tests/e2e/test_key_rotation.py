"""`daemon rotate-keypair` with real daemons and brokers (SQLite and PostgreSQL stores): the
member moves to a new key with nothing lost or repeated, peers hear of it, the old key is
refused, and DMs sealed to the old key open during the grace and are marked stale after."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, pubkey, two_on_topic, wait_for
from tests.e2e.test_backup import SECRET, _backup, _restore
from tidemesh.client import Client
from tidemesh.core.wire import CloseCode
from tidemesh.daemon.link.websocket import BrokerLink, HandshakeRejected
from tidemesh.daemon.membership.join import MeshConfig

pytestmark = pytest.mark.slow


async def _post(d: RunningDaemon, path: str, body: dict[str, object]) -> None:
    async with d.session() as s, s.post(path, json=body) as r:
        assert r.status == 200, await r.text()


def _events(d: RunningDaemon) -> list[Any]:
    return list(Client(d.paths.socket).events(since=0, idle_timeout=0.5))


def _peers(d: RunningDaemon) -> set[str]:
    return {p["pubkey"] for p in d.client.request("GET", "/v1/peers").body["peers"]}


async def _metric(d: RunningDaemon, name: str) -> float:
    async with d.session() as s, s.get("/v1/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def _seed(d: RunningDaemon) -> SigningKey:
    return SigningKey(bytes.fromhex(json.loads(d.paths.keypair.read_text())["ed25519_seed"]))


def rotate(d: RunningDaemon) -> dict[str, Any]:
    res = run_cli(d.home, "daemon", "rotate-keypair", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    return dict(json.loads(res.stdout))


async def _sent(d: RunningDaemon, n: int) -> None:
    await wait_for(lambda: len(d.client.outbox_list(status="done")["items"]) >= n)


async def test_rotation_moves_the_member_with_nothing_lost_and_peers_see_the_new_key(
        any_mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(any_mesh, short_tmp)
    await _post(b, "/v1/queues/consume", {"name": "jobs"})
    old, old_key = pubkey(b), _seed(b)
    assert b.stop() == 0
    # While b is away: a topic message, a DM sealed to its (old) key and a queue job wait.
    a.client.send({"to": "topic:ops", "body": "topic before"})
    a.client.send({"to": {"kind": "dm", "ref": old}, "body": "dm before"})
    a.client.send({"to": "queue:jobs", "body": "job before"})
    await _sent(a, 3)

    report = rotate(b)

    new = pubkey(b)
    assert report["old_pubkey"] == old and report["new_pubkey"] == new != old
    assert report["broker"] == {"already": False, "subscriptions": 1, "queues": 1,
                                "deliveries": 3, "dedupe": 0,
                                "rotated_at": report["broker"]["rotated_at"]}
    assert report["archived"]["ed25519_pubkey"] == old and report["resumed"] is False
    assert stat.S_IMODE(b.paths.keypair_archive.stat().st_mode) == 0o600
    assert "x25519_privkey" in b.paths.keypair_archive.read_text()
    assert not b.paths.keypair_pending.exists()
    assert MeshConfig.load(b.paths.mesh_file).member_pubkey == new
    # The old key's hello is refused with a close code and reason of its own.
    mesh = MeshConfig.load(b.paths.mesh_file)
    with pytest.raises(HandshakeRejected) as refused:
        await BrokerLink.connect(mesh.broker_url, mesh.mesh_id, old_key)
    assert (refused.value.code, refused.value.reason) == (CloseCode.ROTATED_OUT,
                                                         "key_rotated_out")
    assert not refused.value.retryable
    # Peers hear of it (an SSE event on their daemon).
    await wait_for(lambda: any(e.type == "peer_key_rotated" and e.data["pubkey"] == new
                               and e.data["old_pubkey"] == old for e in _events(a)))

    b = any_mesh.restart("b")
    await wait_for(lambda: connected(b))
    await wait_for(lambda: len(_bodies_sync(b)) >= 3)
    # A DM sealed to the old key after the rotation (a has not caught up): routed to the
    # new key and opened with the archived one.
    a.client.send({"to": {"kind": "dm", "ref": old}, "body": "dm after, to the old key"})
    a.client.send({"to": "topic:ops", "body": "topic after"})
    await wait_for(lambda: len(_bodies_sync(b)) >= 5)
    got = await inbox(b)
    assert sorted(e["body"] for e in got) == sorted([
        "topic before", "dm before", "job before", "dm after, to the old key", "topic after"])
    assert all("tidemesh_undecryptable" not in (e.get("meta") or {}) for e in got)
    assert await _metric(b, "cm_daemon_decrypt_archived_total") == 2
    assert await _metric(b, "cm_daemon_decrypt_stale_total") == 0
    # peers shows the new key, not the old one; b's own sends come from the new key.
    await wait_for(lambda: new in _peers(a))
    assert old not in _peers(a)
    b.client.send({"to": {"kind": "dm", "ref": pubkey(a)}, "body": "from the new key"})
    await wait_for(lambda: any(e["body"] == "from the new key" and e["from"] == new
                               for e in _bodies_sync(a, full=True)))


def _bodies_sync(d: RunningDaemon, full: bool = False) -> list[Any]:
    items = d.client.request("GET", "/v1/inbox?limit=1000").body["items"]
    return items if full else [e["body"] for e in items]


async def test_after_the_grace_a_dm_to_the_old_key_is_stored_unopened_saying_why(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    old = pubkey(b)
    assert b.stop() == 0
    b.paths.config_file.write_text("[crypto]\nkey_grace_period_days = 0\n")
    a.client.send({"to": {"kind": "dm", "ref": old}, "body": "sealed to the old key"})
    await _sent(a, 1)
    rotate(b)
    b = mesh.restart("b")
    await wait_for(lambda: len(_bodies_sync(b)) >= 1)
    [entry] = _bodies_sync(b, full=True)
    assert "grace period" in entry["meta"]["tidemesh_undecryptable"]
    assert await _metric(b, "cm_daemon_decrypt_stale_total") == 1
    # The expired key is deleted from the archive by the start's sweep; cleanup finds none.
    res = run_cli(b.home, "daemon", "archive-cleanup", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"mesh": "m", "expired": [], "kept": []}


async def test_a_broker_without_key_rotation_is_named_and_nothing_changes(
        mesh: Mesh, short_tmp: Path) -> None:
    b = mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    mesh.broker.stop()
    mesh.broker.env["TM_TEST_RIG"] = "no_key_rotation"
    mesh.broker.launcher = (*mesh.broker.launcher[:1], str(Path(__file__).parents[1] / "broker"
                                                          / "rigged_broker.py"))
    mesh.broker.start()
    old = pubkey(b)
    res = run_cli(b.home, "daemon", "rotate-keypair", "--mesh", "m", "--json")
    assert res.returncode != 0 and "feature key_rotation missing" in res.stderr, res.stderr
    assert pubkey(b) == old
    del mesh.daemons["b"]


async def test_a_backup_after_a_rotation_carries_the_archive_and_restore_puts_it_back(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    old = pubkey(b)
    assert b.stop() == 0
    a.client.send({"to": {"kind": "dm", "ref": old}, "body": "sealed to the old key"})
    await _sent(a, 1)
    rotate(b)
    del mesh.daemons["b"]
    bundle = short_tmp / "b.backup"
    assert "keypair_archive" in _backup(b, bundle)["holds"]  # type: ignore[operator]
    new_home = short_tmp / "new"
    new_home.mkdir()
    code, _out, err = _restore(new_home, bundle, env={"TIDEMESH_BACKUP_PASSPHRASE": SECRET})
    assert code == 0, err
    restored = RunningDaemon(new_home, "m", b.proc, b.log).paths
    assert json.loads(restored.keypair_archive.read_text()) == json.loads(
        b.paths.keypair_archive.read_text())
    assert stat.S_IMODE(restored.keypair_archive.stat().st_mode) == 0o600
    # The restored member opens the DM sealed to its rotated-out key.
    d = start_daemon(new_home, "m")
    mesh.daemons["restored"] = d
    await wait_for(lambda: len(_bodies_sync(d)) >= 1)
    assert _bodies_sync(d) == ["sealed to the old key"]
    assert await _metric(d, "cm_daemon_decrypt_archived_total") == 1


async def test_a_running_daemon_is_stopped_rotated_and_started_again(
        mesh: Mesh, short_tmp: Path) -> None:
    b = mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    old = pubkey(b)
    report = rotate(b)
    assert report["restarted"] is True and report["new_pubkey"] == pubkey(b) != old
    assert b.proc.wait(timeout=30) == 0, "the daemon was stopped, drained"
    del mesh.daemons["b"]
    try:
        await wait_for(lambda: connected(b))
        health = b.client.request("GET", "/v1/health").body
        assert health["member_pubkey"] == pubkey(b)
    finally:
        assert run_cli(b.home, "daemon", "down", "--mesh", "m").returncode == 0


async def test_rotation_waits_for_the_outbox_dms_and_changes_nothing(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    mesh.broker.stop()
    b.client.send({"to": {"kind": "dm", "ref": pubkey(a)}, "body": "sealed with the old key"})
    assert b.stop() == 0
    del mesh.daemons["b"]
    old = pubkey(b)
    res = run_cli(b.home, "daemon", "rotate-keypair", "--mesh", "m", "--json")
    assert res.returncode != 0 and "1 DMs wait in the outbox" in res.stderr, res.stderr
    assert pubkey(b) == old and not b.paths.keypair_pending.exists()


async def test_the_broker_checks_both_signatures_and_the_session_key(
        mesh: Mesh, short_tmp: Path) -> None:
    from tidemesh.core import handshake

    b = mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    key, other, new = _seed(b), SigningKey.generate(), SigningKey.generate()
    cfg = MeshConfig.load(b.paths.mesh_file)
    link = await BrokerLink.connect(cfg.broker_url, cfg.mesh_id, key)
    try:
        forged = handshake.sign_rotation(key, new, cfg.mesh_id)
        forged["new_signature"] = handshake.sign_rotation(key, other, cfg.mesh_id)[
            "new_signature"]
        answer = await link.rotate_key(forged)
        assert answer["type"] == "error" and "signature" in answer["error"]["message"]
        not_mine = handshake.sign_rotation(other, new, cfg.mesh_id)
        answer = await link.rotate_key(not_mine)
        assert answer["type"] == "error" and answer["error"]["field"] == "old_pubkey"
        assert not handshake.verify_rotation(cfg.mesh_id,
                                             handshake.sign_rotation(key, new, "other mesh"))
    finally:
        await link.close()
    assert pubkey(b) == bytes(key.verify_key).hex()
