"""Who is present in the mesh, as this daemon keeps it: one ``presence_snapshot`` from the
broker, then the numbered ``presence_batch`` changes after it. Sans I/O (no sockets, no
clock): ``linkstate.LinkState`` feeds it the frames, ``peers`` reads it.

The snapshot names the last batch it covers (``seq``). Batches that come before it (the
broker may flush while it builds the snapshot) are held, and those it does not cover are
applied after it; a batch it covers is never applied after it, so a change older than the
snapshot cannot undo it. Until the snapshot comes the set is not ``synced`` and ``peers``
asks the broker, as with a broker that sends no snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Frame = dict[str, Any]
# Batches held while the snapshot is on its way: the broker queues at most 64 batches per
# connection (``broker/outgoing.py``), so more never come before it; past this the oldest go.
HELD_MAX = 256
# What a ``peer_update`` may change of a member's entry.
UPDATED = ("display_name", "profile", "connections")


@dataclass(slots=True)
class PeerSet:
    me: str                                   # this member's pubkey
    synced: bool = False
    since: int = 0                            # the snapshot's seq
    members: dict[str, Frame] = field(default_factory=dict)
    held: list[Frame] = field(default_factory=list)
    incoming: dict[str, Frame] | None = None  # a snapshot whose last frame is still to come
    # This member's profile as it last sent it: the broker tells nobody of a hidden member's
    # changes, itself included, and its snapshot may predate the profile sent on connect.
    own_profile: Frame | None = None

    def on_snapshot(self, frame: Frame) -> None:
        """A frame of the broker's snapshot; at its last (``more`` absent), the set becomes
        it, then the held batches it does not cover are applied in order."""
        incoming = {} if self.incoming is None else self.incoming
        incoming.update((str(p["pubkey"]), dict(p)) for p in frame["peers"])
        if frame.get("more"):
            self.incoming, self.synced = incoming, False
            return
        self.incoming = None
        self.members = incoming
        self.since = int(frame["seq"])
        self.synced = True
        held, self.held = self.held, []
        for batch in held:
            self.on_batch(batch)

    def on_batch(self, frame: Frame) -> None:
        """A numbered ``presence_batch``: held before the snapshot, skipped when the
        snapshot covers it, else applied event by event."""
        if not self.synced:
            self.held.append(frame)
            del self.held[:-HELD_MAX]
            return
        if int(frame.get("seq", 0)) <= self.since:
            return
        for event in frame["events"]:
            self.apply(event)

    def apply(self, event: Frame) -> None:
        pubkey = str(event["pubkey"])
        kind = event["type"]
        if kind == "peer_key_rotated":
            # The old key is gone for good; the new one is present when it joins.
            self.members.pop(str(event["old_pubkey"]), None)
            return
        if kind == "peer_leave":
            # This member's own leave is its hiding: it still sees itself, as the broker's
            # peers answer does.
            if pubkey != self.me:
                self.members.pop(pubkey, None)
            return
        entry = self.members.get(pubkey)
        if kind == "peer_join" or entry is None:
            # An update about a member not held (its join was dropped from a full queue)
            # says enough to hold it.
            entry = {"pubkey": pubkey, "connections": 1, "connected_at": event["at"],
                     "display_name": None, "profile": {}}
            self.members[pubkey] = entry
        entry.update({k: event[k] for k in UPDATED if k in event})

    def peers(self) -> list[Frame]:
        """The members present, as the broker's ``peers`` answer lists them."""
        out = [dict(self.members[k]) for k in sorted(self.members)]
        for entry in out:
            if entry["pubkey"] == self.me and self.own_profile is not None:
                entry["profile"] = dict(self.own_profile)
        return out
