"""Both stores: a member's move to a new key (``rotate_member``) in one transaction, and DMs
to a rotated-out key (docs/broker.md, "Key rotation")."""

from __future__ import annotations

import pytest

from tests.broker.conftest import accept_input, new_pubkey, now_ms
from tests.broker.test_store_contract import _world
from tidemesh.broker.store.base import Store
from tidemesh.core.errors import Conflict, NotFound


async def test_rotation_moves_memberships_cursor_deliveries_and_dedupe(store: Store) -> None:
    w = await _world(store)
    await store.add_queue_consumer(w.mesh_id, "jobs", w.bob, now_ms())
    for cmid in ("t1", "t2", "t3"):
        await store.accept(accept_input(w.mesh_id, w.alice, cmid, body=cmid))  # bob, carol
    await store.accept(accept_input(w.mesh_id, w.alice, "d1", kind="dm", ref=w.bob, body="d1"))
    await store.accept(accept_input(w.mesh_id, w.bob, "mine", body="mine"))  # bob's own
    given = await store.deliveries_after(w.mesh_id, w.bob, 1, 0, 10)
    assert [r.body for r in given] == [b"t1", b"t2", b"t3", b"d1"]
    await store.ack(w.mesh_id, w.bob, 1, given[0].seq, now_ms())       # bob acked the first
    before = await store.cursor(w.mesh_id, w.bob)
    new = new_pubkey()

    moved = await store.rotate_member(w.mesh_id, w.bob, new, now_ms())

    assert moved == {"already": False, "subscriptions": 1, "queues": 1, "deliveries": 4,
                     "dedupe": 1}
    assert await store.cursor(w.mesh_id, new) == before             # nothing lost or repeated
    rest = await store.deliveries_after(w.mesh_id, new, before.epoch, before.acked_seq, 10)
    assert [(r.seq, r.body) for r in rest] == [(s.seq, s.body) for s in given[1:]]
    assert await store.deliveries_after(w.mesh_id, w.bob, before.epoch, 0, 10) == []
    old = await store.get_member(w.mesh_id, w.bob)
    assert old is not None and old.rotated_to == new and old.revoked_at is not None
    member = await store.get_member(w.mesh_id, new)
    assert member is not None and member.revoked_at is None and member.rotated_to is None
    # The topic reaches the new key (never bob's own message from the old one), and bob's
    # retried send is a duplicate under it.
    await store.accept(accept_input(w.mesh_id, w.alice, "t4", body="t4"))
    await store.hand_out(w.mesh_id, new, now_ms())                  # as its pump would
    later = await store.deliveries_after(w.mesh_id, new, before.epoch, given[-1].seq, 10)
    assert [(r.seq, r.body) for r in later] == [(given[-1].seq + 1, b"t4")]
    assert (await store.accept(accept_input(w.mesh_id, new, "mine", body="mine"))).status == 200


async def test_rotation_is_idempotent_and_refuses_what_it_cannot_do(store: Store) -> None:
    w = await _world(store)
    new = new_pubkey()
    assert (await store.rotate_member(w.mesh_id, w.bob, new, now_ms()))["already"] is False
    assert await store.rotate_member(w.mesh_id, w.bob, new, now_ms()) == {"already": True}
    with pytest.raises(Conflict, match="rotated out already"):
        await store.rotate_member(w.mesh_id, w.bob, new_pubkey(), now_ms())
    with pytest.raises(Conflict, match="member of this mesh already"):
        await store.rotate_member(w.mesh_id, new, w.carol, now_ms())
    with pytest.raises(NotFound):
        await store.rotate_member(w.mesh_id, new_pubkey(), new_pubkey(), now_ms())
    await store.revoke_member(w.mesh_id, w.carol, now_ms())
    with pytest.raises(NotFound, match="revoked"):
        await store.rotate_member(w.mesh_id, w.carol, new_pubkey(), now_ms())


async def test_a_dm_to_a_rotated_out_key_goes_to_the_newest_key(store: Store) -> None:
    w = await _world(store)
    second, third = new_pubkey(), new_pubkey()
    await store.rotate_member(w.mesh_id, w.bob, second, now_ms())
    await store.rotate_member(w.mesh_id, second, third, now_ms())
    for i, ref in enumerate((w.bob, second, third)):
        r = await store.accept(accept_input(w.mesh_id, w.alice, f"d{i}", kind="dm", ref=ref))
        assert r.status == 201, r
        assert [d.recipient_pubkey for d in r.deliveries] == [third]
    await store.revoke_member(w.mesh_id, third, now_ms())
    r = await store.accept(accept_input(w.mesh_id, w.alice, "d9", kind="dm", ref=w.bob))
    assert r.status == 404 and "revoked" in str(r.error)
