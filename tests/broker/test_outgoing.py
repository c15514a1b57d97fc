"""A connection's send queue, without sockets: own frames in order and bounded, presence
coalesced per member and dropped oldest first, the close after what was queued."""

from __future__ import annotations

from typing import Any

from tidemesh.broker.outgoing import CloseAfter, Outgoing, QueueLimits


def presence(kind: str, pubkey: str) -> dict[str, Any]:
    return {"type": kind, "mesh_id": "m", "pubkey": pubkey, "at": 1}


def drain(out: Outgoing) -> list[Any]:
    items = []
    while (item := out.take()) is not None:
        items.append(item)
    return items


def test_own_frames_keep_their_order_and_fill_the_queue() -> None:
    out = Outgoing(QueueLimits(frames=2, bytes=1 << 20, presence=8))
    assert out.has_room()
    out.put("a")
    out.put("b")
    assert not out.has_room()
    assert out.take() == "a"
    assert out.has_room()
    assert drain(out) == ["b"]


def test_one_big_frame_always_fits_an_empty_queue() -> None:
    out = Outgoing(QueueLimits(frames=10, bytes=4, presence=8))
    assert out.has_room()
    out.put("x" * 100)
    assert not out.has_room()


def test_a_newer_presence_event_replaces_the_older_in_its_place() -> None:
    out = Outgoing(QueueLimits(frames=10, bytes=1 << 20, presence=8))
    out.tell(presence("peer_join", "bob"))
    out.put("answer")
    out.tell(presence("peer_join", "carol"))
    out.tell(presence("peer_leave", "bob"))
    assert drain(out) == [presence("peer_leave", "bob"), "answer",
                          presence("peer_join", "carol")]


def test_presence_past_its_bound_drops_the_oldest_member() -> None:
    out = Outgoing(QueueLimits(frames=10, bytes=1 << 20, presence=2))
    dropped = [out.tell(presence("peer_join", k)) for k in ("a", "b", "c")]
    assert dropped == [0, 0, 1] and out.dropped == 1
    assert [f["pubkey"] for f in drain(out)] == ["b", "c"]


def test_presence_never_takes_the_room_of_own_frames() -> None:
    out = Outgoing(QueueLimits(frames=1, bytes=1 << 20, presence=1000))
    for i in range(500):
        out.tell(presence("peer_join", str(i)))
    assert out.has_room()


def test_the_close_goes_after_what_was_queued_and_nothing_after_it() -> None:
    out = Outgoing(QueueLimits())
    out.put("error")
    out.close_after(1008, "bad_signature")
    out.put("late")
    out.tell(presence("peer_join", "bob"))
    assert drain(out) == ["error", CloseAfter(1008, "bad_signature")]


def test_a_cut_drops_everything() -> None:
    out = Outgoing(QueueLimits())
    out.put("a")
    out.tell(presence("peer_join", "bob"))
    out.cut()
    assert out.take() is None and out.has_room()


def test_presence_batches_never_wait_and_the_oldest_is_dropped_past_the_bound() -> None:
    out = Outgoing(QueueLimits(frames=1, bytes=1 << 20, presence=8, presence_batches=2))
    out.put("own")
    assert not out.has_room()   # own frames full: batches are queued all the same
    assert [out.tell_batch(t) for t in ("b1", "b2", "b3")] == [0, 0, 1]
    assert drain(out) == ["own", "b2", "b3"]
    assert out.dropped == 1
