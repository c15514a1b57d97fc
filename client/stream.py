"""The event stream without I/O: Server-Sent Events parsing, and the resume cursor.

``GET /v1/events`` gives every event the gapless id of the daemon's event log. A stream can
also carry notices about itself, without an id (``history_truncated``, ``cursor_ahead``;
docs/ipc.md). ``Cursor`` decides what a reconnecting client asks for and which events it
passes on, so that across reconnects and daemon restarts nothing is missed and nothing is
given twice.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemesh.core.backoff import Backoff


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the daemon's log: ``message`` (an inbox entry), ``peer_join``,
    ``peer_leave``, ``peer_key_rotated`` (a peer moved to a new key: ``pubkey`` and
    ``old_pubkey``), ``broker_status``, ``outbox_dead``, ``hook_failed`` or
    ``clone_suspected`` (another host presents this member's key)."""

    id: int
    type: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Notice:
    """A remark about the stream itself, not an event of the log; it has no id.

    ``history_truncated``: retention removed events after the requested id (``missed`` of
    them); ``cursor_ahead``: the daemon never gave the requested id (its log was rebuilt)
    and replays from its oldest event.
    """

    type: str
    data: dict[str, Any]


@dataclass
class Parser:
    """Feed it the stream's lines; it returns each complete event or notice."""

    _fields: dict[str, str] = field(default_factory=dict)

    def feed(self, line: str) -> Event | Notice | None:
        line = line.rstrip("\r\n")
        if line:
            if not line.startswith(":"):  # ":" starts a comment (keepalive)
                key, _, value = line.partition(":")
                self._fields[key] = value.removeprefix(" ")
            return None
        fields, self._fields = self._fields, {}
        if "data" not in fields:
            return None
        kind, data = fields.get("event", "message"), json.loads(fields["data"])
        if "id" in fields:
            return Event(int(fields["id"]), kind, data)
        return Notice(kind, data)


@dataclass
class Cursor:
    """The last event id passed on; what to ask for on (re)connect, and what to pass on."""

    last_id: int | None = None

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        return headers

    def admit(self, item: Event | Notice) -> bool:
        """Whether to pass ``item`` on, moving the cursor past it."""
        if isinstance(item, Notice):
            if item.type == "cursor_ahead":
                # The log restarted below our id: its replay is new to us, ids and all.
                self.last_id = int(item.data["replay_from"]) - 1
            elif item.type == "history_truncated":
                # What is gone stays gone; asking from here again would repeat the notice.
                self.last_id = int(item.data["oldest_available"]) - 1
            return True
        if self.last_id is not None and item.id <= self.last_id:
            return False  # already given before a reconnect
        self.last_id = item.id
        return True


@dataclass
class Reconnect:
    """Whether to try again after a failed connection, and after how long: a stream that
    never connected fails at once; one that did keeps trying, quickly at first, then at
    most a second apart, as a restarting daemon needs."""

    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.05, maximum_s=1.0))
    rng: random.Random = field(default_factory=random.Random)  # jitter, not secrets
    connected: bool = False
    failures: int = 0

    def succeeded(self) -> None:
        self.connected, self.failures = True, 0

    def delay(self) -> float | None:
        """Seconds to wait before the next attempt; ``None``: give up (never connected)."""
        if not self.connected:
            return None
        self.failures += 1
        return self.backoff.delay(self.failures, self.rng)


@dataclass
class Quiet:
    """How long a stream may stay quiet before it ends (``None``: follow forever)."""

    limit_s: float | None
    clock: Callable[[], float] = time.monotonic
    _since: float = field(init=False)

    def __post_init__(self) -> None:
        self._since = self.clock()

    def touch(self) -> None:
        self._since = self.clock()

    def remaining(self) -> float | None:
        if self.limit_s is None:
            return None
        return max(0.0, self._since + self.limit_s - self.clock())

    def over(self) -> bool:
        return self.remaining() == 0.0

    def wait(self, want_s: float) -> float:
        """``want_s``, shortened so a wait never outlasts the quiet limit."""
        left = self.remaining()
        return want_s if left is None else min(want_s, left)
