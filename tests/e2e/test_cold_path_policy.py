"""The cold path of `tidemesh send` holds the daemon's policy (DESIGN §11): the mesh's
pre-send hook vetoes there as in the daemon, a hooks.toml that cannot be read refuses, and a
daemon that holds the mesh's lock but does not answer (SIGSTOP) is neither bypassed nor
taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli
from tests.e2e.harness import Mesh, connected, inbox, two_on_topic, wait_for
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow

PRE_SEND = """#!/bin/sh
tee {seen} | grep -q forbidden && {{ echo "no forbidden words, please"; exit 1; }}
exit 0
"""


def _hooks(d: RunningDaemon, files: dict[str, str], toml: str) -> None:
    folder = d.paths.hooks_dir
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o700)
    (folder / "hooks.toml").write_text(toml)


def _send(d: RunningDaemon, body: str, *args: str) -> tuple[int, dict[str, object], str]:
    res = run_cli(d.home, "send", "--mesh", "m", "--to", "topic:ops", body, "--json", *args)
    return res.returncode, json.loads(res.stdout) if res.stdout.strip() else {}, res.stderr


async def test_the_pre_send_veto_holds_on_the_cold_path(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    seen = short_tmp / "seen.json"
    _hooks(a, {"pre-send": PRE_SEND.format(seen=seen)}, "[pre-send]\ntimeout_s = 20\n")
    assert a.stop() == 0
    code, out, err = _send(a, "a forbidden message", "--id", "cold-veto")
    assert code == Exit.REJECTED, (out, err)
    assert out["error"] == {"code": "send_vetoed",  # type: ignore[comparison-overlap]
                            "message": "the pre-send hook refused this send: no forbidden "
                                       "words, please",
                            "reason": "no forbidden words, please", "hook_exit": 1,
                            "timed_out": False}
    event = json.loads(seen.read_text())
    assert (event["type"], event["hook"], event["event_id"]) == ("pre_send", "pre-send",
                                                                "cold-veto")
    assert event["body"] == "a forbidden message" and event["to"] == {"kind": "topic",
                                                                       "ref": "ops"}
    code, out, err = _send(a, "a fine message")
    assert code == 0 and out["path"] == "cold", err
    await wait_for(lambda: _bodies(b, ["a fine message"]))


async def test_a_hooks_toml_the_cold_path_cannot_read_refuses_the_send(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    _hooks(a, {"pre-send": "#!/bin/sh\nexit 0\n"}, "[pre-send]\ntimeout = 20\n")
    assert a.stop() == 0
    code, out, err = _send(a, "anything")
    assert code == Exit.REJECTED, (out, err)
    error = out["error"]
    assert error["code"] == "send_vetoed"  # type: ignore[index]
    assert "hooks.toml" in error["message"]  # type: ignore[index]
    _hooks(a, {}, "[pre-send]\nenabled = false\n")
    code, out, err = _send(a, "now it may go")
    assert code == 0 and out["path"] == "cold", err
    await wait_for(lambda: _bodies(b, ["now it may go"]))


async def test_a_stopped_daemon_gets_its_own_error_and_keeps_its_session(
    mesh: Mesh, short_tmp: Path
) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        res = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:ops", "while stopped")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert res.returncode == Exit.NOT_ANSWERING, res.stdout + res.stderr
    assert "daemon_not_answering" in res.stderr and f"pid {a.proc.pid} holds" in res.stderr
    assert "Nothing was sent" in res.stderr
    assert await connected(a)
    sent = run_cli(a.home, "send", "--mesh", "m", "--to", "topic:ops", "after", "--json")
    assert json.loads(sent.stdout)["path"] == "daemon", sent.stderr
    await wait_for(lambda: _bodies(b, ["after"]))
    log = a.log.read_text()
    assert "broker_link_lost" not in log, "the daemon's broker session was left alone"


async def test_cold_sends_at_once_wait_for_each_other(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    started = short_tmp / "started"
    # The first cold send holds the mesh's lock while its hook runs.
    _hooks(a, {"pre-send": f"#!/bin/sh\ntouch {started}\nsleep 2\n"}, "[pre-send]\n")
    assert a.stop() == 0
    first = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "send", "--mesh", "m", "--to", "topic:ops", "one",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=daemon_env(a.home))
    await wait_for(started.exists)
    code, out, err = _send(a, "two")
    assert code == 0 and out["path"] == "cold", (out, err)
    assert first.wait(60) == 0, first.communicate()
    await wait_for(lambda: _sorted_bodies(b, ["one", "two"]))


async def _sorted_bodies(d: RunningDaemon, want: list[str]) -> bool:
    return sorted(e["body"] for e in await inbox(d)) == want


async def _bodies(d: RunningDaemon, want: list[str]) -> bool:
    got = [e["body"] for e in await inbox(d)]
    assert len(got) <= len(want), got
    return got == want
