"""The registry's presence, without sockets: an announcement walks nobody; one flush per
window tells each listener the window's changes, latest per member, as one shared
presence_batch frame or (to a daemon that did not negotiate it) as single events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tidemesh.broker.service.connections import Connections, snapshot_texts
from tidemesh.core.features import PRESENCE_SNAPSHOT_MAX_BYTES
from tidemesh.core.wire import check, encode


class Listener:
    """A connection's far end; ``room``: batches its queue holds, the oldest pushed out
    beyond that, as ``broker/outgoing.py`` does."""

    def __init__(self, room: int = 1 << 30) -> None:
        self.told: list[dict[str, Any]] = []
        self.batches: list[str] = []
        self.own: list[str] = []
        self.room = room

    async def send_frame(self, frame: dict[str, Any]) -> None:
        self.own.append(encode(frame))

    async def send_text(self, text: str) -> None:
        self.own.append(text)

    def tell(self, frame: dict[str, Any]) -> None:
        self.told.append(frame)

    def tell_batch(self, text: str) -> bool:
        self.batches.append(text)
        if len(self.batches) <= self.room:
            return False
        del self.batches[0]
        return True

    async def close(self, code: int, reason: str) -> None:
        return None


async def test_a_window_of_changes_is_one_shared_frame_or_single_events_after_one_flush(
) -> None:
    conns = Connections(presence_window_s=3600)   # flushed by hand below
    new, old = Listener(), Listener()
    batched, _ = conns.register(new, "m1", "carol")
    batched.negotiated = batched.presence_batch = True
    conns.register(old, "m1", "dave")[0].negotiated = True
    elsewhere = Listener()
    conns.register(elsewhere, "m2", "erin")
    bob, _ = conns.register(Listener(), "m1", "bob")
    await conns.announce(bob, "peer_join")
    await conns.announce(batched, "peer_join")
    await conns.announce(bob, "peer_leave")
    assert (new.batches, old.told) == ([], [])   # nobody walked, nothing told yet
    conns.flush()
    assert len(new.batches) == 1
    frame = json.loads(new.batches[0])
    assert (frame["type"], frame["mesh_id"]) == ("presence_batch", "m1")
    # The latest per member, in the order of their latest change; the listener itself is
    # named too (its link ignores it).
    assert [(e["type"], e["pubkey"]) for e in frame["events"]] == [
        ("peer_join", "carol"), ("peer_leave", "bob")]
    assert [(e["type"], e["pubkey"]) for e in old.told] == [
        ("peer_join", "carol"), ("peer_leave", "bob")]
    assert elsewhere.told == [] and elsewhere.batches == []
    conns.flush()
    assert len(new.batches) == 1 and len(old.told) == 2
    # A connection whose daemon has not negotiated yet drops presence: none is queued.
    unready = Listener()
    conns.register(unready, "m1", "fred")
    await conns.announce(bob, "peer_join")
    conns.flush()
    assert unready.told == [] and unready.batches == []


async def test_a_snapshot_names_the_last_flush_and_the_next_batches_come_numbered() -> None:
    """A daemon with presence_snapshot: the snapshot covers the flushes up to its seq, and
    only it gets numbered batches with peer_update events (a profile, a second connection);
    the others get the events they always had."""
    conns = Connections(presence_window_s=3600)
    snap, plain, single = Listener(), Listener(), Listener()
    keeper, _ = conns.register(snap, "m1", "carol")
    keeper.negotiated = keeper.presence_batch = keeper.presence_snapshot = True
    batched, _ = conns.register(plain, "m1", "dave")
    batched.negotiated = batched.presence_batch = True
    conns.register(single, "m1", "erin")[0].negotiated = True
    bob, _ = conns.register(Listener(), "m1", "bob")
    await conns.announce(bob, "peer_join")
    conns.flush()
    [taken] = [json.loads(t) for t in await conns.snapshot(keeper)]
    assert taken["seq"] == conns.seq == 1
    assert [p["pubkey"] for p in taken["peers"]] == ["bob", "carol", "dave", "erin"]
    # bob's profile changes, then a second connection of his opens: updates, not joins.
    await conns.set_profile(bob, {"id": "r1", "profile": {"status": "dnd"}})
    conns.register(Listener(), "m1", "bob")
    conns.flush()
    [numbered] = [json.loads(t) for t in snap.batches[1:]]
    assert numbered["seq"] == 2
    assert [(e["type"], e["pubkey"], e.get("connections"), e["profile"])
            for e in numbered["events"]] == [("peer_update", "bob", 2, {"status": "dnd"})]
    assert len(plain.batches) == 1 and "seq" not in json.loads(plain.batches[0])
    assert [e["type"] for e in single.told] == ["peer_join"]
    assert "connections" not in single.told[0]


async def test_newcomers_between_two_flushes_share_one_read_of_the_registry() -> None:
    """The snapshots made between two flushes share one read of who is present: each holds
    its own member too (even hidden), and who came or went since is in the next batch."""
    conns = Connections(presence_window_s=3600)
    early, _ = conns.register(Listener(), "m1", "bob")
    await conns.announce(early, "peer_join")
    conns.flush()
    first, _ = conns.register(Listener(), "m1", "dave")
    await conns.announce(first, "peer_join")
    [a] = [json.loads(t) for t in await conns.snapshot(first)]
    assert [p["pubkey"] for p in a["peers"]] == ["bob", "dave"]
    # Between the same flushes: carol comes (hidden) and bob leaves. Her snapshot is the
    # shared read plus herself; bob's leave and carol's absence from dave's
    # view are what the next batch tells.
    second, _ = conns.register(Listener(), "m1", "carol")
    await conns.set_profile(second, {"id": "r1", "profile": {"visible": False}})
    conns.unregister(early)
    await conns.announce(early, "peer_leave")
    # The shared frame goes as it is (more: true), then a last frame of her own.
    shared, own = [json.loads(t) for t in await conns.snapshot(second)]
    assert shared["seq"] == own["seq"] == a["seq"] == conns.seq
    assert (shared["more"], "more" in own) == (True, False)
    assert [p["pubkey"] for f in (shared, own) for p in f["peers"]] == ["bob", "dave", "carol"]
    assert [p["pubkey"] for p in (await conns.peers(first, {"id": "p"}))["peers"]] == ["dave"]
    # After the flush the next newcomer reads again: bob gone, hidden carol not shown.
    conns.flush()
    third, _ = conns.register(Listener(), "m1", "erin")
    [c] = [json.loads(t) for t in await conns.snapshot(third)]
    assert c["seq"] == conns.seq == a["seq"] + 1
    assert [p["pubkey"] for p in c["peers"]] == ["dave", "erin"]


async def test_an_update_folds_into_a_pending_join_and_a_leave_swallows_it() -> None:
    conns = Connections(presence_window_s=3600)
    plain = Listener()
    batched, _ = conns.register(plain, "m1", "dave")
    batched.negotiated = batched.presence_batch = True
    bob, _ = conns.register(Listener(), "m1", "bob")
    await conns.announce(bob, "peer_join")
    second, _ = conns.register(Listener(), "m1", "bob")
    conns.flush()
    [join] = json.loads(plain.batches[0])["events"]
    assert join["type"] == "peer_join" and "connections" not in join   # the older daemon's
    conns.unregister(second)
    conns.unregister(bob)
    await conns.announce(bob, "peer_leave")
    conns.register(Listener(), "m1", "bob")
    conns.register(Listener(), "m1", "bob")   # an update while the leave is pending
    conns.flush()
    assert [e["type"] for e in json.loads(plain.batches[1])["events"]] == ["peer_leave"]


async def test_a_dropped_numbered_batch_brings_a_new_snapshot_that_covers_it() -> None:
    """A listener whose queue pushed a numbered batch out misses that change; the resync
    sends it a snapshot of who is present now, numbered past every batch it dropped."""
    conns = Connections(presence_window_s=3600)
    resynced: list[int] = []
    conns.presence_resynced = lambda: resynced.append(1)
    slow = Listener(room=1)
    keeper, _ = conns.register(slow, "m1", "carol")
    keeper.negotiated = keeper.presence_batch = keeper.presence_snapshot = True
    others = [conns.register(Listener(), "m1", name)[0] for name in ("bob", "dave")]
    resync = asyncio.create_task(conns.resync(keeper))
    try:
        await conns.announce(others[0], "peer_join")
        conns.flush()
        await asyncio.sleep(0)
        assert not keeper.presence_stale.is_set() and slow.own == []
        await conns.announce(others[1], "peer_join")
        conns.flush()       # bob's join is pushed out of the full queue
        await conns.announce(others[0], "peer_leave")
        conns.unregister(others[0])
        conns.flush()       # and dave's
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(resynced) == 1, "two drops before the resync ran make one snapshot"
        [snap] = [json.loads(t) for t in slow.own]
        assert snap["type"] == "presence_snapshot" and snap["seq"] == conns.seq
        assert sorted(p["pubkey"] for p in snap["peers"]) == ["carol", "dave"]
    finally:
        resync.cancel()


def test_a_large_snapshot_goes_as_several_frames_each_member_whole() -> None:
    mesh = "01M8BQRTS5FD5WAAKSENZYEQ2J"
    peers = [{"pubkey": f"{i:064x}", "connections": 1, "connected_at": i,
              "display_name": None, "profile": {"bio": "b" * 4000}} for i in range(200)]
    frames = [json.loads(t) for t in snapshot_texts(mesh, 7, [encode(p) for p in peers])]
    assert len(frames) > 1
    assert [f.get("more", False) for f in frames] == [True] * (len(frames) - 1) + [False]
    assert [p for f in frames for p in f["peers"]] == peers
    for f in frames:
        check(f)
        assert f["seq"] == 7 and len(json.dumps(f)) < PRESENCE_SNAPSHOT_MAX_BYTES + 5000
    [alone] = [json.loads(t) for t in snapshot_texts(mesh, 0, [])]
    assert alone["peers"] == [] and "more" not in alone
