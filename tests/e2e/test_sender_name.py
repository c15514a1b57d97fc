"""A message carries its sender's display name (``daemon join --name``) into the inbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli
from tests.e2e.harness import Mesh, connected, inbox, wait_for

pytestmark = pytest.mark.slow


async def test_inbox_names_the_sender_as_it_joined(mesh: Mesh, short_tmp: Path) -> None:
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: connected(bob))
    assert run_cli(alice.home, "topic", "create", "--mesh", "m", "news").returncode == 0
    assert run_cli(bob.home, "topic", "subscribe", "--mesh", "m", "news").returncode == 0
    sent = run_cli(alice.home, "send", "--mesh", "m", "--to", "topic:news", "hello")
    assert sent.returncode == 0, sent.stderr

    async def arrived() -> list[dict[str, object]]:
        return await inbox(bob)

    await wait_for(arrived)
    assert [(e["body"], e["sender_name"]) for e in await inbox(bob)] == [("hello", "alice")]
    ev = run_cli(bob.home, "events", "--mesh", "m", "--since", "0", "--idle-exit", "2", "--json")
    messages = [json.loads(line) for line in ev.stdout.splitlines()
                if json.loads(line)["type"] == "message"]
    assert [m["data"]["sender_name"] for m in messages] == ["alice"], ev.stdout
