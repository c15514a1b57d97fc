"""The present set a daemon keeps (``daemon/link/peerset.py``), without sockets: one snapshot,
then the numbered batches it does not cover, in order."""

from __future__ import annotations

from typing import Any

from tidemesh.daemon.link.peerset import PeerSet

MESH = "01M8BQRTS5FD5WAAKSENZYEQ2J"
ME, ANN, BOB, CAT = "me", "ann", "bob", "cat"


def entry(pubkey: str, connections: int = 1, **kw: Any) -> dict[str, Any]:
    return {"pubkey": pubkey, "connections": connections, "connected_at": 1,
            "display_name": pubkey, "profile": {}, **kw}


def snapshot(seq: int, *peers: dict[str, Any]) -> dict[str, Any]:
    return {"type": "presence_snapshot", "mesh_id": MESH, "seq": seq, "peers": list(peers)}


def batch(seq: int, *events: tuple[str, str] | dict[str, Any]) -> dict[str, Any]:
    out = [e if isinstance(e, dict)
           else {"type": e[0], "mesh_id": MESH, "pubkey": e[1], "at": seq * 10}
           for e in events]
    return {"type": "presence_batch", "mesh_id": MESH, "seq": seq, "events": out}


def present(s: PeerSet) -> list[str]:
    return [p["pubkey"] for p in s.peers()]


def test_a_snapshot_then_its_changes() -> None:
    s = PeerSet(ME)
    assert not s.synced
    s.on_snapshot(snapshot(7, entry(ME), entry(ANN, 2)))
    assert s.synced and present(s) == [ANN, ME]
    assert s.peers()[0]["connections"] == 2
    s.on_batch(batch(8, ("peer_join", BOB), ("peer_leave", ANN)))
    assert present(s) == [BOB, ME]
    joined = s.peers()[0]
    assert (joined["connections"], joined["connected_at"]) == (1, 80)


def test_a_change_the_snapshot_covers_is_not_applied_after_it() -> None:
    """Ann left in flush 5, before the snapshot (seq 6) was taken; that batch comes after
    the snapshot (it was queued behind it): applying it would be right by luck, but an older
    join would bring back a member who is gone."""
    s = PeerSet(ME)
    s.on_snapshot(snapshot(6, entry(ME)))
    s.on_batch(batch(5, ("peer_join", ANN)))     # stale: ann's join, long since undone
    s.on_batch(batch(6, ("peer_join", BOB)))     # covered too
    assert present(s) == [ME]
    s.on_batch(batch(7, ("peer_join", CAT)))
    assert present(s) == [CAT, ME]


def test_batches_before_the_snapshot_are_held_and_those_it_does_not_cover_applied() -> None:
    """The broker flushes while it reads the other brokers' members for the snapshot: those
    batches come first, and only the ones after the snapshot's seq are news."""
    s = PeerSet(ME)
    s.on_batch(batch(3, ("peer_join", ANN)))     # covered by the snapshot below
    s.on_batch(batch(4, ("peer_leave", BOB)))    # not covered: bob left after
    assert s.peers() == [] and not s.synced
    s.on_snapshot(snapshot(3, entry(ME), entry(BOB)))
    assert present(s) == [ME]
    assert s.held == []


def test_updates_change_a_member_and_a_missed_join_is_made_good() -> None:
    s = PeerSet(ME)
    s.on_snapshot(snapshot(1, entry(ME), entry(ANN)))
    s.on_batch(batch(2, {"type": "peer_update", "mesh_id": MESH, "pubkey": ANN, "at": 20,
                         "profile": {"status": "dnd"}},
                     {"type": "peer_update", "mesh_id": MESH, "pubkey": BOB, "at": 20,
                      "connections": 2, "display_name": "bob"}))
    ann, bob = s.peers()[:2]
    assert (ann["profile"], ann["connections"]) == ({"status": "dnd"}, 1)
    assert (bob["pubkey"], bob["connections"], bob["display_name"]) == (BOB, 2, "bob")


def test_its_own_leave_is_its_hiding_and_its_own_profile_wins() -> None:
    """Hidden, a member still sees itself (as the broker's peers answer shows it), with the
    profile it sent last, not the snapshot's (taken before the profile reached the broker)."""
    s = PeerSet(ME)
    s.own_profile = {"visible": False, "summary": "x"}
    s.on_snapshot(snapshot(1, entry(ME, profile={"summary": "old"}), entry(ANN)))
    s.on_batch(batch(2, ("peer_leave", ME)))
    [ann, me] = s.peers()
    assert me["pubkey"] == ME and me["profile"] == {"visible": False, "summary": "x"}
    assert ann["profile"] == {}


def test_a_second_snapshot_replaces_the_set() -> None:
    s = PeerSet(ME)
    s.on_snapshot(snapshot(1, entry(ME), entry(ANN)))
    s.on_snapshot(snapshot(9, entry(ME), entry(BOB)))
    s.on_batch(batch(9, ("peer_join", CAT)))
    assert present(s) == [BOB, ME]


def test_a_rotated_key_leaves_the_set() -> None:
    s = PeerSet(ME)
    s.on_snapshot(snapshot(1, entry(ME), entry(ANN)))
    s.apply({"type": "peer_key_rotated", "mesh_id": MESH, "pubkey": BOB, "old_pubkey": ANN,
             "display_name": None, "at": 5})
    assert present(s) == [ME]


def test_a_snapshot_in_several_frames_counts_at_its_last() -> None:
    s = PeerSet(ME)
    s.on_snapshot({**snapshot(4, entry(ME)), "more": True})
    s.on_batch(batch(5, ("peer_join", CAT)))
    assert not s.synced and s.peers() == []
    s.on_snapshot(snapshot(4, entry(ANN)))
    assert s.synced and present(s) == [ANN, CAT, ME]
