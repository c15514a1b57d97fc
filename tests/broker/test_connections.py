"""The registry's presence, without sockets: an announcement walks nobody; one flush per
window tells each listener the window's changes, latest per member, as one shared
presence_batch frame or (to a daemon that did not negotiate it) as single events."""

from __future__ import annotations

import json
from typing import Any

from tidemesh.broker.service.connections import Connections


class Listener:
    def __init__(self) -> None:
        self.told: list[dict[str, Any]] = []
        self.batches: list[str] = []

    async def send_frame(self, frame: dict[str, Any]) -> None:
        return None

    def tell(self, frame: dict[str, Any]) -> None:
        self.told.append(frame)

    def tell_batch(self, text: str) -> None:
        self.batches.append(text)

    async def close(self, code: int, reason: str) -> None:
        return None


async def test_a_window_of_changes_is_one_shared_frame_or_single_events_after_one_flush(
) -> None:
    conns = Connections(presence_window_s=3600)   # flushed by hand below
    new, old = Listener(), Listener()
    batched, _ = conns.register(new, "m1", "carol")
    batched.presence_batch = True
    conns.register(old, "m1", "dave")
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
