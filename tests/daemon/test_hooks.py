"""Hooks in a real daemon without a broker: on-startup runs, pre-send vetoes a send before
it is stored, a bad hooks.toml stops the start, and the CLI lists and tests hooks."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli, spawn, start_daemon
from tests.e2e.harness import wait_for
from tidemesh.core.errors import SendVetoed, from_body
from tidemesh.core.exitcodes import Exit
from tidemesh.core.paths import daemon_paths

PRE_SEND = """#!/bin/sh
if grep -q forbidden; then echo "no forbidden words, please"; exit 1; fi
exit 0
"""


def hooks_folder(home: Path, files: dict[str, str], toml: str) -> Path:
    folder = daemon_paths("t", {"TIDEMESH_HOME": str(home)}).hooks_dir
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o700)
    (folder / "hooks.toml").write_text(toml)
    return folder


async def test_pre_send_veto_is_403_and_stores_nothing(short_tmp: Path) -> None:
    started = short_tmp / "started"
    hooks_folder(short_tmp, {
        "pre-send": PRE_SEND,
        "on-startup": f"#!/bin/sh\necho \"$TIDEMESH_HOOK_NAME $TIDEMESH_MESH\" >> {started}\n",
    }, "[pre-send]\n[on-startup]\n")
    d = start_daemon(short_tmp)
    try:
        assert stat.S_IMODE(d.paths.hooks_dir.stat().st_mode) == 0o700
        async with d.session() as s:
            async with s.post("/v1/send", json={"to": "topic:ops", "body": "forbidden fruit"},
                              headers={"Idempotency-Key": "veto-1"}) as r:
                assert r.status == 403
                err = (await r.json())["error"]
            assert err["code"] == "send_vetoed" and err["reason"] == "no forbidden words, please"
            assert err["hook_exit"] == 1
            assert d.outbox_rows() == [], "a vetoed send leaves no outbox row"
            async with s.post("/v1/send", json={"to": "topic:ops", "body": "fine"},
                              headers={"Idempotency-Key": "ok-1"}) as r:
                assert r.status == 202
            assert [r["client_message_id"] for r in d.outbox_rows()] == ["ok-1"]
            await wait_for(lambda: started.exists())
            assert started.read_text() == "on-startup t\n"
            async with s.get("/v1/metrics") as r:
                text = await r.text()
            assert 'cm_daemon_hook_invocations_total{exit="1",hook="pre-send"} 1.0' in text
    finally:
        assert d.stop() == 0
    audit = [json.loads(line) for line in d.log.read_text().splitlines()
             if '"hook_executed"' in line]
    assert {(a["hook"], a["exit"]) for a in audit} == {("pre-send", "1"), ("pre-send", "0"),
                                                       ("on-startup", "0")}
    assert all({"event_id", "duration_ms", "stdout_bytes", "replied"} <= a.keys()
               for a in audit)


def test_a_veto_is_send_vetoed_to_the_cli_and_the_sdk(short_tmp: Path) -> None:
    hooks_folder(short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    d = start_daemon(short_tmp)
    try:
        cli = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "forbidden")
        assert cli.returncode == Exit.REJECTED, cli.stderr
        assert cli.stderr.startswith("error: send_vetoed: the pre-send hook refused"), cli.stderr
        with pytest.raises(SendVetoed) as vetoed:
            d.client.send({"to": "topic:ops", "body": "forbidden"}, "sdk-veto")
        assert vetoed.value.details["reason"] == "no forbidden words, please"
        [result] = d.client.send_many([{"to": "topic:ops", "body": "forbidden"}])
        assert result["status"] == 403
        assert isinstance(from_body(result["status"], result["body"]), SendVetoed)
        assert d.outbox_rows() == []
    finally:
        assert d.stop() == 0


def test_bad_hooks_toml_stops_the_start(short_tmp: Path) -> None:
    hooks_folder(short_tmp, {"on-message": "#!/bin/sh\n"}, "[on-message]\ntimeout = 3\n")
    proc = spawn(short_tmp)
    assert proc.wait(timeout=30) == 2
    assert "unknown key on-message.timeout" in (short_tmp / "t.out").read_text()


def test_cli_lists_and_tests_hooks(short_tmp: Path) -> None:
    hooks_folder(short_tmp, {"on-dm": "#!/bin/sh\ncat\nexit 4\n", "on-reconnect": "#!/bin/sh\n"},
                 '[on-dm]\nredact_payload = ["$.body.secret"]\n')
    listed = run_cli(short_tmp, "daemon", "hooks", "list", "--mesh", "t", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {h["name"]: h["state"] for h in json.loads(listed.stdout)["hooks"]}
    assert states == {"on-dm": "enabled", "on-reconnect": "no hooks.toml table"}
    tested = run_cli(short_tmp, "daemon", "hooks", "test", "on-dm", "--mesh", "t", "--json")
    assert tested.returncode == 4, tested.stderr
    out = json.loads(tested.stdout)
    assert out["exit"] == 4
    event = json.loads(out["stdout"])
    assert event["type"] == "message" and json.loads(event["body"])["secret"] == "[redacted]"
    given = short_tmp / "event.json"
    given.write_text(json.dumps({"event_id": "mine", "body": "hello"}))
    tested = run_cli(short_tmp, "daemon", "hooks", "test", "on-dm", "--mesh", "t",
                     "--event", str(given), "--json")
    assert json.loads(json.loads(tested.stdout)["stdout"]) == {"event_id": "mine",
                                                                "body": "hello"}


def test_cli_test_of_a_missing_hook_fails(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "daemon", "hooks", "test", "on-nothing", "--mesh", "t")
    assert res.returncode != 0 and "no hook" in res.stderr


def test_cli_lists_a_hook_that_is_not_executable_and_tests_say_why(short_tmp: Path) -> None:
    folder = hooks_folder(short_tmp, {"on-dm": "#!/bin/sh\n"},
                          "[on-dm]\ntimeout_s = 30\n[on-message]\n")
    for name in ("on-message", "on-reconnect"):   # with and without a table
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o600)
    listed = run_cli(short_tmp, "daemon", "hooks", "list", "--mesh", "t", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {h["name"]: h for h in json.loads(listed.stdout)["hooks"]}
    assert {n: r["state"] for n, r in rows.items()} == {
        "on-dm": "enabled", "on-message": "not executable",
        "on-reconnect": "not executable"}
    human = run_cli(short_tmp, "daemon", "hooks", "list", "--mesh", "t").stdout
    (dm,) = [line.split() for line in human.splitlines() if line.startswith("on-dm")]
    (msg,) = [line.split() for line in human.splitlines() if line.startswith("on-message")]
    assert dm[2] == msg[3] == "30", "one number, one way: the given 30 and the default 30.0"
    tested = run_cli(short_tmp, "daemon", "hooks", "test", "on-message", "--mesh", "t")
    assert tested.returncode == 126
    assert "not executable" in tested.stderr and "chmod +x" in tested.stderr
