"""Fair load: each member's send budget (``core.ratelimit``) and where it comes from.

The broker's ``limits.member_rate`` / ``limits.member_burst`` apply to every mesh without an
override of its own (``tidemesh broker mesh limits``, kept in the store so every broker on a
database reads the same); ``refresh`` reloads the overrides and forgets refilled buckets,
every ``auth.recheck_s``. Buckets live in this process: with several brokers a member
connected to two of them has twice the budget.

The limiter only counts new sends. A frame that does not fit is looked up in the dedupe
table first (B0, one query for the frame) and its retries answered from there; one member's
such frames wait for each other, so its sends still reach the store in the order read.

Refusing keeps a member's order too: after a 429 the member owes its first refused send (a
*gate*). Its frames already on the wire behind the refused one would find the bucket refilled
and go through ahead of it; until a frame brings that send again, the member's other new
sends are refused as well, with the same wait. A gate whose send never comes back (the row
was aborted) opens ``GATE_SLACK_MS`` after its wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from tidemesh.broker.store.base import MeshLimits, Store
from tidemesh.core.ratelimit import Admission, Buckets, Rate

Member = tuple[str, str]   # (mesh_id, pubkey)
GATE_SLACK_MS = 10_000
# Sends refused by a gate whose wait is over (the owed send is late) wait at least this long.
GATE_MIN_WAIT_MS = 100


@dataclass(slots=True)
class Gate:
    client_message_id: str   # the first send refused: the member must send it again first
    retry_at_ms: int         # the time its 429 named

    def expired(self, now_ms: int) -> bool:
        """Its send never came back (the row was aborted): the gate opens."""
        return now_ms > self.retry_at_ms + GATE_SLACK_MS


class Limiter:
    def __init__(self, default: Rate, store: Store) -> None:
        self.default = default
        self.store = store
        self.buckets = Buckets()
        self.overrides: dict[str, Rate] = {}
        self._turns: dict[Member, tuple[asyncio.Lock, int]] = {}
        self._gates: dict[Member, Gate] = {}

    def rate(self, mesh_id: str) -> Rate:
        return self.overrides.get(mesh_id, self.default)

    def fast(self, member: Member, sends: int, now_ms: int) -> Admission | None:
        """Take ``sends`` tokens when all fit, none of the member's frames holds its turn and
        it owes no refused send; None sends the frame the slow way (``turn``, the gate, B0,
        ``admit``)."""
        if member in self._turns or member in self._gates:
            return None
        return self.if_fits(member, sends, now_ms)

    def gate(self, member: Member, client_message_ids: Collection[str], now_ms: int
             ) -> int | None:
        """How long the member's new sends in this frame must wait because it owes a refused
        send (ms); None when it owes none, or this frame brings it (which opens the gate)."""
        g = self._gates.get(member)
        if g is None:
            return None
        if g.client_message_id in client_message_ids or g.expired(now_ms):
            del self._gates[member]
            return None
        return max(GATE_MIN_WAIT_MS if now_ms >= g.retry_at_ms else 1, g.retry_at_ms - now_ms)

    def refused(self, member: Member, client_message_id: str, retry_at_ms: int) -> None:
        """The member was refused ``client_message_id`` (its first over budget) until
        ``retry_at_ms``; an earlier gate still open stays."""
        self._gates.setdefault(member, Gate(client_message_id, retry_at_ms))

    def if_fits(self, member: Member, sends: int, now_ms: int) -> Admission | None:
        """Take ``sends`` tokens when all fit (a frame holding the member's turn asks this
        before it pays for B0)."""
        rate = self.rate(member[0])
        if not self.buckets.fits(member, rate, sends, now_ms):
            return None
        return self.buckets.admit(member, rate, sends, now_ms)

    def admit(self, member: Member, sends: int, now_ms: int) -> Admission:
        return self.buckets.admit(member, self.rate(member[0]), sends, now_ms)

    def refund(self, member: Member, sends: int, now_ms: int) -> None:
        """Tokens back for sends that B1 rejected or the accept found were retries (200,
        409)."""
        self.buckets.refund(member, self.rate(member[0]), sends, now_ms)

    @asynccontextmanager
    async def turn(self, member: Member) -> AsyncIterator[None]:
        """One of the member's slow frames at a time, in the order they asked (asyncio's
        lock is first come, first served)."""
        lock, users = self._turns.get(member, (asyncio.Lock(), 0))
        self._turns[member] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[member]
            if users == 1:
                del self._turns[member]
            else:
                self._turns[member] = (lock, users - 1)

    async def refresh(self, now_ms: int) -> None:
        found = await self.store.mesh_limits()
        self.overrides = {mesh_id: self._rate_of(m) for mesh_id, m in found.items()}
        self.buckets.prune(self._key_rate, now_ms)
        for member in [m for m, g in self._gates.items() if g.expired(now_ms)]:
            del self._gates[member]

    def _key_rate(self, key: Hashable) -> Rate:
        assert isinstance(key, tuple)
        return self.rate(key[0])

    def _rate_of(self, m: MeshLimits) -> Rate:
        return Rate(self.default.per_s if m.member_rate is None else m.member_rate,
                    self.default.burst if m.member_burst is None else m.member_burst)
