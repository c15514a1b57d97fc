"""`daemon leave`, `daemon reset` and `daemon recover` with real daemons and brokers (SQLite
and PostgreSQL stores for leave, the one that touches the broker)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker, Mesh, connected, inbox, pubkey, wait_for
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import daemon_paths

pytestmark = pytest.mark.slow


async def _post(d: RunningDaemon, path: str, body: dict[str, object]) -> None:
    async with d.session() as s, s.post(path, json=body) as r:
        assert r.status == 200, await r.text()


def _members(broker: Broker) -> dict[str, object]:
    rows = json.loads(broker.cli("member", "list", "--mesh", "team", "--json"))
    return {r["pubkey"]: r for r in (rows["items"] if isinstance(rows, dict) else rows)}


async def test_leave_removes_the_member_at_the_broker_and_the_local_data(
        any_mesh: Mesh, short_tmp: Path) -> None:
    a, b = any_mesh.add("a", short_tmp), any_mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    await _post(b, "/v1/topics/subscribe", {"name": "ops", "create": True})
    await _post(b, "/v1/queues/consume", {"name": "jobs"})
    member = pubkey(b)
    # A copy of b's identity, to show afterwards that the key can no longer connect.
    copy = short_tmp / "copy"
    shutil.copytree(b.home, copy, ignore=shutil.ignore_patterns("sock", "*.lock", "*.out"))
    assert b.stop() == 0
    a.client.send({"to": {"kind": "dm", "ref": member}, "body": "for b, undelivered"})
    await wait_for(lambda: a.client.outbox_list(status="done")["items"])

    b = any_mesh.restart("b")          # leave stops a running daemon first
    del any_mesh.daemons["b"]
    res = run_cli(b.home, "daemon", "leave", "--mesh", "m", "--yes", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    report = json.loads(res.stdout)
    assert report["member_pubkey"] == member and report["broker"]["left"] is True
    assert report["broker"]["subscriptions"] == 1 and report["broker"]["queues"] == 1
    assert b.proc.wait(timeout=30) == 0, "the daemon was stopped, drained"
    assert not b.paths.data_dir.exists() and report["removed"]
    assert _members(any_mesh.broker)[member]["revoked_at"] is not None  # type: ignore[index]
    # The key can no longer say hello: a host holding it is refused as revoked.
    # (The copy is adopted first: a copied data folder is refused before it dials.)
    assert run_cli(copy, "daemon", "accept-host", "--mesh", "m").returncode == 0
    up = run_cli(copy, "daemon", "up", "--mesh", "m")
    assert up.returncode == Exit.REVOKED, up.stdout + up.stderr
    # Sends to the topic reach nobody now; a's daemon carries on.
    a.client.send({"to": "topic:ops", "body": "after b left"})
    await wait_for(lambda: a.client.outbox_list(status="done")["items"])


async def test_leave_says_so_when_the_broker_cannot_be_reached_and_removes_nothing(
        mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    assert a.stop() == 0
    del mesh.daemons["a"]
    mesh.broker.stop()
    res = run_cli(a.home, "daemon", "leave", "--mesh", "m", "--yes")
    assert res.returncode != 0 and "cannot reach the mesh's broker" in res.stderr, res.stderr
    assert a.paths.keypair.exists() and a.paths.mesh_file.exists()


async def test_reset_moves_the_data_aside_and_the_name_can_be_joined_again(
        mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    old = pubkey(a)
    (a.paths.config_file).write_text("[log]\nlevel = \"info\"\n")
    res = run_cli(a.home, "daemon", "reset", "--mesh", "m", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"keypair.json", "mesh.json", "outbox.db", "inbox.db"} <= set(out["moved"])
    assert (Path(out["to"]) / "keypair.json").exists(), "moved, not deleted"
    assert a.proc.wait(timeout=30) == 0
    del mesh.daemons["a"]
    assert a.paths.config_file.exists(), "the settings stay"
    ps = json.loads(run_cli(a.home, "daemon", "ps", "--json").stdout)
    assert ps["items"] == [], "the moved-aside copy is not taken for a joined mesh"
    join = run_cli(a.home, "daemon", "join", mesh.broker.invite("team"), "--mesh", "m")
    assert join.returncode == 0, join.stderr
    assert pubkey(a) != old
    # The broker still knows the old member: reset is local only.
    assert _members(mesh.broker)[old]["revoked_at"] is None  # type: ignore[index]


def _damage(path: Path, offset: int, length: int = 512) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xa5" * length)


def test_recover_of_a_healthy_daemon_has_nothing_to_do(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    assert d.stop() == 0
    res = run_cli(short_tmp, "daemon", "recover", "--mesh", "t")
    assert res.returncode == 0, res.stderr
    assert "nothing to repair" in res.stdout
    assert run_cli(short_tmp, "daemon", "recover", "--mesh", "t", "--dry-run").returncode == 0


def test_recover_salvages_the_readable_rows_of_a_damaged_outbox(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    for i in range(400):
        d.client.send({"to": "topic:ops", "body": f"message {i:04d} " + "x" * 200})
    assert d.stop() == 0
    db = d.paths.outbox_db
    size = db.stat().st_size
    page = 4096
    _damage(db, (size // page // 2) * page + 100, 2048)   # inside one page mid-file
    before = db.read_bytes()

    dry = run_cli(short_tmp, "daemon", "recover", "--mesh", "t", "--dry-run", "--json")
    assert dry.returncode == Exit.UNHEALTHY, dry.stderr   # damage found: scripts can tell
    plan = {f["target"]: f for f in json.loads(dry.stdout)["findings"]}
    assert plan["outbox.db"]["state"] == "damaged"
    assert plan["outbox.db"]["action"] == "salvage_outbox"
    assert db.read_bytes() == before, "a dry run changes nothing"
    human = run_cli(short_tmp, "daemon", "recover", "--mesh", "t", "--dry-run")
    assert "plan: copy every readable row" in human.stdout and "dry run" in human.stdout

    res = run_cli(short_tmp, "daemon", "recover", "--mesh", "t", "--json")
    assert res.returncode == 0, res.stderr
    done = {x["target"]: x for x in json.loads(res.stdout)["done"]}["outbox.db"]
    copied = done["tables"]["outbox"]["copied"]
    lost = done["tables"]["outbox"]["lost"]
    # Never silent: every row not copied is listed, with the id the index still knows.
    assert 0 < copied < 400 and copied + len(lost) == 400, (copied, len(lost))
    assert all(x.get("client_message_id") for x in lost)
    report = json.loads(Path(done["report"]).read_text())
    assert report["tables"]["outbox"]["copied"] == copied
    assert Path(done["damaged_copy"]).exists()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == copied
    finally:
        conn.close()
    again = start_daemon(short_tmp)              # the salvaged outbox opens
    assert again.client.outbox_list(limit=1)["counts"]
    assert again.stop() == 0


async def test_recover_moves_a_damaged_inbox_aside_and_the_broker_refills_it(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    assert b.stop() == 0
    a.client.send({"to": {"kind": "dm", "ref": pubkey(b)}, "body": "waiting for b"})
    await wait_for(lambda: a.client.outbox_list(status="done")["items"])
    _damage(b.paths.inbox_db, 0, 100)         # the header: not a database any more
    dry = run_cli(b.home, "daemon", "recover", "--mesh", "m", "--dry-run")
    assert dry.returncode == Exit.UNHEALTHY and "inbox.db: damaged" in dry.stdout, \
        dry.stdout + dry.stderr
    res = run_cli(b.home, "daemon", "recover", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr
    assert [x["target"] for x in json.loads(res.stdout)["done"]] == ["inbox.db"]
    b = mesh.restart("b")
    await wait_for(lambda: _bodies(b))
    assert await _bodies(b) == ["waiting for b"]


async def _bodies(d: RunningDaemon) -> list[str]:
    return [e["body"] for e in await inbox(d)]


def test_recover_says_a_damaged_keypair_needs_a_backup(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    assert d.stop() == 0
    paths = daemon_paths("t", {"TIDEMESH_HOME": str(short_tmp)})
    paths.keypair.write_text("{not json")
    res = run_cli(short_tmp, "daemon", "recover", "--mesh", "t")
    assert res.returncode == Exit.UNHEALTHY
    assert "keypair.json: damaged" in res.stdout and "daemon restore" in res.stdout
    assert paths.keypair.read_text() == "{not json", "never touched"
