"""Peers, profiles and presence events across real processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Mesh, connected, pubkey, wait_for
from tidemesh.client import Client


def _peers(d: RunningDaemon) -> list[dict[str, Any]]:
    return list(d.client.request("GET", "/v1/peers").body["peers"])


def _events(d: RunningDaemon) -> list[Any]:
    return list(Client(d.paths.socket).events(since=0, idle_timeout=0.5))


async def test_profiles_peers_and_presence_events(mesh: Mesh, short_tmp: Path) -> None:
    b = mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: any(e.type == "peer_join" and e.data["pubkey"] == pubkey(a)
                               for e in _events(b)))
    res = run_cli(a.home, "profile", "--mesh", "m", "--summary", "building", "--status",
                  "working", "--capability", "deploy", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["published"] is True
    await wait_for(lambda: any(p["pubkey"] == pubkey(a) and p["profile"].get("status") == "working"
                               for p in _peers(b)))
    seen = {p["pubkey"]: p for p in _peers(b)}
    assert seen[pubkey(a)]["display_name"] == "a"
    assert seen[pubkey(a)]["profile"]["capabilities"] == ["deploy"]
    assert seen[pubkey(b)]["self"] is True
    # Hidden: gone from the others' list (a peer_leave for them), still in its own.
    assert run_cli(a.home, "profile", "--mesh", "m", "--hidden").returncode == 0
    await wait_for(lambda: pubkey(a) not in {p["pubkey"] for p in _peers(b)})
    assert pubkey(a) in {p["pubkey"] for p in _peers(a)}
    assert any(e.type == "peer_leave" and e.data["pubkey"] == pubkey(a) for e in _events(b))
    # The profile survives a restart of the daemon and is published again on connect.
    assert a.stop() == 0
    a = mesh.restart("a")
    await wait_for(lambda: connected(a))
    shown = json.loads(run_cli(a.home, "profile", "--mesh", "m", "--json").stdout)
    assert shown["profile"]["visible"] is False and shown["profile"]["summary"] == "building"
    await asyncio.sleep(0.3)
    assert pubkey(a) not in {p["pubkey"] for p in _peers(b)}
    assert run_cli(a.home, "profile", "--mesh", "m", "--visible").returncode == 0
    await wait_for(lambda: pubkey(a) in {p["pubkey"] for p in _peers(b)})
    assert a.stop() == 0
    await wait_for(lambda: pubkey(a) not in {p["pubkey"] for p in _peers(b)})
    human = run_cli(b.home, "peers", "--mesh", "m")
    assert "(this host)" in human.stdout


async def test_a_newcomer_sees_who_is_there_at_once_and_who_leaves(
        mesh: Mesh, short_tmp: Path) -> None:
    """B connects after A: its first peers answer already holds A (the broker's snapshot,
    not a join to wait for), and A's leave takes A out of it."""
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    b = mesh.add("b", short_tmp)
    await wait_for(lambda: connected(b))
    assert {pubkey(a), pubkey(b)} <= {p["pubkey"] for p in _peers(b)}
    assert a.stop() == 0
    await wait_for(lambda: pubkey(a) not in {p["pubkey"] for p in _peers(b)})
    [me] = _peers(b)
    assert me["pubkey"] == pubkey(b) and me["self"] is True and me["display_name"] == "b"


async def test_a_daemon_with_its_presence_feed_off_still_answers_peers(
        mesh: Mesh, short_tmp: Path) -> None:
    """``presence.feed`` false: the broker sends this daemon no presence (no events here),
    and its /v1/peers asks the broker each time, so it still says who is there."""
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    quiet = mesh.add("q", short_tmp, {"TIDEMESH_PRESENCE_FEED": "false"})
    await wait_for(lambda: connected(quiet))
    await wait_for(lambda: {pubkey(a), pubkey(quiet)} <= {p["pubkey"] for p in _peers(quiet)})
    assert {p["pubkey"]: p["self"] for p in _peers(quiet)}[pubkey(quiet)] is True
    await wait_for(lambda: any(e.type == "peer_join" and e.data["pubkey"] == pubkey(quiet)
                               for e in _events(a)))   # the others' feed is as it was
    assert a.stop() == 0
    await wait_for(lambda: pubkey(a) not in {p["pubkey"] for p in _peers(quiet)})
    assert not [e for e in _events(quiet) if e.type in ("peer_join", "peer_leave")]
