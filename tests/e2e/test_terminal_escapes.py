"""A member's escape sequences and CRs reach another member's terminal as text, not as
controls: ``inbox``, ``events`` and ``peers`` print them escaped; ``--json`` stays exact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.harness import daemon_env, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, wait_for

pytestmark = pytest.mark.slow

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\r\x9b31m\u202e"
NAME = f"mallory{HOSTILE}"
BODY = f"hello{HOSTILE}there"


def raw_cli(home: Path, *args: str) -> bytes:
    """The CLI's stdout as bytes (text mode would turn a CR into a newline)."""
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         env=daemon_env(home), timeout=60, check=False)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res.stdout


def assert_inert(out: bytes) -> None:
    text = out.decode()
    assert b"\x1b" not in out and b"\r" not in out and b"\x07" not in out, out
    assert not any(0x80 <= ord(c) <= 0x9f or c == "\u202e" for c in text), out


async def test_member_text_is_escaped_in_human_output(mesh: Mesh, short_tmp: Path) -> None:
    home = short_tmp / "mallory"
    home.mkdir()
    joined = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                     "--name", NAME)
    assert joined.returncode == 0, joined.stderr
    mallory = start_daemon(home, "m")
    mesh.daemons["mallory"] = mallory
    bob = mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(mallory))
    await wait_for(lambda: connected(bob))
    assert run_cli(home, "topic", "create", "--mesh", "m", "news").returncode == 0
    assert run_cli(bob.home, "topic", "subscribe", "--mesh", "m", "news").returncode == 0
    assert run_cli(home, "profile", "--mesh", "m", "--summary", BODY).returncode == 0
    sent = run_cli(home, "send", "--mesh", "m", "--to", "topic:news", BODY)
    assert sent.returncode == 0, sent.stderr
    await wait_for(lambda: inbox(bob))

    shown = raw_cli(bob.home, "inbox", "--mesh", "m")
    assert_inert(shown)
    assert b"hello\\x1b]0;pwned\\x07" in shown, shown
    events = raw_cli(bob.home, "events", "--mesh", "m", "--since", "0", "--idle-exit", "1")
    assert_inert(events)
    assert b"\\x1b]0;pwned\\x07\\x1b[2J\\r\\x9b31m\\u202e" in events, events

    async def summary_seen() -> bool:
        peers = json.loads(raw_cli(bob.home, "peers", "--mesh", "m", "--json"))["peers"]
        return any((p.get("profile") or {}).get("summary") == BODY for p in peers)

    await wait_for(summary_seen)
    peers = raw_cli(bob.home, "peers", "--mesh", "m")
    assert_inert(peers)
    assert b"mallory\\x1b]0;pwned" in peers, peers

    # --json: the same values, exactly, and still no raw control for a terminal to act on.
    as_json = raw_cli(bob.home, "inbox", "--mesh", "m", "--json")
    assert_inert(as_json)
    item = json.loads(as_json)["items"][0]
    assert (item["body"], item["sender_name"]) == (BODY, NAME)
    peer_json = raw_cli(bob.home, "peers", "--mesh", "m", "--json")
    assert_inert(peer_json)
    assert NAME in [p.get("display_name") for p in json.loads(peer_json)["peers"]]
