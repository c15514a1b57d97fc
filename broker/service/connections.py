"""Who is connected (the registry) and what the others hear about it (presence).

A member may hold several connections; the first announces a ``peer_join``, the last a
``peer_leave``. Announcing walks nobody: the event joins the mesh's pending batch (the latest
per member), and one flush per ``presence_window_s`` walks the registry once, queueing on each
listener either one shared ``presence_batch`` frame (daemons that negotiated it) or the single
events. A member learns who is there from one snapshot (``peers``), then from these batches.
Presence metadata (profiles) lives in memory like presence itself: each daemon
holds the authoritative copy and sends it again after every connect. Presence is best effort:
it is queued on each listener's connection, coalesced per member, and never waited for.
With several brokers on one database, ``elsewhere`` (``service/cluster.py``) carries wake-ups
and presence to the other brokers and lists the members they serve.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from tidemesh.broker.service.coalesce import Coalescer
from tidemesh.core.features import PRESENCE_BATCH_MAX_COUNT
from tidemesh.core.ids import new_ulid
from tidemesh.core.ratelimit import Rate
from tidemesh.core.wire import CloseCode, encode

log = structlog.get_logger(__name__)
Key = tuple[str, str]   # (mesh_id, member pubkey)
# How often a member's profile changes take effect (a token bucket per member): those that
# come faster are answered at once and coalesced, the latest taking effect when the bucket
# has a token again (issue #31.6: 1,000 toggles of `visible` were 1,000 presence events).
PROFILE_RATE = Rate(per_s=0.5, burst=5)
# How often one member's comings and goings are announced (its peer_join / peer_leave): a
# member reconnecting in a loop is, past this, its latest state now and then.
PRESENCE_RATE = Rate(per_s=1.0, burst=10)
# How long presence changes gather before one flush tells them (issue #30: a storm of N
# joins told one at a time was N walks of N listeners): at least this, and 2 ms more per
# listener, since each flush is a frame to each of them: while changes keep coming, presence
# then costs about 500 frames a second whatever the number of members (the window is 0.4 s
# at 200 listeners, 2 s at 1,000; at most 3 s).
PRESENCE_WINDOW_S = 0.05
PRESENCE_WINDOW_PER_LISTENER_S = 0.002
PRESENCE_WINDOW_MAX_S = 3.0


class Elsewhere(Protocol):
    """The other brokers on this database, as the registry sees them."""

    def relay_wake(self, keys: set[tuple[str, str]]) -> None: ...

    def relay_presence(self, frame: dict[str, Any]) -> None:
        """Tell the other brokers, in the background; never waits."""
        ...

    async def remote_peers(self, mesh_id: str, local: set[str]) -> list[dict[str, Any]]: ...

    async def save_profile(self, mesh_id: str, pubkey: str, profile: dict[str, Any]) -> None: ...


class Peer(Protocol):
    """A connection's far end (``broker/server.py``'s ``WsPeer``)."""

    async def send_frame(self, frame: dict[str, Any]) -> None:
        """One of the connection's own frames, in order; waits only for room in the
        connection's own queue."""
        ...

    def tell(self, frame: dict[str, Any]) -> None:
        """A presence event about another member: queued, coalesced, never waited for."""
        ...

    def tell_batch(self, text: str) -> None:
        """An encoded ``presence_batch`` frame: queued, never waited for."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close after what is queued; returns without waiting for the close."""
        ...


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True, eq=False)  # identity, so a set can hold several per member
class Conn:
    peer: Peer
    mesh_id: str
    pubkey: str
    session_id: str
    display_name: str | None = None
    epoch: int = 0
    sent_seq: int = 0
    pumping: bool = False
    batch_deliveries: bool = False  # the daemon negotiated deliver_batch frames
    trace_context: bool = False     # the daemon negotiated traceparent in deliver frames
    presence_batch: bool = False    # the daemon negotiated presence_batch frames
    leaving: bool = False           # it asked for member_leave: its answer must go out first
    # After a 429 the connection is not read again before this (ms): see service/send.py.
    hold_until_ms: int = 0
    host: str | None = None      # the hello's host_fingerprint (service/clone.py)
    muted: bool = False          # a suspected clone's older session: no deliveries pumped
    connected_at: int = field(default_factory=now_ms)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Connections:
    def __init__(self, profile_rate: Rate = PROFILE_RATE,
                 presence_rate: Rate = PRESENCE_RATE,
                 presence_window_s: float = PRESENCE_WINDOW_S) -> None:
        self.conns: dict[Key, set[Conn]] = {}
        self.count = 0   # connections registered
        # Presence not told yet: per mesh, the latest event per member, oldest first.
        self.pending: dict[str, dict[str, dict[str, Any]]] = {}
        self.presence_window_s = presence_window_s
        self._flush: asyncio.TimerHandle | None = None
        # Counted by the service's metrics: announcements the other brokers did not get, and
        # connections closed for a revocation.
        self.presence_failed: Callable[[int], None] = lambda _n: None
        self.revoked_closed: Callable[[], None] = lambda: None
        # The profiles in effect: what ``peers`` shows and presence was told.
        self.profiles: dict[Key, dict[str, Any]] = {}
        # The other brokers on the same database; one broker alone has nobody to tell.
        self.elsewhere: Elsewhere | None = None
        # Each member's profile changes and presence events, within their budgets.
        self.profile_changes = Coalescer[dict[str, Any]]("profile", profile_rate,
                                                         self._apply_profile)
        self.presence_events = Coalescer[dict[str, Any]]("presence", presence_rate,
                                                         self._tell_everywhere)

    def active(self) -> list[tuple[dict[str, str], float]]:
        return [({}, float(self.count))]

    def register(self, peer: Peer, mesh_id: str, pubkey: str,
                 display_name: str | None = None, host: str | None = None
                 ) -> tuple[Conn, bool]:
        """Track a new connection; the bool says it is the member's first (a peer_join)."""
        conn = Conn(peer, mesh_id, pubkey, new_ulid(), display_name=display_name, host=host)
        conns = self.conns.setdefault((mesh_id, pubkey), set())
        conns.add(conn)
        self.count += 1
        log.info("broker_member_connected", mesh_id=mesh_id, pubkey=pubkey,
                 session_id=conn.session_id)
        return conn, len(conns) == 1

    def unregister(self, conn: Conn) -> bool:
        """Forget a connection; the bool says it was the member's last (a peer_leave)."""
        peers = self.conns.get((conn.mesh_id, conn.pubkey), set())
        if conn in peers:
            peers.discard(conn)
            self.count -= 1
        if not peers:
            self.conns.pop((conn.mesh_id, conn.pubkey), None)
        elif all(c.muted for c in peers):
            # The session that took the deliveries from a suspected clone ended: the newest
            # one left takes them over, so the member's deliveries never stop.
            heir = max(peers, key=lambda c: c.connected_at)
            heir.muted = False
            heir.wake.set()
        log.info("broker_member_disconnected", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                 session_id=conn.session_id)
        return not peers

    def wake(self, keys: Iterable[tuple[str, str]]) -> None:
        """Wake the delivery pumps of these (mesh, member) pairs' connections, here or, for
        members not connected here, on the other brokers (called after the commit)."""
        absent = self.wake_local(keys)
        if absent and self.elsewhere is not None:
            self.elsewhere.relay_wake(absent)

    def wake_local(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Wake this broker's pumps for these pairs; returns the pairs not connected here."""
        absent = set()
        for key in keys:
            conns = self.conns.get(key)
            if not conns:
                absent.add(key)
                continue
            for c in conns:
                c.wake.set()
        return absent

    async def close_revoked(self, mesh_id: str, pubkey: str, *, leavers: bool = True) -> None:
        """The member was revoked (or left): its connections here close 4002. Without
        ``leavers``, one that asked to leave is spared (the revocation's event can come
        before that connection's answer is queued; its daemon closes it, else the next
        recheck does)."""
        for c in list(self.conns.get((mesh_id, pubkey), ())):
            if c.leaving and not leavers:
                continue
            log.warning("broker_revoked_member_closed", mesh_id=mesh_id, pubkey=pubkey)
            self.revoked_closed()
            await c.peer.close(CloseCode.AUTH, "member_revoked")

    async def announce(self, conn: Conn, kind: str, *, hiding: bool = False) -> None:
        """peer_join / peer_leave to the mesh's other members; presence is best effort.
        A member whose profile says ``visible: false`` is not announced (but for the leave
        that says it hid: ``hiding``). Within the member's presence budget the event goes
        out now; past it, the member's latest event goes out when the budget allows."""
        profile = self.profiles.get((conn.mesh_id, conn.pubkey), {})
        if profile.get("visible") is False and not hiding:
            return
        frame: dict[str, Any] = {"type": kind, "mesh_id": conn.mesh_id, "pubkey": conn.pubkey,
                                 "at": now_ms()}
        if kind == "peer_join":
            frame["display_name"] = conn.display_name
            if profile:
                frame["profile"] = dict(profile)
        await self.presence_events.offer((conn.mesh_id, conn.pubkey), frame)

    async def _tell_everywhere(self, _key: Hashable, frame: dict[str, Any]) -> None:
        self.tell_local(frame)
        if self.elsewhere is not None:
            self.elsewhere.relay_presence(frame)

    def tell_local(self, frame: dict[str, Any]) -> None:
        """A presence event for the members of its mesh connected here, but its subject:
        kept for the next flush, in place of an older one about the same member. O(1): it
        walks nobody, and telling never waits on anyone's socket."""
        events = self.pending.setdefault(str(frame["mesh_id"]), {})
        events.pop(str(frame["pubkey"]), None)   # the latest goes last, in order
        events[str(frame["pubkey"])] = frame
        if self._flush is None:
            window = min(PRESENCE_WINDOW_MAX_S, max(
                self.presence_window_s, self.count * PRESENCE_WINDOW_PER_LISTENER_S))
            self._flush = asyncio.get_running_loop().call_later(window, self.flush)

    def flush(self) -> None:
        """Tell what is pending: one walk of the registry, each mesh's batch encoded once."""
        self._flush = None
        pending, self.pending = self.pending, {}
        texts: dict[str, list[str]] = {}
        for (mesh_id, pubkey), conns in self.conns.items():
            events = pending.get(mesh_id)
            if not events:
                continue
            for other in conns:
                if other.presence_batch:
                    if mesh_id not in texts:
                        texts[mesh_id] = batch_texts(mesh_id, list(events.values()))
                    for text in texts[mesh_id]:
                        other.peer.tell_batch(text)
                    continue
                for subject, frame in events.items():
                    if subject != pubkey:
                        other.peer.tell(frame)

    async def peers(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """Who is connected, with their profiles; hidden members only see themselves."""
        peers = []
        for (mesh_id, pubkey), conns in sorted(self.conns.items()):
            if mesh_id != conn.mesh_id or not conns:
                continue
            profile = self.profiles.get((mesh_id, pubkey), {})
            if profile.get("visible") is False and pubkey != conn.pubkey:
                continue
            newest = max(conns, key=lambda c: c.connected_at)
            peers.append({"pubkey": pubkey, "connections": len(conns),
                          "connected_at": min(c.connected_at for c in conns),
                          "display_name": newest.display_name, "profile": profile})
        if self.elsewhere is not None:
            peers += await self.elsewhere.remote_peers(conn.mesh_id,
                                                       {str(p["pubkey"]) for p in peers})
            peers.sort(key=lambda p: str(p["pubkey"]))
        return {"type": "peers", "id": frame["id"], "peers": peers}

    async def set_profile(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """Replace the member's profile; becoming hidden or visible is announced as a
        peer_leave or peer_join to the others. Within the member's profile budget it takes
        effect now; past it, the answer is the same but the latest profile takes effect
        when the budget allows (the ones between are never seen)."""
        await self.profile_changes.offer((conn.mesh_id, conn.pubkey), dict(frame["profile"]))
        return {"type": "result", "id": frame["id"], "ok": True}

    def stop(self) -> None:
        """The server stopped: changes still waiting for their budget are dropped."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self.pending.clear()
        self.profile_changes.stop()
        self.presence_events.stop()

    def prune_budgets(self, now: int) -> None:
        """Forget the budgets that have refilled (the same as none)."""
        self.profile_changes.prune(now)
        self.presence_events.prune(now)

    async def _apply_profile(self, key: Hashable, profile: dict[str, Any]) -> None:
        """The member's latest profile takes effect; a change of visibility is announced
        (to nobody when the member has left meanwhile: its leave went out as it left)."""
        assert isinstance(key, tuple)
        was_hidden = self.profiles.get(key, {}).get("visible") is False
        self.profiles[key] = profile
        hidden = profile.get("visible") is False
        if self.elsewhere is not None:
            await self.elsewhere.save_profile(key[0], key[1], profile)
        conns = self.conns.get(key)
        if not conns:
            return
        conn = max(conns, key=lambda c: c.connected_at)
        if was_hidden and not hidden:
            await self.announce(conn, "peer_join")
        elif hidden and not was_hidden:
            await self.announce(conn, "peer_leave", hiding=True)


def batch_texts(mesh_id: str, events: list[dict[str, Any]]) -> list[str]:
    """A mesh's pending events as encoded ``presence_batch`` frames (within the count cap)."""
    step = PRESENCE_BATCH_MAX_COUNT
    return [encode({"type": "presence_batch", "mesh_id": mesh_id, "events": events[i:i + step]})
            for i in range(0, len(events), step)]
