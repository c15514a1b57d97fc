"""What the daemon may forget, and when (pure: no clock, no I/O; callers pass ``now``).

Outbox: a ``done`` or ``aborted`` row can still decide an 11-row answer until a retry of its
id could no longer be a retry of the same send — the outbox max age (spec §4.9) after it was
accepted — plus a margin. After that a retry is a fresh row, and the broker's dedupe (kept
longer than the max age, checked at start-up) answers it ``200 duplicate``. ``dead`` rows wait
for an operator, or ``dead_retention``. A requeue chain goes only as a whole, once every row of
it may go: a live row never loses the row it supersedes.

Inbox: entries and their events go after ``retention``; a named consumer that has not acked an
entry holds it until ``consumer_hold`` at most, and is then told how many it lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

SETTLED = ("done", "aborted")


@dataclass(frozen=True, slots=True)
class OutboxPolicy:
    max_age_ms: int             # as negotiated with the broker (spec §4.9)
    margin_ms: int              # kept past the max age, for clocks and slow retries
    dead_retention_ms: int      # how long a dead row waits for an operator

    def settled_cutoff(self, now_ms: int) -> int:
        """done/aborted rows accepted before this instant may go."""
        return now_ms - self.max_age_ms - self.margin_ms

    def dead_cutoff(self, now_ms: int) -> int:
        """dead rows that died before this instant may go."""
        return now_ms - self.dead_retention_ms


@dataclass(frozen=True, slots=True)
class ChainRow:
    """What the chain decision needs of one outbox row."""

    id: str
    status: str
    enqueued_at: int
    dead_at: int | None


def row_expired(row: ChainRow, policy: OutboxPolicy, now_ms: int) -> bool:
    if row.status in SETTLED:
        return row.enqueued_at < policy.settled_cutoff(now_ms)
    if row.status == "dead":
        died = row.dead_at if row.dead_at is not None else row.enqueued_at
        return died < policy.dead_cutoff(now_ms)
    return False          # pending and inflight rows are the outbox's promise: never


def chain_expired(rows: Sequence[ChainRow], policy: OutboxPolicy, now_ms: int) -> bool:
    """A requeue chain may go only when every row of it may."""
    return bool(rows) and all(row_expired(r, policy, now_ms) for r in rows)


@dataclass(frozen=True, slots=True)
class InboxPolicy:
    retention_ms: int           # entries older than this go ...
    consumer_hold_ms: int       # ... unless a consumer has not acked them, up to this age
    events_retention_ms: int    # the SSE event log; never longer than the inbox's

    def __post_init__(self) -> None:
        if self.consumer_hold_ms < self.retention_ms:
            raise ValueError("inbox.consumer_hold_days must be at least inbox.retention_days")
        if self.events_retention_ms > self.retention_ms:
            # An event refers to its inbox entry; keeping the event longer than the entry
            # would leave the event log with holes in the middle once entries go.
            raise ValueError("events.retention_days must not exceed inbox.retention_days")

    def cutoff(self, now_ms: int) -> int:
        return now_ms - self.retention_ms

    def hold_cutoff(self, now_ms: int) -> int:
        return now_ms - self.consumer_hold_ms

    def events_cutoff(self, now_ms: int) -> int:
        return now_ms - self.events_retention_ms


def entry_expired(seq: int, received_at: int, min_cursor: int | None, policy: InboxPolicy,
                  now_ms: int) -> bool:
    """``min_cursor`` is the lowest named-consumer cursor (None: no consumers)."""
    if received_at >= policy.cutoff(now_ms):
        return False
    acked_by_all = min_cursor is None or seq <= min_cursor
    return acked_by_all or received_at < policy.hold_cutoff(now_ms)


@dataclass(frozen=True, slots=True)
class Loss:
    """Entries a consumer never acked that retention removed."""

    count: int
    through_seq: int


def losses(deleted: Iterable[int], cursors: Mapping[str, int]) -> dict[str, Loss]:
    """Per consumer, the deleted entries past its cursor (the ones it had not acked)."""
    seqs = sorted(deleted)
    out: dict[str, Loss] = {}
    for name, cursor in cursors.items():
        unacked = [s for s in seqs if s > cursor]
        if unacked:
            out[name] = Loss(len(unacked), unacked[-1])
    return out


def below_floor(free_bytes: int, floor_bytes: int) -> bool:
    """Refuse new sends while the free space is under the floor (0 disables the floor)."""
    return floor_bytes > 0 and free_bytes < floor_bytes


def used_pct(total_bytes: int, free_bytes: int) -> float:
    if total_bytes <= 0:
        return 0.0
    return round(100.0 * (total_bytes - free_bytes) / total_bytes, 2)
