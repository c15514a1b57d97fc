"""Fair load: each member's send budget (``core.ratelimit``) and where it comes from.

The broker's ``limits.member_rate`` / ``limits.member_burst`` apply to every mesh without an
override of its own (``tidemesh broker mesh limits``, kept in the store so every broker on a
database reads the same); ``refresh`` reloads the overrides and forgets refilled buckets,
every ``auth.recheck_s``. Buckets live in this process: with several brokers a member
connected to two of them has twice the budget.

The limiter only counts new sends. A frame that does not fit is looked up in the dedupe
table first (B0, one query for the frame) and its retries answered from there; one member's
such frames wait for each other, so its sends still reach the store in the order read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

from tidemesh.broker.store.base import MeshLimits, Store
from tidemesh.core.ratelimit import Admission, Buckets, Rate

Member = tuple[str, str]   # (mesh_id, pubkey)


class Limiter:
    def __init__(self, default: Rate, store: Store) -> None:
        self.default = default
        self.store = store
        self.buckets = Buckets()
        self.overrides: dict[str, Rate] = {}
        self._turns: dict[Member, tuple[asyncio.Lock, int]] = {}

    def rate(self, mesh_id: str) -> Rate:
        return self.overrides.get(mesh_id, self.default)

    def fast(self, member: Member, sends: int, now_ms: int) -> Admission | None:
        """Take ``sends`` tokens when all fit and none of the member's frames is waiting
        for its B0 lookup; None sends the frame the slow way (``turn``, B0, ``admit``)."""
        if member in self._turns:
            return None
        return self.if_fits(member, sends, now_ms)

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
        """Tokens back for sends that the accept found were retries (200, 409)."""
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

    def _key_rate(self, key: Hashable) -> Rate:
        assert isinstance(key, tuple)
        return self.rate(key[0])

    def _rate_of(self, m: MeshLimits) -> Rate:
        return Rate(self.default.per_s if m.member_rate is None else m.member_rate,
                    self.default.burst if m.member_burst is None else m.member_burst)
