"""Fair load: each member's send budget (``core.ratelimit``) and where it comes from.

The broker's ``limits.member_rate`` / ``limits.member_burst`` apply to every mesh without an
override of its own (``tidemesh broker mesh limits``, kept in the store so every broker on a
database reads the same); ``refresh`` reloads the overrides and forgets refilled buckets,
every ``auth.recheck_s``. Buckets live in this process: with several brokers a member
connected to two of them has twice the budget.

The limiter only counts new sends. A frame that does not fit is looked up in the dedupe
table first (B0, one query for the frame) and its retries answered from there; one member's
such frames wait for each other, so its sends still reach the store in the order read.

Refusing keeps a member's order too: the sends it was refused are *owed*
(``core.ratelimit.Owed``). Its frames already on the wire behind a refused one would find
the bucket refilled and go through ahead of it; while it owes sends, its new ones are
refused (and owed in turn) with a wait until the owed ones may come back, and owed ones go
through in the order the member sends them again. A send that never comes back (the row
was aborted) stops being owed ``OWED_SLACK_MS`` after its wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Hashable, Sequence
from contextlib import asynccontextmanager

from tidemesh.broker.store.base import MeshLimits, Store
from tidemesh.core.ratelimit import Admission, Buckets, Owed, Rate

Member = tuple[str, str]   # (mesh_id, pubkey)
OWED_SLACK_MS = 10_000
# New sends held back behind an owed one that is late wait at least this long.
OWED_LATE_WAIT_MS = 100
# A daemon has at most its window (1,024 by default) of sends on the wire to be refused.
OWED_CAP = 4096


class Limiter:
    def __init__(self, default: Rate, store: Store) -> None:
        self.default = default
        self.store = store
        self.buckets = Buckets()
        self.overrides: dict[str, Rate] = {}
        self._turns: dict[Member, tuple[asyncio.Lock, int]] = {}
        self._owed: dict[Member, Owed] = {}

    def rate(self, mesh_id: str) -> Rate:
        return self.overrides.get(mesh_id, self.default)

    def fast(self, member: Member, sends: int, now_ms: int) -> Admission | None:
        """Take ``sends`` tokens when all fit, none of the member's frames holds its turn and
        it owes no refused send; None sends the frame the slow way (``turn``, B0,
        ``admit``)."""
        if member in self._turns or member in self._owed:
            return None
        return self.if_fits(member, sends, now_ms)

    def owes(self, member: Member, now_ms: int) -> bool:
        """Does the member owe refused sends (which its next frame must bring first)?"""
        return self._owed_by(member, now_ms) is not None

    def _owed_by(self, member: Member, now_ms: int) -> Owed | None:
        """The member's owed sends still due, None when there are none (then forgotten)."""
        owed = self._owed.get(member)
        if owed is not None:
            owed.expire(now_ms)
        return self._kept(member, owed)

    def _kept(self, member: Member, owed: Owed | None) -> Owed | None:
        if owed is not None and not owed:
            del self._owed[member]
            return None
        return owed

    def if_fits(self, member: Member, sends: int, now_ms: int) -> Admission | None:
        """Take ``sends`` tokens when all fit (a frame holding the member's turn asks this
        before it pays for B0; only while the member owes nothing)."""
        rate = self.rate(member[0])
        if not self.buckets.fits(member, rate, sends, now_ms):
            return None
        return self.buckets.admit(member, rate, sends, now_ms)

    def admit(self, member: Member, keys: Sequence[str | None], now_ms: int) -> Admission:
        """Decide a frame's new sends (their client_message_ids) in item order: owed ones,
        then new ones once the frame has brought back every one owed, each while a token is
        left. The refused ones are owed from now on."""
        owed = self._owed_by(member, now_ms)
        allowed = owed.allowed(keys) if owed is not None else len(keys)
        taken = self.buckets.admit(member, self.rate(member[0]), allowed, now_ms)
        waits = list(taken.retry_after_ms)
        if owed is not None and allowed < len(keys):
            held = owed.wait_ms(keys[:allowed], now_ms, OWED_LATE_WAIT_MS)
            waits += [max(held, waits[-1] if waits else 1)] * (len(keys) - allowed)
        if waits and owed is None:
            owed = self._owed[member] = Owed(OWED_SLACK_MS, OWED_CAP)
        if owed is not None:
            owed.settle(keys, taken.admitted, waits, now_ms)
            self._kept(member, owed)
        return Admission(taken.admitted, tuple(waits), taken.fill)

    def forgive(self, member: Member, keys: Collection[str]) -> None:
        """Sends found already accepted (B0) are owed no longer."""
        owed = self._owed.get(member)
        if owed is not None:
            owed.forget(keys)
            self._kept(member, owed)

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
        for member in list(self._owed):
            self._owed_by(member, now_ms)

    def _key_rate(self, key: Hashable) -> Rate:
        assert isinstance(key, tuple)
        return self.rate(key[0])

    def _rate_of(self, m: MeshLimits) -> Rate:
        return Rate(self.default.per_s if m.member_rate is None else m.member_rate,
                    self.default.burst if m.member_burst is None else m.member_burst)
