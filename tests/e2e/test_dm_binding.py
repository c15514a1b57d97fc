"""A broker operator cannot forge a DM by reflection nor show one twice by replay (issue 49
item 2): the sealed envelope names its sender, its recipient and its client_message_id, and
the recipient refuses one delivered as anything else."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.e2e.harness import (
    Mesh,
    connected,
    inbox,
    outbox_done,
    pubkey,
    send_keyed,
    wait_for,
)

pytestmark = pytest.mark.slow


async def test_a_reflected_and_a_replayed_dm_are_refused_with_the_words_kept_hidden(
        mesh: Mesh, short_tmp: Path) -> None:
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: connected(bob))
    await send_keyed(alice, f"dm:{pubkey(bob)}", "to-bob", "alice's own words")
    await wait_for(lambda: outbox_done(alice, 1))
    alice.stop()
    for cid in ("first", "decoy", "decoy-2"):
        await send_keyed(bob, f"dm:{pubkey(alice)}", cid, f"bob says {cid}")
    await wait_for(lambda: outbox_done(bob, 3))
    # The operator: alice's envelope for bob as bob's DM to alice; bob's first DM again
    # under another id.
    conn = sqlite3.connect(mesh.broker.home / "broker.db")
    with conn:
        body = dict(conn.execute("SELECT client_message_id, body FROM message_queue"))
        conn.execute("UPDATE message_queue SET body = ? WHERE client_message_id = 'decoy'",
                     (body["to-bob"],))
        conn.execute("UPDATE message_queue SET body = ? WHERE client_message_id = 'decoy-2'",
                     (body["first"],))
    conn.close()
    alice = mesh.restart("alice")

    async def three() -> bool:
        return len(await inbox(alice)) == 3

    await wait_for(three)
    got = {e["client_message_id"]: e for e in await inbox(alice)}
    assert got["first"]["body"] == "bob says first" and not got["first"]["meta"]
    reflected, replayed = got["decoy"], got["decoy-2"]
    assert "reflected" in reflected["meta"]["tidemesh_undecryptable"]
    assert "alice's own words" not in str(reflected)
    assert "replayed" in replayed["meta"]["tidemesh_undecryptable"]
    assert "bob says first" not in str(replayed)
    assert 'cm_daemon_invalid_inbound_total{mesh="m",reason="undecryptable"} 2.0' in (
        alice.client.metrics())
