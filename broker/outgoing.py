"""What one connection has yet to send (pure: no I/O, no clock).

Each connection's frames go out through its own writer task (``broker/server.py``), so that
nobody else's work waits on that connection's socket. Its queue holds two kinds of frame:

* its **own** frames (answers, deliveries, the handshake), in order, bounded in frames and
  bytes: a producer waits for room (only that connection's own tasks produce them), and a
  reader that stops taking frames is cut off by the writer (``slow_reader``);
* **presence** about other members (``peer_join`` / ``peer_leave``), never waited for:
  coalesced per member (a newer event about a member replaces an older one not yet sent, in
  the older one's place) and bounded, the oldest member's event dropped first;
* **presence batches** (``presence_batch``, for a daemon that negotiated them): one encoded
  frame shared by every listener of the mesh, never waited for, bounded in number, the oldest
  dropped first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

Subject = tuple[str, str]   # (mesh_id, pubkey) a presence event is about


@dataclass(frozen=True, slots=True)
class QueueLimits:
    frames: int = 1024          # own frames queued
    bytes: int = 256 << 10      # their encoded size (one frame always fits an empty queue)
    presence: int = 4096        # members with a presence event queued
    presence_batches: int = 64  # presence_batch frames queued


@dataclass(frozen=True, slots=True)
class CloseAfter:
    """Close the connection once the frames queued before this have gone out."""

    code: int
    reason: str


@dataclass(slots=True)
class PresenceText:
    """An encoded ``presence_batch`` frame (the same text queued on many connections)."""

    text: str
    dropped: bool = False


class Outgoing:
    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        # Own frames (encoded), presence subjects (their newest frame is in ``_presence``) and
        # a close, in the order they are to go out.
        self._order: deque[str | Subject | CloseAfter | PresenceText] = deque()
        self._batches: deque[PresenceText] = deque()
        self._presence: dict[Subject, dict[str, Any]] = {}
        self._frames = 0
        self._bytes = 0
        self.closing = False
        self.dropped = 0     # presence events dropped, in all

    def has_room(self) -> bool:
        if self.closing or self._frames == 0:
            return True
        return self._frames < self.limits.frames and self._bytes < self.limits.bytes

    def put(self, text: str) -> None:
        """One of the connection's own frames, after those already queued (once closing,
        dropped). The caller waits for ``has_room`` first."""
        if self.closing:
            return
        self._order.append(text)
        self._frames += 1
        self._bytes += len(text)

    def tell(self, frame: dict[str, Any]) -> int:
        """A presence event; returns how many older events it pushed out (0 or 1)."""
        if self.closing:
            return 0
        subject = (str(frame["mesh_id"]), str(frame["pubkey"]))
        if subject in self._presence:
            self._presence[subject] = frame     # the newest state, in the older one's place
            return 0
        self._presence[subject] = frame
        self._order.append(subject)
        if len(self._presence) <= self.limits.presence:
            return 0
        # Forget the oldest; its entry in ``_order`` is skipped when reached.
        del self._presence[next(iter(self._presence))]
        self.dropped += 1
        if len(self._order) > 2 * (self._frames + len(self._presence)) + 64:
            self._order = deque(i for i in self._order
                                if not isinstance(i, tuple) or i in self._presence)
        return 1

    def tell_batch(self, text: str) -> int:
        """A ``presence_batch`` frame; returns how many older ones it pushed out (0 or 1)."""
        if self.closing:
            return 0
        item = PresenceText(text)
        self._order.append(item)
        self._batches.append(item)
        if len(self._batches) <= self.limits.presence_batches:
            return 0
        self._batches.popleft().dropped = True   # skipped when reached in ``_order``
        self.dropped += 1
        return 1

    def close_after(self, code: int, reason: str) -> None:
        """Close once what is queued has gone out; nothing queued later is sent."""
        if not self.closing:
            self._order.append(CloseAfter(code, reason))
            self.closing = True

    def cut(self) -> None:
        """Drop everything: the connection is being cut off."""
        self._order.clear()
        self._presence.clear()
        self._batches.clear()
        self._frames = self._bytes = 0
        self.closing = True

    def take(self) -> str | dict[str, Any] | CloseAfter | None:
        """The next thing to write (an encoded own frame, a presence frame or the close),
        None when nothing is queued."""
        while self._order:
            item = self._order.popleft()
            if isinstance(item, str):
                self._frames -= 1
                self._bytes -= len(item)
                return item
            if isinstance(item, CloseAfter):
                return item
            if isinstance(item, PresenceText):
                if self._batches and self._batches[0] is item:
                    self._batches.popleft()
                if not item.dropped:
                    return item.text
                continue
            frame = self._presence.pop(item, None)
            if frame is not None:
                return frame
        return None
