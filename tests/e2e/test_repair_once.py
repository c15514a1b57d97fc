"""Once means once after a repair too (a real broker, two real daemons): a member whose inbox is
rebuilt, by `daemon recover` after damage or by `daemon restore` into a fresh home, runs no
hook again for a message it had handled, keeps each message's event id, and offers a named
consumer only what came after."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, wait_for
from tests.e2e.test_hooks import add_with_hooks
from tidemesh.core.paths import daemon_paths

pytestmark = pytest.mark.slow

SECRET = "correct horse battery"
BEFORE, AFTER = 20, 3


def _hook(log: Path) -> str:
    return f'#!/bin/sh\necho "$TIDEMESH_MESSAGE_ID $TIDEMESH_EVENT_ID" >> {log}\n'


def _log(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    return [(p[0], p[1]) if len(p) == 2 else ("", p[0])
            for p in (line.split() for line in path.read_text().splitlines()) if p]


async def _handled_twenty(mesh: Mesh, root: Path, log: Path
                          ) -> tuple[RunningDaemon, RunningDaemon]:
    a = mesh.add("a", root)
    b = add_with_hooks(mesh, "b", root, {"on-message": _hook(log)},
                       '[on-message]\nnetwork_policy = "allow"\n')
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "load", "create": True}) as r:
        assert r.status == 200, await r.text()
    for i in range(BEFORE):   # bodies large enough that the inbox spans many pages
        a.client.send({"to": "topic:load", "body": f"m{i} " + "x" * 3000})
    await wait_for(lambda: len(_log(log)) >= BEFORE, timeout=60)
    # A named consumer that handled all of them.
    got = b.client.inbox(consumer="worker", limit=100)["items"]
    assert len(got) == BEFORE
    b.client.ack("worker", got[-1]["seq"])
    return a, b


async def _three_more_each_once(a: RunningDaemon, b: RunningDaemon, log: Path,
                                before: list[tuple[str, str]]) -> None:
    await wait_for(lambda: connected(b))
    await wait_for(lambda: _stored(b, BEFORE), timeout=30)
    for i in range(AFTER):
        a.client.send({"to": "topic:load", "body": f"new{i}"})
    await wait_for(lambda: _stored(b, BEFORE + AFTER), timeout=30)
    entries = await inbox(b, topic="load")
    await wait_for(lambda: len(_log(log)) >= BEFORE + AFTER, timeout=30)
    await _settle(b)
    lines = _log(log)
    runs = Counter(m for m, _ in lines)
    assert sorted(runs.values()) == [1] * (BEFORE + AFTER), (
        f"each message ran its hook exactly once: {len(lines)} runs for "
        f"{BEFORE + AFTER} messages")
    assert set(runs) == {e["broker_message_id"] for e in entries}
    # The event id a hook saw before the rebuild is the entry's id after it.
    ids = {e["broker_message_id"]: e["id"] for e in entries}
    assert all(ids[m] == ev for m, ev in lines), "event ids survive the rebuild"
    assert lines[:BEFORE] == before
    # The named consumer is offered only what came after what it handled.
    fresh = b.client.inbox(consumer="worker", limit=100)["items"]
    assert sorted(e["body"] for e in fresh) == [f"new{i}" for i in range(AFTER)]


async def _stored(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d, topic="load")) >= n


async def _settle(d: RunningDaemon) -> None:
    """Every hook run the ledger holds has ended."""
    def done() -> bool:
        conn = sqlite3.connect(f"file:{d.paths.inbox_db}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT COUNT(*) FROM hook_runs WHERE state != 'done'"
                                ).fetchone()[0] == 0
        finally:
            conn.close()
    await wait_for(done, timeout=30)


def _damage(db: Path) -> None:
    """Overwrite 8 KiB in the middle of the file, on page boundaries."""
    size = db.stat().st_size
    at = (size // 2) // 4096 * 4096
    with db.open("r+b") as f:
        f.seek(at)
        f.write(os.urandom(8192))


async def test_recover_after_a_damaged_inbox_runs_no_hook_again(
    mesh: Mesh, short_tmp: Path
) -> None:
    log = short_tmp / "hook.log"
    a, b = await _handled_twenty(mesh, short_tmp, log)
    before = _log(log)
    assert b.stop() == 0
    _damage(b.paths.inbox_db)
    res = run_cli(b.home, "daemon", "recover", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    plan = json.loads(res.stdout)
    assert any(f["target"] == "inbox.db" and f["state"] == "damaged"
               for f in plan["findings"]), plan
    b = mesh.restart("b")
    await _three_more_each_once(a, b, log, before)


async def test_restore_into_a_fresh_home_runs_no_hook_again(
    mesh: Mesh, short_tmp: Path
) -> None:
    log = short_tmp / "hook.log"
    a, b = await _handled_twenty(mesh, short_tmp, log)
    before = _log(log)
    secret = short_tmp / "pass.txt"
    secret.write_text(SECRET + "\n")
    bundle = short_tmp / "b.tmbk"
    res = run_cli(b.home, "daemon", "backup", "--mesh", "m", "--out", str(bundle),
                  "--passphrase-file", str(secret), "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    assert b.stop() == 0
    del mesh.daemons["b"]
    new = short_tmp / "n"
    new.mkdir()
    done = subprocess.run([sys.executable, "-m", "tidemesh", "daemon", "restore", str(bundle),
                           "--json"], capture_output=True, text=True, timeout=60, check=False,
                          env=daemon_env(new, {"TIDEMESH_BACKUP_PASSPHRASE": SECRET}))
    assert done.returncode == 0, done.stderr + done.stdout
    hooks = daemon_paths("m", {"TIDEMESH_HOME": str(new)}).hooks_dir
    shutil.copytree(b.paths.hooks_dir, hooks, dirs_exist_ok=True)
    r = start_daemon(new, "m")
    mesh.daemons["r"] = r
    await _three_more_each_once(a, r, log, before)
