"""A hostile member's sealed DM cannot silence its recipient (issue 47 item 1): a header
no clear send could carry (meta 600 levels deep, a reply_to that is an object) is stored
marked and acked, and what comes after it arrives."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nacl.public import Box
from nacl.signing import VerifyKey

from tests.daemon.harness import RunningDaemon
from tests.e2e.harness import (
    Mesh,
    connected,
    inbox,
    outbox_done,
    pubkey,
    send_keyed,
    wait_for,
)
from tidemesh.daemon.membership.identity import load_or_create_keypair

pytestmark = pytest.mark.slow

DEEP = b'{"a":' * 600 + b"1" + b"}" * 600


def _hostile_envelope(header: bytes, body: bytes) -> bytes:
    return bytes([3]) + len(header).to_bytes(4, "big") + header + body


def _sealed_by(sender: RunningDaemon, recipient: RunningDaemon, plain: bytes) -> bytes:
    """What a member that speaks the broker protocol itself may seal: any plaintext."""
    key, _ = load_or_create_keypair(sender.paths.keypair)
    to = VerifyKey(bytes.fromhex(pubkey(recipient))).to_curve25519_public_key()
    return bytes(Box(key.signing_key.to_curve25519_private_key(), to).encrypt(plain))


@pytest.mark.parametrize("header", [
    b'{"enc":"utf8","meta":' + DEEP + b',"priority":"next","reply_to":null}',
    b'{"enc":"utf8","meta":null,"priority":"next","reply_to":{"x":1}}',
], ids=["meta-600-deep", "reply_to-object"])
async def test_a_poison_header_is_stored_marked_and_the_next_dm_arrives(
        mesh: Mesh, short_tmp: Path, header: bytes) -> None:
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: connected(bob))
    bob.stop()
    await send_keyed(alice, f"dm:{pubkey(bob)}", "poison", "to be replaced")
    await send_keyed(alice, f"dm:{pubkey(bob)}", "after", "still heard")
    await wait_for(lambda: outbox_done(alice, 2))
    conn = sqlite3.connect(mesh.broker.home / "broker.db")
    with conn:
        conn.execute("UPDATE message_queue SET body = ? WHERE client_message_id = 'poison'",
                     (_sealed_by(alice, bob, _hostile_envelope(header, b"boom")),))
    conn.close()
    bob = mesh.restart("bob")

    async def both() -> bool:
        return len(await inbox(bob)) == 2

    await wait_for(both)
    got = {e["client_message_id"]: e for e in await inbox(bob)}
    assert got["after"]["body"] == "still heard"
    assert "tidemesh_meta_unreadable" in got["poison"]["meta"]
    assert got["poison"]["reply_to"] is None
    async with bob.session() as s, s.get("/v1/health") as r:
        health = await r.json()
    assert health["healthy"] and health["inbox_writes"]["failing"] == 0
    assert 'cm_daemon_invalid_inbound_total{mesh="m",reason="header_refused"} 1.0' in (
        bob.client.metrics())
    # Acked: after a restart nothing comes twice and nothing is stuck.
    bob = mesh.restart("bob")
    await wait_for(lambda: connected(bob))
    await send_keyed(alice, f"dm:{pubkey(bob)}", "later", "and later")

    async def three() -> bool:
        return len(await inbox(bob)) == 3

    await wait_for(three)
    assert sorted(e["client_message_id"] for e in await inbox(bob)) == ["after", "later",
                                                                       "poison"]
