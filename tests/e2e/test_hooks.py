"""Hooks end to end (a real broker, two real daemons): each kind fires for its events, a
reply token reaches only its own target, and across kill -9 every message's hook runs with
the message's id, a finished run never again."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for
from tidemesh.core.paths import daemon_paths

pytestmark = pytest.mark.slow

LOG_LINE = "#!/bin/sh\necho \"$TIDEMESH_HOOK_NAME $TIDEMESH_EVENT_ID\" >> {log}\n"

REPLY = """#!/usr/bin/python3
import http.client, json, os, socket, sys

event = json.load(sys.stdin)
with open({stdin!r}, "w") as f:
    json.dump(event, f)


class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.environ["TIDEMESH_DAEMON_SOCK"])


def call(method, path, body=None):
    conn = Unix("localhost")
    conn.request(method, path, body=None if body is None else json.dumps(body), headers={{
        "Authorization": "Bearer " + os.environ["TIDEMESH_CAPABILITY_TOKEN"],
        "Content-Type": "application/json"}})
    return conn.getresponse().status


codes = {{
    "reply": call("POST", "/v1/send", {{"to": "dm:" + event["from"], "body": "pong"}}),
    "other": call("POST", "/v1/send", {{"to": "dm:" + "ef" * 32, "body": "leak"}}),
    "topic": call("POST", "/v1/send", {{"to": "topic:load", "body": "leak"}}),
    "read": call("GET", "/v1/inbox"),
}}
with open({codes!r}, "w") as f:
    json.dump(codes, f)
"""


def add_with_hooks(mesh: Mesh, label: str, root: Path, files: dict[str, str],
                   toml: str, extra_env: dict[str, str] | None = None) -> RunningDaemon:
    """Mesh.add, with the hooks folder written between the join and the start."""
    home = root / label
    home.mkdir()
    res = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--name", label)
    assert res.returncode == 0, res.stderr + res.stdout
    folder = daemon_paths("m", {"TIDEMESH_HOME": str(home)}).hooks_dir
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o700)
    (folder / "hooks.toml").write_text(toml)
    d = start_daemon(home, "m", extra_env)
    mesh.daemons[label] = d
    return d


async def _post(d: RunningDaemon, path: str, body: dict[str, object]) -> int:
    async with d.session() as s, s.post(path, json=body) as r:
        return r.status


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_each_hook_kind_fires_and_a_reply_token_reaches_only_its_target(
    mesh: Mesh, short_tmp: Path
) -> None:
    log, stdin, codes = short_tmp / "hooks.log", short_tmp / "dm.json", short_tmp / "codes"
    line = LOG_LINE.format(log=log)
    a = mesh.add("a", short_tmp)
    b = add_with_hooks(mesh, "b", short_tmp, {
        "on-startup": line, "on-reconnect": line, "on-disconnect": line, "on-message": line,
        "on-topic-load": line, "on-topic-other": line,
        "on-dm": REPLY.format(stdin=str(stdin), codes=str(codes)),
    }, "[on-startup]\n[on-reconnect]\n[on-disconnect]\n[on-message]\n[on-topic-load]\n"
       "[on-topic-other]\n"
       '[on-dm]\nallow_reply = true\nredact_payload = ["$.body.secret"]\n')
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    assert await _post(b, "/v1/topics/subscribe", {"name": "load", "create": True}) == 200
    assert await _post(a, "/v1/send", {"to": "topic:load", "body": "t1"}) == 202
    assert await _post(a, "/v1/send", {"to": f"dm:{pubkey(b)}",
                                       "body": '{"secret": "s3", "keep": 1}'}) == 202
    await wait_for(lambda: codes.exists())
    assert json.loads(codes.read_text()) == {"reply": 202, "other": 403, "topic": 403,
                                             "read": 403}
    await wait_for(lambda: _has_pong(a))
    received = {m["to"]["kind"]: m["id"] for m in await inbox(b)}
    await wait_for(lambda: len(_lines(log)) >= 5)
    mesh.broker.kill()
    await wait_for(lambda: any(x.startswith("on-disconnect") for x in _lines(log)))
    fired = Counter(x.split()[0] for x in _lines(log))
    assert fired == {"on-startup": 1, "on-reconnect": 1, "on-message": 2, "on-topic-load": 1,
                     "on-disconnect": 1}
    ids = {tuple(x.split()) for x in _lines(log)}
    assert ("on-topic-load", received["topic"]) in ids
    assert {("on-message", received["topic"]), ("on-message", received["dm"])} <= ids
    event = json.loads(stdin.read_text())
    assert event["event_id"] == received["dm"] and event["from"] == pubkey(a)
    assert json.loads(event["body"]) == {"secret": "[redacted]", "keep": 1}
    audit = [json.loads(x) for x in b.log.read_text().splitlines() if '"hook_executed"' in x]
    assert [x["replied"] for x in audit if x["hook"] == "on-dm"] == [1]
    async with b.session() as s, s.get("/v1/metrics") as r:
        text = await r.text()
    assert 'cm_daemon_hook_capability_calls_total{hook="on-dm",scope="dm"} 1.0' in text
    assert 'cm_daemon_hook_invocations_total{exit="0",hook="on-topic-load"} 1.0' in text


async def _has_pong(d: RunningDaemon) -> bool:
    return any(m["body"] == "pong" for m in await inbox(d))


def _ledger(d: RunningDaemon) -> list[tuple[str, str]]:
    conn = sqlite3.connect(d.paths.inbox_db)
    try:
        return conn.execute("SELECT event_key, state FROM hook_runs").fetchall()
    finally:
        conn.close()


async def test_every_message_runs_its_hook_across_kill_9_and_finished_runs_never_again(
    mesh: Mesh, short_tmp: Path
) -> None:
    total, concurrency = 220, 8
    ran = short_tmp / "ran"
    hook = f"#!/bin/sh\necho \"$TIDEMESH_EVENT_ID\" >> {ran}\nsleep 0.05\n"
    a = mesh.add("a", short_tmp)
    b = add_with_hooks(mesh, "b", short_tmp, {"on-topic-load": hook},
                       '[on-topic-load]\nnetwork_policy = "allow"\n')
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    assert await _post(b, "/v1/topics/subscribe", {"name": "load", "create": True}) == 200
    statuses = await asyncio.gather(*(
        _post(a, "/v1/send", {"to": "topic:load", "body": f"m{i}"}) for i in range(total)))
    assert set(statuses) == {202}
    kills = 0
    for threshold in (40, 100, 160):
        await wait_for(lambda t=threshold: len(_lines(ran)) >= t, timeout=60)  # type: ignore[misc]
        b.kill()
        kills += 1
        b = mesh.restart("b")
    await wait_for(lambda: len(_ledger(b)) == total
                   and all(state == "done" for _, state in _ledger(b)), timeout=60)
    messages = {m["id"] for m in await inbox(b, topic="load")}
    assert len(messages) == total
    lines = _lines(ran)
    assert set(lines) == messages, "every stored message's hook ran, with the message's id"
    # Only a run the ledger had claimed and not settled when the daemon died runs again;
    # at most `concurrency` are claimed at a time.
    assert len(lines) - len(set(lines)) <= kills * concurrency
    # A clean restart runs nothing that finished: only the new message's hook runs.
    assert b.stop() == 0
    b = mesh.restart("b")
    await wait_for(lambda: connected(b))
    assert await _post(a, "/v1/send", {"to": "topic:load", "body": "last"}) == 202
    await wait_for(lambda: len(_ledger(b)) == total + 1
                   and all(state == "done" for _, state in _ledger(b)), timeout=60)
    after = _lines(ran)
    assert after[:len(lines)] == lines and len(after) == len(lines) + 1
    assert after[-1] not in messages
