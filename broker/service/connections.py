"""Who is connected (the registry) and what the others hear about it (presence).

A member may hold several connections; the first announces a ``peer_join``, the last a
``peer_leave``. Announcing walks nobody: the event joins the mesh's pending batch (the latest
per member), and one flush per ``presence_window_s`` walks the registry once, queueing on each
listener either one shared ``presence_batch`` frame (daemons that negotiated it) or the single
events. A daemon that negotiated ``presence_snapshot`` learns who is there from one
``presence_snapshot`` frame after its negotiation, then from numbered batches (each flush has
the next ``seq``; the snapshot names the last one it covers, so the daemon skips the batches
it already holds), which also carry ``peer_update`` events (a present member's profile or
number of connections changed) so that its ``peers`` needs no question; an older daemon asks
``peers``.
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
from tidemesh.core.cancelling import being_cancelled
from tidemesh.core.features import PRESENCE_BATCH_MAX_COUNT, PRESENCE_SNAPSHOT_MAX_BYTES
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
# After a snapshot for a resync could not be made (the other brokers' sessions unreadable).
RESYNC_RETRY_S = 1.0


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

    async def send_text(self, text: str) -> None:
        """``send_frame`` for a frame encoded already."""
        ...

    def tell(self, frame: dict[str, Any]) -> None:
        """A presence event about another member: queued, coalesced, never waited for."""
        ...

    def tell_batch(self, text: str) -> bool:
        """An encoded ``presence_batch`` frame: queued, never waited for. True when the
        queue was full and pushed out an older batch."""
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
    # Its daemon negotiated: before that it drops presence (docs/broker.md, Presence
    # snapshot), so none is queued for it (in a connect storm, most of the frames sent).
    negotiated: bool = False
    presence_batch: bool = False    # the daemon negotiated presence_batch frames
    # ... and presence_snapshot: numbered batches, which may hold peer_update events.
    presence_snapshot: bool = False
    # False when the daemon asked for presence_on_demand: it is told of nobody's comings
    # and goings (it asks ``peers`` itself).
    presence_feed: bool = True
    leaving: bool = False           # it asked for member_leave: its answer must go out first
    key_rotation: bool = False      # the daemon negotiated key_rotation (peer_key_rotated)
    # Its key was rotated out: when it closes, its member has left for good, whether or not
    # a session row is still its own (the rotation removed it).
    rotated_out: bool = False
    # After a 429 the connection is not read again before this (ms): see service/send.py.
    hold_until_ms: int = 0
    host: str | None = None      # the hello's host_fingerprint (service/clone.py)
    muted: bool = False          # a suspected clone's older session: no deliveries pumped
    connected_at: int = field(default_factory=now_ms)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Woken for a topic message accepted for it: its topics logged, so its pump's hand-out
    # goes straight to its transaction (no query first to ask whether they did).
    logged: bool = False
    # The topics this connection's sends logged whose subscribers are still to be woken
    # (``Sends.wake_topics``, after the answer).
    logged_topics: set[tuple[str, str]] = field(default_factory=set)
    # A numbered presence batch was pushed out of its full queue: its daemon's peer set
    # misses changes, and only a new snapshot puts it right (``Connections.resync``).
    presence_stale: asyncio.Event = field(default_factory=asyncio.Event)


class Connections:
    def __init__(self, profile_rate: Rate = PROFILE_RATE,
                 presence_rate: Rate = PRESENCE_RATE,
                 presence_window_s: float = PRESENCE_WINDOW_S) -> None:
        self.conns: dict[Key, set[Conn]] = {}
        self.count = 0   # connections registered
        # Presence not told yet: per mesh, the latest event per member, oldest first.
        self.pending: dict[str, dict[str, dict[str, Any]]] = {}
        self.presence_window_s = presence_window_s
        # The last flush's number: a snapshot covers the flushes up to the one it names.
        self.seq = 0
        self._flush: asyncio.TimerHandle | None = None
        # Counted by the service's metrics: announcements the other brokers did not get, and
        # connections closed for a revocation.
        self.presence_failed: Callable[[int], None] = lambda _n: None
        # Presence entries queued for daemons, by kind (a metric): what N members coming at
        # once cost in all, about N² entries, whatever this broker does to batch them.
        self.presence_told: Callable[[str, int], None] = lambda _kind, _n: None
        self.revoked_closed: Callable[[], None] = lambda: None
        # ... and snapshots sent again after a dropped batch, and failures to make one.
        self.presence_resynced: Callable[[], None] = lambda: None
        self.resync_failed: Callable[[], None] = lambda: None
        # The profiles in effect: what ``peers`` shows and presence was told.
        self.profiles: dict[Key, dict[str, Any]] = {}
        # Each connected member's ``peers`` entry and its encoding, made when first asked
        # for and forgotten when it changes: a storm's snapshots re-encoded every member for
        # each newcomer.
        self._entries: dict[Key, tuple[dict[str, Any], str]] = {}
        # The other brokers on the same database; one broker alone has nobody to tell.
        self.elsewhere: Elsewhere | None = None
        # Per mesh, the last flush's number and the read of who is present (this broker's
        # members, then the other brokers') that every snapshot made until the next flush
        # shares: a storm's snapshots walked, filtered and sorted the whole registry for
        # each newcomer (a sixth of the broker's CPU with 1,000 members connecting at
        # once), and each newcomer that came while the other brokers' part was being read
        # did it again.
        self._shared: dict[str, tuple[int, asyncio.Future[SharedSnapshot]]] = {}
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
        self._entries.pop((mesh_id, pubkey), None)
        log.info("broker_member_connected", mesh_id=mesh_id, pubkey=pubkey,
                 session_id=conn.session_id)
        if len(conns) > 1:
            self._tell_update((mesh_id, pubkey))
        return conn, len(conns) == 1

    def unregister(self, conn: Conn) -> bool:
        """Forget a connection; the bool says it was the member's last (a peer_leave)."""
        peers = self.conns.get((conn.mesh_id, conn.pubkey), set())
        if conn in peers:
            peers.discard(conn)
            self.count -= 1
        self._entries.pop((conn.mesh_id, conn.pubkey), None)
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
        if peers:
            self._tell_update((conn.mesh_id, conn.pubkey))
        return not peers

    def wake(self, keys: Iterable[tuple[str, str]], logged: bool = False) -> None:
        """Wake the delivery pumps of these (mesh, member) pairs' connections, here or, for
        members not connected here, on the other brokers (called after the commit).
        ``logged``: for a topic message (``Conn.logged``)."""
        absent = self.wake_local(keys, logged)
        if absent and self.elsewhere is not None:
            self.elsewhere.relay_wake(absent)

    def wake_meshes(self, mesh_ids: set[str]) -> None:
        """Wake every pump here of these meshes, as for a topic message (when who subscribes
        could not be read)."""
        self.wake_local([key for key in self.conns if key[0] in mesh_ids], logged=True)

    def wake_local(self, keys: Iterable[tuple[str, str]], logged: bool = False
                   ) -> set[tuple[str, str]]:
        """Wake this broker's pumps for these pairs; returns the pairs not connected here."""
        absent = set()
        for key in keys:
            conns = self.conns.get(key)
            if not conns:
                absent.add(key)
                continue
            for c in conns:
                c.logged = c.logged or logged
                c.wake.set()
        return absent

    async def close_revoked(self, mesh_id: str, pubkey: str, *, leavers: bool = True,
                            rotated: bool = False) -> None:
        """The member was revoked (or left): its connections here close 4002; a key
        ``rotated`` out closes 4014. Without ``leavers``, one that asked to leave is spared
        (the revocation's event can come before that connection's answer is queued; its
        daemon closes it, else the next recheck does)."""
        code, reason = ((CloseCode.ROTATED_OUT, "key_rotated_out") if rotated
                        else (CloseCode.AUTH, "member_revoked"))
        for c in list(self.conns.get((mesh_id, pubkey), ())):
            if c.leaving and not leavers:
                continue
            log.warning("broker_revoked_member_closed", mesh_id=mesh_id, pubkey=pubkey,
                        rotated=rotated)
            self.revoked_closed()
            await c.peer.close(code, reason)

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

    async def _tell_everywhere(self, key: Hashable, frame: dict[str, Any]) -> None:
        if frame["type"] == "peer_join" and key in self.conns:
            # A join that waited for the member's budget says what the member is now.
            assert isinstance(key, tuple)
            frame = {**frame, **self._state(key, with_profile=bool(self.profiles.get(key)))}
        self.tell_local(frame)
        if self.elsewhere is not None:
            self.elsewhere.relay_presence(frame)

    def tell_local(self, frame: dict[str, Any]) -> None:
        """A presence event for the members of its mesh connected here, but its subject:
        kept for the next flush, in place of an older one about the same member. O(1): it
        walks nobody, and telling never waits on anyone's socket."""
        events = self.pending.setdefault(str(frame["mesh_id"]), {})
        before = events.pop(str(frame["pubkey"]), None)   # the latest goes last, in order
        if frame["type"] == "peer_update" and before is not None:
            # An update folds into what is pending: a join says the member's state with it;
            # after a leave, the join still to come will.
            frame = before if before["type"] == "peer_leave" else {**before, **frame,
                                                                    "type": before["type"]}
        events[str(frame["pubkey"])] = frame
        if self._flush is None:
            window = min(PRESENCE_WINDOW_MAX_S, max(
                self.presence_window_s, self.count * PRESENCE_WINDOW_PER_LISTENER_S))
            self._flush = asyncio.get_running_loop().call_later(window, self.flush)

    def flush(self) -> None:
        """Tell what is pending: one walk of the registry, each mesh's batch encoded once
        (twice when some daemons take numbered batches with updates and some do not)."""
        self._flush = None
        pending, self.pending = self.pending, {}
        if not pending:
            return
        self.seq += 1
        flush = Flush(pending, self.seq)
        for (mesh_id, pubkey), conns in self.conns.items():
            if mesh_id in pending:
                for other in conns:
                    flush.tell(other, pubkey)
        self.presence_told("event", flush.told)

    def tell_rotated(self, frame: dict[str, Any]) -> None:
        """A ``peer_key_rotated`` to the mesh's members connected here whose daemons asked
        for it (an older daemon would refuse the frame type)."""
        for (mesh_id, pubkey), conns in self.conns.items():
            if mesh_id != frame["mesh_id"] or pubkey in (frame["pubkey"], frame["old_pubkey"]):
                continue
            for other in conns:
                if other.key_rotation and other.presence_feed:
                    other.peer.tell(frame)

    async def peers(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """Who is connected, with their profiles; hidden members only see themselves."""
        return {"type": "peers", "id": frame["id"], "peers": await self.present(conn)}

    async def snapshot(self, conn: Conn) -> list[str]:
        """The encoded ``presence_snapshot`` frames for ``conn``: the registry read at once
        with the last flush's number (nothing awaited between), so that the batches after
        that number are the changes it does not hold; the other brokers' members are read
        after, and their changes meanwhile come in later batches."""
        seq = self.seq
        cached = self._shared.get(conn.mesh_id)
        if cached is None or cached[0] != seq:
            cached = self._read_shared(conn.mesh_id, seq)
        shared = await asyncio.shield(cached[1])
        # Its own member is in its snapshot even when hidden, or connected since the shared
        # part was made (the others who did are in the next batch, after ``seq``): then
        # the shared frames go as they are encoded once, and a last frame of its own.
        own = (conn.mesh_id, conn.pubkey)
        if conn.pubkey in shared.pubkeys or not self.conns.get(own):
            self.presence_told("snapshot", len(shared.entries))
            return shared.frames(conn.mesh_id, last=True)
        self.presence_told("snapshot", len(shared.entries) + 1)
        return [*shared.frames(conn.mesh_id, last=False),
                *snapshot_texts(conn.mesh_id, seq, [self._entry(own)[1]])]

    def _read_shared(self, mesh_id: str, seq: int
                     ) -> tuple[int, asyncio.Future[SharedSnapshot]]:
        """Start the read that the snapshots made while the last flush is ``seq`` share:
        this broker's visible members now (nothing awaited between the flush's number and
        the read), the other brokers' after. A change of theirs committed after their read
        is told in a flush after ``seq`` (its event comes by NOTIFY after its commit),
        which the snapshots' daemons then apply. A read that fails is forgotten: the next
        snapshot reads again."""
        entries = [(key[1], self._entry(key)[1]) for key, conns in self.conns.items()
                   if key[0] == mesh_id and conns and not self._hidden(key)]
        read: asyncio.Future[SharedSnapshot]
        if self.elsewhere is None:
            read = asyncio.get_running_loop().create_future()
            read.set_result(SharedSnapshot.of(seq, entries))
        else:
            read = asyncio.ensure_future(self._with_remote(mesh_id, seq, entries))
            read.add_done_callback(lambda f: self._forget_failed(mesh_id, f))
        self._shared[mesh_id] = cached = (seq, read)
        return cached

    async def _with_remote(self, mesh_id: str, seq: int,
                           entries: list[tuple[str, str]]) -> SharedSnapshot:
        assert self.elsewhere is not None
        local = {pubkey for pubkey, _ in entries}
        entries += [(str(p["pubkey"]), encode(p))
                    for p in await self.elsewhere.remote_peers(mesh_id, set())
                    if str(p["pubkey"]) not in local]
        return SharedSnapshot.of(seq, entries)

    def _forget_failed(self, mesh_id: str, read: asyncio.Future[SharedSnapshot]) -> None:
        if (read.cancelled() or read.exception() is not None) and \
                self._shared.get(mesh_id, (0, None))[1] is read:
            del self._shared[mesh_id]

    async def resync(self, conn: Conn) -> None:
        """For as long as the connection lives: after a numbered batch was dropped from its
        queue, a new snapshot, queued behind what it holds (the daemon skips the batches the
        snapshot covers and replaces its set). Several drops before it goes make one."""
        while True:
            await conn.presence_stale.wait()
            conn.presence_stale.clear()
            try:
                texts = await self.snapshot(conn)
            except Exception as exc:  # the other brokers' sessions unreadable: a store outage
                if being_cancelled():   # the cancel came as a store error: stop, not retry
                    raise asyncio.CancelledError from exc
                self.resync_failed()
                log.warning("broker_presence_resync_failed", mesh_id=conn.mesh_id,
                            pubkey=conn.pubkey, error=repr(exc))
                await asyncio.sleep(RESYNC_RETRY_S)
                conn.presence_stale.set()
                continue
            for text in texts:
                await conn.peer.send_text(text)
            self.presence_resynced()

    async def present(self, conn: Conn) -> list[dict[str, Any]]:
        """The members of ``conn``'s mesh who are present, as ``peers`` lists them: this
        broker's registry first, then the other brokers'."""
        peers = [entry for entry, _ in self._local(conn)]
        if self.elsewhere is not None:
            peers += await self.elsewhere.remote_peers(conn.mesh_id,
                                                       {str(p["pubkey"]) for p in peers})
        peers.sort(key=lambda p: str(p["pubkey"]))
        return peers

    def _local(self, conn: Conn) -> list[tuple[dict[str, Any], str]]:
        """The entries (and their encodings) of ``conn``'s mesh's members connected here;
        hidden ones but ``conn``'s own member left out."""
        return [self._entry(key) for key, conns in self.conns.items()
                if key[0] == conn.mesh_id and conns
                and (key[1] == conn.pubkey or not self._hidden(key))]

    def _hidden(self, key: Key) -> bool:
        return self.profiles.get(key, {}).get("visible") is False

    def _entry(self, key: Key) -> tuple[dict[str, Any], str]:
        """A connected member's ``peers`` entry and its encoding, made once per change."""
        cached = self._entries.get(key)
        if cached is None:
            entry = {"pubkey": key[1],
                     "connected_at": min(c.connected_at for c in self.conns[key]),
                     **self._state(key)}
            cached = self._entries[key] = (entry, encode(entry))
        return cached

    def _state(self, key: Key, *, with_profile: bool = True) -> dict[str, Any]:
        """A connected member's connections and display name (the newest connection's), and
        its profile unless told not to."""
        conns = self.conns.get(key) or ()
        newest = max(conns, key=lambda c: c.connected_at, default=None)
        state: dict[str, Any] = {"connections": max(1, len(conns)),
                                 "display_name": newest.display_name if newest else None}
        if with_profile:
            state["profile"] = dict(self.profiles.get(key, {}))
        return state

    def _tell_update(self, key: Key) -> None:
        """A present member's state changed (its connections, its profile): a ``peer_update``
        for the daemons that keep presence themselves; a hidden member's is told to nobody."""
        if self.profiles.get(key, {}).get("visible") is False:
            return
        self.tell_local({"type": "peer_update", "mesh_id": key[0], "pubkey": key[1],
                         "at": now_ms(), **self._state(key)})

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
        changed = self.profiles.get(key) != profile
        self.profiles[key] = profile
        self._entries.pop(key, None)
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
        elif not hidden and changed:
            # The profile is the update's whole news: the other brokers' listeners count
            # this member's connections their own way (one session each).
            frame = {"type": "peer_update", "mesh_id": key[0], "pubkey": key[1],
                     "at": now_ms(), "display_name": conn.display_name,
                     "profile": dict(profile)}
            self.tell_local(frame)
            if self.elsewhere is not None:
                self.elsewhere.relay_presence(frame)


@dataclass(slots=True)
class SharedSnapshot:
    """One read of a mesh's visible members (their pubkeys, and their encoded entries in
    pubkey order), shared by the snapshots made until the next flush, and its frames,
    encoded on first use: those of a snapshot that ends with them, or, for a newcomer
    that is not among them, with ``more`` on each (its own last frame follows)."""

    seq: int
    pubkeys: frozenset[str]
    entries: list[str]
    _frames: dict[bool, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, seq: int, entries: list[tuple[str, str]]) -> SharedSnapshot:
        """From (pubkey, encoded entry) pairs, in any order."""
        entries.sort()
        return cls(seq, frozenset(pubkey for pubkey, _ in entries),
                   [text for _, text in entries])

    def frames(self, mesh_id: str, *, last: bool) -> list[str]:
        got = self._frames.get(last)
        if got is None:
            got = self._frames[last] = snapshot_texts(mesh_id, self.seq, self.entries,
                                                      last=last)
        return got


class Flush:
    """One flush's pending events, encoded once per mesh for each kind of listener."""

    def __init__(self, pending: dict[str, dict[str, dict[str, Any]]], seq: int) -> None:
        self.pending = pending
        self.seq = seq
        self.numbered: dict[str, list[str]] = {}
        self.texts: dict[str, list[str]] = {}
        self.plain: dict[str, dict[str, dict[str, Any]]] = {}
        self.told = 0   # events queued, counted once per listener told

    def tell(self, listener: Conn, pubkey: str) -> None:
        """Queue the listener's mesh's events on it (``pubkey``: the listener's member)."""
        mesh_id = listener.mesh_id
        if not listener.negotiated or not listener.presence_feed:
            return
        if listener.presence_snapshot:
            if mesh_id not in self.numbered:
                self.numbered[mesh_id] = batch_texts(
                    mesh_id, list(self.pending[mesh_id].values()), self.seq)
            for text in self.numbered[mesh_id]:
                if listener.peer.tell_batch(text):
                    listener.presence_stale.set()
            self.told += len(self.pending[mesh_id])
            return
        if mesh_id not in self.plain:
            self.plain[mesh_id] = older_events(self.pending[mesh_id])
        if listener.presence_batch:
            if mesh_id not in self.texts:
                self.texts[mesh_id] = batch_texts(mesh_id, list(self.plain[mesh_id].values()))
            for text in self.texts[mesh_id]:
                listener.peer.tell_batch(text)
            self.told += len(self.plain[mesh_id])
            return
        for subject, frame in self.plain[mesh_id].items():
            if subject != pubkey:
                listener.peer.tell(frame)
                self.told += 1


def batch_texts(mesh_id: str, events: list[dict[str, Any]], seq: int | None = None
                ) -> list[str]:
    """A mesh's pending events as encoded ``presence_batch`` frames (within the count cap),
    numbered ``seq`` (all of them) for the daemons that negotiated ``presence_snapshot``."""
    step = PRESENCE_BATCH_MAX_COUNT
    numbered = {} if seq is None else {"seq": seq}
    return [encode({"type": "presence_batch", "mesh_id": mesh_id, **numbered,
                    "events": events[i:i + step]})
            for i in range(0, len(events), step)]


def snapshot_texts(mesh_id: str, seq: int, entries: list[str], *,
                   last: bool = True) -> list[str]:
    """One snapshot, from its members' encoded entries, as encoded frames of at most about
    ``PRESENCE_SNAPSHOT_MAX_BYTES`` (a member's entry never split), ``more: true`` on all
    but the last; with ``last=False`` on all (none for no entries: frames that a last one
    of the caller's follows). Put together as text: each entry is encoded once, not once
    per frame."""
    head = encode({"type": "presence_snapshot", "mesh_id": mesh_id, "seq": seq})[:-1]
    texts: list[str] = []
    part: list[str] = []
    size = 0
    for text in entries:
        if part and size + len(text) + 1 > PRESENCE_SNAPSHOT_MAX_BYTES:
            texts.append(f'{head},"more":true,"peers":[{",".join(part)}]}}')
            part, size = [], 0
        part.append(text)
        size += len(text) + 1
    if last:
        texts.append(f'{head},"peers":[{",".join(part)}]}}')
    elif part:
        texts.append(f'{head},"more":true,"peers":[{",".join(part)}]}}')
    return texts


def older_events(events: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pending events as a daemon without ``presence_snapshot`` takes them: no
    ``peer_update`` (its schemas do not know it), and a join without ``connections``."""
    return {pubkey: ({k: v for k, v in frame.items() if k != "connections"}
                     if frame["type"] == "peer_join" else frame)
            for pubkey, frame in events.items() if frame["type"] != "peer_update"}
