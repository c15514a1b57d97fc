"""Where each broker delivery stands against the receive cursor (DESIGN §6). Pure: no I/O.

The receiver stores deliveries strictly in ``(epoch, seq)`` order and acks cumulatively. For
each delivery this decides whether it is the next one (store it and advance), one already
stored (drop it), or past a gap (resume from the cursor). After a resume the broker re-sends
from cursor+1, but frames it sent before the resume may still be queued ahead of those: until
the next in-order delivery arrives, out-of-order frames are dropped rather than read as new
gaps.

Deliveries come in frames (a ``deliver`` frame holds one, a ``deliver_batch`` frame many);
``plan`` places the frames taken off the link together, and says per frame which of its
deliveries to store, so that each frame can be written in one transaction. Frame boundaries
never change a placement: planning frames gives what placing their deliveries one by one
gives.

Imports nothing from the daemon; ``receiver.py`` does the storing, acking and resuming.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

Position = tuple[int, int]  # (epoch, seq)


class Placement(StrEnum):
    NEXT = "next"          # the delivery after the cursor: store it; the cursor moved to it
    STORED = "stored"      # at or before the cursor: a redelivery, already stored
    STALE = "stale"        # out of order, sent before the last resume: drop it
    GAP = "gap"            # out of order: resume from the cursor


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with frames of deliveries, in arrival order."""

    # One list per frame given: the indexes in that frame of its NEXT deliveries, to write in
    # order; empty for a frame with none, and for every frame from the gap on.
    store: list[list[int]] = field(default_factory=list)
    gap: Position | None = None    # the first delivery past a gap: the rest of the frames wait


@dataclass(slots=True)
class ReceiveOrder:
    cursor: Position
    resynced: bool = False

    def resumed(self, cursor: Position) -> None:
        """The broker accepted a resume and will deliver from ``cursor``'s next seq."""
        self.cursor = cursor
        self.resynced = True

    def place(self, epoch: int, seq: int) -> Placement:
        """Place one delivery; on ``NEXT`` the cursor is now ``(epoch, seq)``."""
        pos = (epoch, seq)
        if pos <= self.cursor:
            return Placement.STORED
        if pos != (self.cursor[0], self.cursor[1] + 1):
            return Placement.STALE if self.resynced else Placement.GAP
        self.resynced = False
        self.cursor = pos
        return Placement.NEXT

    def ack_position(self) -> Position | None:
        """What to ack after a batch: the cursor, unless nothing was ever received."""
        return self.cursor if self.cursor[1] > 0 else None

    def plan(self, frames: Sequence[Sequence[Position]]) -> Plan:
        """Place frames of deliveries: per frame, those to store, up to the first gap if there
        is one. After a gap nothing more is placed, not even the rest of its frame (a frame
        is stored whole or up to the gap); resume from the cursor, which stands on the last
        delivery to store."""
        store: list[list[int]] = [[] for _ in frames]
        for f, frame in enumerate(frames):
            for i, (epoch, seq) in enumerate(frame):
                placement = self.place(epoch, seq)
                if placement is Placement.GAP:
                    return Plan(store, (epoch, seq))
                if placement is Placement.NEXT:
                    store[f].append(i)
        return Plan(store)
