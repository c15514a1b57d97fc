"""Several brokers on one PostgreSQL database (DESIGN §10): what one broker tells the others.

A send accepted here may be for a member connected to another broker, whose pump must wake; a
member connecting here may still hold a session on another broker, which must close; the
mesh's members see one presence whichever broker they use. The ``Cluster`` port
(``broker/store/cluster.py``) carries this between brokers (PostgreSQL LISTEN/NOTIFY and the
``member_session`` table, in ``broker/store/postgres/cluster.py``); the embedded SQLite
store serves one broker, whose ``SingleBroker`` carries nothing. The delivery table stays the
only truth: a wake-up that is lost only delays a delivery until the safety poll
(``Peering.poll``) finds the rows.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import structlog

from tidemesh.broker.service.clone import REASON as CLONE_REASON
from tidemesh.broker.service.clone import is_other_host
from tidemesh.broker.service.connections import Conn, Connections, now_ms
from tidemesh.broker.store.cluster import Cluster, Key, SessionRow, SingleBroker
from tidemesh.core.wire import CloseCode

log = structlog.get_logger(__name__)

T = TypeVar("T")
TAKEN_OVER = "session_taken_over"


class Peering:
    """This broker's side of the cluster: wakes local pumps for the others' accepts, closes a
    session another broker took over, and keeps presence mesh-wide."""

    def __init__(self, cluster: Cluster | SingleBroker, connections: Connections, *,
                 session_expiry_s: float = 15.0) -> None:
        self.connections = connections
        self.expiry_ms = int(session_expiry_s * 1000)
        self.single = isinstance(cluster, SingleBroker)
        self.unreleased: list[Conn] = []
        self.cluster: Cluster | SingleBroker = cluster
        # Set by service/clone.py: another broker closed a clone's sessions here (refuse_both).
        self.clone_seen: Callable[[str, str, list[str]], None] = lambda m, p, hosts: None
        if not isinstance(cluster, SingleBroker):
            self.shared: Cluster = cluster
            connections.elsewhere = self
            cluster.presence_unsent = lambda n: connections.presence_failed(n)

    # -- what the registry asks of the others (connections.Elsewhere) ---------------------

    def relay_wake(self, keys: set[Key]) -> None:
        self.cluster.publish_wake(keys)

    def relay_presence(self, frame: dict[str, Any]) -> None:
        self.shared.publish_presence(frame)

    async def remote_peers(self, mesh_id: str, local: set[str]) -> list[dict[str, Any]]:
        out = []
        for s in await self.shared.sessions(mesh_id, now_ms() - self.expiry_ms):
            if s.pubkey in local or s.profile.get("visible") is False:
                continue
            out.append({"pubkey": s.pubkey, "connections": 1, "connected_at": s.connected_at,
                        "display_name": s.display_name, "profile": s.profile})
        return out

    async def save_profile(self, mesh_id: str, pubkey: str, profile: dict[str, Any]) -> None:
        await self.shared.save_profile(mesh_id, pubkey, json.dumps(profile))

    # -- sessions --------------------------------------------------------------------------

    async def connected(self, conn: Conn, first_here: bool) -> bool:
        """Record ``conn`` as its member's live session; a session on another broker is taken
        over (that broker closes it). Returns whether to announce a ``peer_join``."""
        if self.single:
            return first_here
        old = await self.shared.claim(self._row(conn))
        if old is not None and old.session_id == conn.session_id:
            old = None  # a heartbeat got there first with this very session
        if (old is not None and old.broker_id != self.shared.broker_id
                and is_other_host(conn.host, old.host)):
            # A suspected clone (service/clone.py judged it before the hello_ack): taking the
            # session over would only start the two hosts taking it from each other.
            log.info("broker_session_kept_for_clone", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                     other_broker=old.broker_id, session_id=conn.session_id)
            return False
        if old is not None and old.broker_id != self.shared.broker_id:
            log.info("broker_session_took_over", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                     from_broker=old.broker_id, session_id=conn.session_id)
            await self.shared.publish_taken_over(old.broker_id, conn.mesh_id, conn.pubkey,
                                                 old.session_id)
            return False  # the member stayed present, on another broker
        return old is None

    async def disconnected(self, conn: Conn, last_here: bool) -> bool:
        """``conn`` closed; returns whether to announce a ``peer_leave``."""
        if self.single:
            return last_here
        rest = self.connections.conns.get((conn.mesh_id, conn.pubkey), set())
        successor = self._row(max(rest, key=lambda c: c.connected_at)) if rest else None
        held = await self.shared.release(conn.mesh_id, conn.pubkey, conn.session_id, successor)
        return last_here and held

    def release_later(self, conn: Conn) -> None:
        """``disconnected`` failed (the database was unreachable): the next heartbeat
        releases the session, and announces the leave then."""
        self.unreleased.append(conn)

    async def _release_unreleased(self) -> None:
        while self.unreleased:
            conn = self.unreleased[0]
            last = not self.connections.conns.get((conn.mesh_id, conn.pubkey))
            if await self.disconnected(conn, last):
                await self.connections.announce(conn, "peer_leave")
            self.unreleased.pop(0)

    async def on_taken_over(self, mesh_id: str, pubkey: str, session_id: str) -> None:
        """Close the session taken over, and the member's older connections here with it;
        one made here since (which took the session back) stays."""
        conns = list(self.connections.conns.get((mesh_id, pubkey), ()))
        taken = [c for c in conns if c.session_id == session_id]
        if not taken:
            return
        for c in conns:
            if c.connected_at <= taken[0].connected_at:
                log.info("broker_session_taken_over", mesh_id=mesh_id, pubkey=pubkey,
                         session_id=c.session_id)
                await c.peer.close(CloseCode.TAKEN_OVER, TAKEN_OVER)

    def _row(self, conn: Conn) -> SessionRow:
        return SessionRow(conn.mesh_id, conn.pubkey, self.shared.broker_id, conn.session_id,
                          conn.display_name,
                          self.connections.profiles.get((conn.mesh_id, conn.pubkey), {}),
                          conn.connected_at, conn.host)

    # -- clones (service/clone.py) ---------------------------------------------------------

    async def remote_session(self, mesh_id: str, pubkey: str) -> SessionRow | None:
        """The member's live session on another broker, if any."""
        if self.single:
            return None
        row = await self.shared.session_of(mesh_id, pubkey, now_ms() - self.expiry_ms)
        return None if row is None or row.broker_id == self.shared.broker_id else row

    async def act_on_clone(self, row: SessionRow, new_host: str, close: bool,
                           policy: str) -> None:
        if row.host is not None:
            await self.shared.publish_clone(row.broker_id, row.mesh_id, row.pubkey, row.host,
                                            new_host, close, policy)

    async def on_clone(self, mesh_id: str, pubkey: str, host: str, new_host: str | None,
                       close: bool, policy: str) -> None:
        """Another broker judged a new session of this member (from ``new_host``) a clone of
        ours from ``host``: close those sessions (refuse_both, and the key is quarantined
        here too: ``clone_seen``) or tell them (they keep their deliveries)."""
        if close and new_host is not None:
            self.clone_seen(mesh_id, pubkey, [host, new_host])
        for c in list(self.connections.conns.get((mesh_id, pubkey), ())):
            if c.host != host:
                continue
            if close:
                await c.peer.close(CloseCode.CLONE, CLONE_REASON)
            else:
                await c.peer.send_frame({"type": "clone_suspected", "mesh_id": mesh_id,
                                         "pubkey": pubkey, "policy": policy,
                                         "receives_deliveries": not c.muted, "at": now_ms()})

    # -- what the others tell this broker (ClusterEvents) ----------------------------------

    def on_wake(self, keys: Iterable[Key]) -> None:
        self.connections.wake_local(keys)

    def on_listening(self) -> None:
        # Wake-ups sent while this broker was not listening are lost: look at every pump.
        self.connections.wake_local(list(self.connections.conns))

    async def on_presence(self, frame: dict[str, Any]) -> None:
        self.connections.tell_local(frame)

    async def on_revoked(self, mesh_id: str, pubkey: str) -> None:
        await self.connections.close_revoked(mesh_id, pubkey, leavers=False)

    # -- background jobs -------------------------------------------------------------------

    async def run(self) -> None:
        await self.cluster.run(self)

    async def exclusively(self, job: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """A periodic job (the retention sweep, queue lease moves) that every broker runs on
        its own timer but only one at a time may do: the others skip this round."""
        return await self.cluster.exclusively(job, fn)

    async def heartbeat(self) -> None:
        """Say this broker is alive; then remove the sessions of brokers that stopped saying
        so, announcing each as a ``peer_leave`` (the delete decides who announces it)."""
        if self.single:
            return
        now = now_ms()
        # Half the expiry: another broker's expiry, judging from an older snapshot, can
        # only have removed our rows if our last heartbeat was nearly that old.
        put_back = await self.shared.heartbeat(now, now - self.expiry_ms // 2, self._live_rows)
        await self._release_ended(put_back)
        await self._release_unreleased()
        for gone in await self.shared.expire(now - self.expiry_ms):
            log.info("broker_session_expired", mesh_id=gone.mesh_id, pubkey=gone.pubkey,
                     broker_id=gone.broker_id)
            if gone.profile.get("visible") is False:
                continue
            frame = {"type": "peer_leave", "mesh_id": gone.mesh_id, "pubkey": gone.pubkey,
                     "at": now}
            self.connections.tell_local(frame)
            self.shared.publish_presence(frame)

    def _live_rows(self) -> list[SessionRow]:
        return [self._row(max(cs, key=lambda c: c.connected_at))
                for cs in self.connections.conns.values() if cs]

    async def _release_ended(self, rows: Sequence[SessionRow]) -> None:
        """The heartbeat puts back missing rows of the sessions it read as live; one of them
        may have ended while the heartbeat was on its way, its row deleted before the
        heartbeat's insert landed. Release those again, now that the insert has committed
        (a session that ends from now on releases its own row after it), so that a member
        who left never stays present."""
        for row in rows:
            here = self.connections.conns.get((row.mesh_id, row.pubkey), set())
            if any(c.session_id == row.session_id for c in here):
                continue
            successor = self._row(max(here, key=lambda c: c.connected_at)) if here else None
            if await self.shared.release(row.mesh_id, row.pubkey, row.session_id, successor):
                log.info("broker_session_released_after_heartbeat", mesh_id=row.mesh_id,
                         pubkey=row.pubkey, session_id=row.session_id)

    async def poll(self) -> int:
        """The safety net under NOTIFY: wake the local pumps whose recipients have committed
        deliveries past what was sent. Returns how many were woken."""
        if self.single:
            return 0
        conns = self.connections.conns
        behind: list[Key] = []
        for mesh_id, pubkey, epoch, last_seq in await self.shared.unacked(list(conns)):
            if any(c.pumping and not c.muted and c.epoch == epoch and c.sent_seq < last_seq
                   for c in conns.get((mesh_id, pubkey), ())):
                behind.append((mesh_id, pubkey))
        if behind:
            log.info("broker_pumps_polled_awake", recipients=len(behind))
            self.connections.wake_local(behind)
        return len(behind)
