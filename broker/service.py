"""Broker use cases: authenticate, accept (route), membership requests, ack, resume, deliver.

Independent of websockets: a connection is reached through the ``Peer`` protocol (send a
frame, close). Accepted sends wake the delivery pump of each connected recipient; the pump
reads committed delivery rows in seq order, so deliveries are gapless and in order no matter
which connection accepted the message. Never awaits the network inside a transaction: the
store commits first, then frames go out.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Histogram

from tidemesh.broker.accept import AcceptResult, Limits, prepare
from tidemesh.broker.session import ResumeResult, decide_resume
from tidemesh.broker.store.base import DeliveryRow, Store
from tidemesh.core import features
from tidemesh.core.errors import InvalidRequest, NotFound, TidemeshError
from tidemesh.core.ids import new_ulid
from tidemesh.core.invite import token_hash
from tidemesh.core.metrics import BATCH_BUCKETS, CallbackGauge, CollectorRegistry, Samples
from tidemesh.core.wire import CloseCode, error_frame

log = structlog.get_logger(__name__)
PUMP_PAGE = 256
PRESENCE_SEND_TIMEOUT_S = 1.0


class Peer(Protocol):
    async def send_frame(self, frame: dict[str, Any]) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...


def _now_ms() -> int:
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
    connected_at: int = field(default_factory=_now_ms)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class AuthOutcome:
    mesh_id: str
    mesh_name: str
    pubkey: str
    problem: str | None
    joined: bool = False
    display_name: str | None = None


class Metrics:
    """The broker's Prometheus series (spec names where the spec gives them)."""

    def __init__(self, active: Samples, store: Store) -> None:
        r = self.registry = CollectorRegistry()
        self.accepts = Counter("cm_broker_accept_total", "Sends answered, by status.",
                               ["status"], registry=r)
        self.duplicates = Counter("cm_broker_dedupe_duplicate_total",
                                  "Sends answered 200 duplicate (fingerprint matched).",
                                  ["mesh_id"], registry=r)
        self.mismatch = Counter("cm_broker_dedupe_fingerprint_mismatch_total",
                                "Sends answered 409 idempotency_key_reused (spec §4.4).",
                                ["client_id", "mesh_id"], registry=r)
        self.expired = Counter("cm_broker_dedupe_expired_deleted_total",
                               "Dedupe rows deleted after expires_at (spec §17.5).", registry=r)
        self.pruned = Counter("cm_broker_history_pruned_total",
                              "Messages pruned by retention; their dedupe rows flip "
                              "history_available to false (spec §17.6).", registry=r)
        self.rejected = Counter("cm_broker_handshake_rejected_total",
                                "Connections closed during the handshake, by reason.",
                                ["reason"], registry=r)
        self.bad_frames = Counter("cm_broker_bad_frames_total", "Frames that failed a schema.",
                                  registry=r)
        self.delivered = Counter("cm_broker_deliveries_sent_total", "deliver frames sent.",
                                 registry=r)
        self.accept_duration = Histogram("cm_broker_accept_duration_seconds",
                                         "Duration of each group-commit accept transaction.",
                                         registry=r)
        self.accept_batch = Histogram("cm_broker_accept_batch_size",
                                      "Sends in each group-commit accept transaction.",
                                      registry=r, buckets=BATCH_BUCKETS)
        CallbackGauge("cm_broker_connections_active", "Authenticated connections.", [], active, r)
        CallbackGauge("cm_broker_group_commit_batches", "Accept transactions since start.", [],
                      lambda: [({}, float(store.batches))], r)
        CallbackGauge("cm_broker_group_commit_sends", "Sends in those transactions since start.",
                      [], lambda: [({}, float(store.items))], r)
        store.on_batch = self.observe_accept

    def observe_accept(self, sends: int, seconds: float) -> None:
        self.accept_batch.observe(sends)
        self.accept_duration.observe(seconds)


class BrokerService:
    def __init__(self, store: Store, limits: Limits, *, retention_days: int = 30,
                 stall_window_hours: int = 24) -> None:
        self.store = store
        self.limits = limits
        self.retention_days = retention_days
        self.stall_window_hours = stall_window_hours
        self.conns: dict[tuple[str, str], set[Conn]] = {}
        # Presence metadata per member, in memory like presence itself; each daemon holds
        # the authoritative copy and sends it again after every connect.
        self.profiles: dict[tuple[str, str], dict[str, Any]] = {}
        self.metrics = Metrics(lambda: [({}, float(sum(len(c) for c in self.conns.values())))],
                               store)
        self.supported = features.advertise(limits.dedupe_mode, limits.dedupe_retention_days,
                                            limits.inline_bytes)

    # -- handshake -----------------------------------------------------------------------

    async def authenticate(self, frame: dict[str, Any]) -> AuthOutcome:
        mesh_id, pubkey = frame["mesh_id"], frame["pubkey"]
        mesh = await self.store.find_mesh(mesh_id)
        if mesh is None or mesh.id != mesh_id:
            return self._rejected(mesh_id, pubkey, "unknown_mesh")
        if frame["type"] == "join":
            try:
                await self.store.redeem_invite(mesh_id, token_hash(frame["invite_token"]), pubkey,
                                               frame.get("display_name"), _now_ms())
            except NotFound as exc:
                return self._rejected(mesh_id, pubkey, str(exc.details.get("reason", "invite")))
            log.info("broker_member_joined", mesh_id=mesh_id, pubkey=pubkey)
            return AuthOutcome(mesh_id, mesh.name, pubkey, None, joined=True,
                               display_name=frame.get("display_name"))
        member = await self.store.get_member(mesh_id, pubkey)
        if member is None:
            return self._rejected(mesh_id, pubkey, "unknown_member")
        if member.revoked_at is not None:
            return self._rejected(mesh_id, pubkey, "member_revoked")
        return AuthOutcome(mesh_id, mesh.name, pubkey, None, display_name=member.display_name)

    def _rejected(self, mesh_id: str, pubkey: str, reason: str) -> AuthOutcome:
        self.metrics.rejected.labels(reason=reason).inc()
        log.warning("broker_handshake_rejected", mesh_id=mesh_id, pubkey=pubkey, reason=reason)
        return AuthOutcome(mesh_id, "", pubkey, reason)

    def handshake_closed(self, reason: str) -> None:
        self.metrics.rejected.labels(reason=reason).inc()
        log.warning("broker_handshake_rejected", reason=reason)

    def register(self, peer: Peer, mesh_id: str, pubkey: str,
                 display_name: str | None = None) -> tuple[Conn, bool]:
        """Track a new connection; the bool says it is the member's first (a peer_join)."""
        conn = Conn(peer, mesh_id, pubkey, new_ulid(), display_name=display_name)
        conns = self.conns.setdefault((mesh_id, pubkey), set())
        conns.add(conn)
        log.info("broker_member_connected", mesh_id=mesh_id, pubkey=pubkey,
                 session_id=conn.session_id)
        return conn, len(conns) == 1

    def unregister(self, conn: Conn) -> bool:
        """Forget a connection; the bool says it was the member's last (a peer_leave)."""
        peers = self.conns.get((conn.mesh_id, conn.pubkey), set())
        peers.discard(conn)
        if not peers:
            self.conns.pop((conn.mesh_id, conn.pubkey), None)
        log.info("broker_member_disconnected", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                 session_id=conn.session_id)
        return not peers

    async def announce(self, conn: Conn, kind: str) -> None:
        """peer_join / peer_leave to the mesh's other members; presence is best effort.
        A member whose profile says ``visible: false`` is not announced."""
        profile = self.profiles.get((conn.mesh_id, conn.pubkey), {})
        if profile.get("visible") is False:
            return
        frame: dict[str, Any] = {"type": kind, "mesh_id": conn.mesh_id, "pubkey": conn.pubkey,
                                 "at": _now_ms()}
        if kind == "peer_join":
            frame["display_name"] = conn.display_name
            if profile:
                frame["profile"] = profile
        for (mesh_id, pubkey), conns in list(self.conns.items()):
            if mesh_id != conn.mesh_id or pubkey == conn.pubkey:
                continue
            for other in list(conns):
                try:
                    async with asyncio.timeout(PRESENCE_SEND_TIMEOUT_S):
                        await other.peer.send_frame(frame)
                except Exception as exc:  # a slow or closing peer misses one presence event
                    log.info("broker_presence_undelivered", pubkey=pubkey, error=repr(exc))

    def peers(self, conn: Conn, request_id: str) -> dict[str, Any]:
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
        return {"type": "peers", "id": request_id, "peers": peers}

    async def set_profile(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """Replace the member's profile; becoming hidden or visible is announced as a
        peer_leave or peer_join to the others."""
        key = (conn.mesh_id, conn.pubkey)
        was_hidden = self.profiles.get(key, {}).get("visible") is False
        self.profiles[key] = dict(frame["profile"])
        hidden = self.profiles[key].get("visible") is False
        if was_hidden and not hidden:
            await self.announce(conn, "peer_join")
        elif hidden and not was_hidden:
            self.profiles[key]["visible"] = True
            await self.announce(conn, "peer_leave")
            self.profiles[key]["visible"] = False
        return {"type": "result", "id": frame["id"], "ok": True}

    # -- ready-phase frames --------------------------------------------------------------

    async def send(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        """One ``send`` frame → its ``send_result`` frame (B1 here, the rest in the store)."""
        try:
            item = prepare(frame, conn.mesh_id, conn.pubkey, self.limits, _now_ms())
        except TidemeshError as exc:
            result = AcceptResult(exc.http_status, frame["client_message_id"], error=exc)
        else:
            result = await self.store.accept(item)
            if result.status == 201:
                self._wake({(conn.mesh_id, d.recipient_pubkey) for d in result.deliveries})
        self._count(conn, result)
        return result.to_frame(frame["id"])

    def _count(self, conn: Conn, result: AcceptResult) -> None:
        self.metrics.accepts.labels(status=str(result.status)).inc()
        if result.status == 200:
            self.metrics.duplicates.labels(mesh_id=conn.mesh_id).inc()
        elif result.status == 409:
            self.metrics.mismatch.labels(client_id=conn.pubkey, mesh_id=conn.mesh_id).inc()
            log.warning("broker_fingerprint_mismatched", mesh_id=conn.mesh_id,
                        sender=conn.pubkey, client_message_id=result.client_message_id)

    def _wake(self, keys: Iterable[tuple[str, str]]) -> None:
        for key in keys:
            for c in self.conns.get(key, ()):
                c.wake.set()

    async def dispatch(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any] | None:
        """Every READY frame but ``send``; returns the answer frame, if any."""
        kind = frame["type"]
        try:
            if kind == "feature_negotiation_request":
                return self.negotiate(frame)
            if kind == "request":
                await self._request(conn, frame)
                return {"type": "result", "id": frame["id"], "ok": True}
            if kind == "ack":
                await self.store.ack(conn.mesh_id, conn.pubkey, frame["epoch"], frame["seq"],
                                     _now_ms())
                return None
            if kind == "resume":
                return await self.resume(conn, frame)
            if kind == "peers":
                return self.peers(conn, frame["id"])
            if kind == "profile":
                return await self.set_profile(conn, frame)
        except TidemeshError as exc:
            return error_frame(exc.code, exc.message, frame.get("id"),
                               **{k: v for k, v in exc.details.items() if k != "id"})
        raise InvalidRequest(f"no handler for {kind}")

    def negotiate(self, frame: dict[str, Any]) -> dict[str, Any]:
        missing = [f for f in frame["require"] if f not in self.supported]
        return {"type": "feature_negotiation_response", "id": frame["id"],
                "supported": self.supported, "missing_required": missing}

    async def _request(self, conn: Conn, frame: dict[str, Any]) -> None:
        op, name, now = frame["op"], frame["name"], _now_ms()
        if op == "topic_create":
            await self.store.create_topic(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_subscribe":
            await self.store.subscribe(conn.mesh_id, name, conn.pubkey, now)
        elif op == "topic_unsubscribe":
            await self.store.unsubscribe(conn.mesh_id, name, conn.pubkey)
        elif op == "queue_consume":
            await self.store.add_queue_consumer(conn.mesh_id, name, conn.pubkey, now)
        else:
            await self.store.remove_queue_consumer(conn.mesh_id, name, conn.pubkey)

    async def resume(self, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
        cur = await self.store.cursor(conn.mesh_id, conn.pubkey)
        result = decide_resume(frame["epoch"], frame["last_seq"], cur.epoch, cur.last_seq,
                               cur.compacted_seq)
        answer = {"type": "resume_ack", "id": frame["id"], "result": result.value,
                  "epoch": cur.epoch, "broker_last_seq": cur.last_seq,
                  "compacted_seq": cur.compacted_seq}
        if result is ResumeResult.OK:
            last = frame["last_seq"] if frame["epoch"] else 0
            answer["last_seq"] = last
            if last:  # what the daemon stored is acked by the resume itself
                await self.store.ack(conn.mesh_id, conn.pubkey, cur.epoch, last, _now_ms())
            conn.epoch, conn.sent_seq, conn.pumping = cur.epoch, last, True
            conn.wake.set()
        else:
            log.warning("broker_resume_refused", mesh_id=conn.mesh_id, pubkey=conn.pubkey,
                        result=result.value, epoch=frame["epoch"], last_seq=frame["last_seq"])
        return answer

    async def pump(self, conn: Conn) -> None:
        """Send committed deliveries after ``conn.sent_seq``, in order, whenever woken."""
        while True:
            await conn.wake.wait()
            conn.wake.clear()
            if not conn.pumping:
                continue
            while True:
                rows = await self.store.deliveries_after(conn.mesh_id, conn.pubkey, conn.epoch,
                                                         conn.sent_seq, PUMP_PAGE)
                for row in rows:
                    await conn.peer.send_frame(deliver_frame(row))
                    conn.sent_seq = row.seq
                    self.metrics.delivered.inc()
                if len(rows) < PUMP_PAGE:
                    break

    # -- background ----------------------------------------------------------------------

    async def recheck_members(self) -> None:
        """Close the connections of members revoked since they connected."""
        for (mesh_id, pubkey), conns in list(self.conns.items()):
            member = await self.store.get_member(mesh_id, pubkey)
            if member is None or member.revoked_at is not None:
                for c in list(conns):
                    log.warning("broker_revoked_member_closed", mesh_id=mesh_id, pubkey=pubkey)
                    await c.peer.close(CloseCode.AUTH, "member_revoked")

    async def reassign_lapsed(self, lease_s: float) -> int:
        """Queue leases (DESIGN §5.4): deliveries not acked within the lease go to another
        consumer; both recipients' pumps are woken (the old one gets a void delivery)."""
        now = _now_ms()
        moved = await self.store.reassign_lapsed(now - int(lease_s * 1000), now)
        for m in moved:
            log.info("broker_queue_lease_lapsed", mesh_id=m.mesh_id,
                     broker_message_id=m.broker_message_id, from_pubkey=m.from_pubkey,
                     to_pubkey=m.to_pubkey)
        self._wake({(m.mesh_id, m.to_pubkey) for m in moved})
        return len(moved)

    async def sweep(self) -> tuple[int, int]:
        """Retention (spec §17.5-6): expired dedupe rows, then old messages."""
        now = _now_ms()
        expired = await self.store.delete_expired_dedupe(now)
        pruned = await self.store.prune_messages(now - self.retention_days * 86_400_000,
                                                 now - self.stall_window_hours * 3_600_000)
        self.metrics.expired.inc(expired)
        self.metrics.pruned.inc(pruned)
        log.info("broker_retention_swept", dedupe_deleted=expired, messages_pruned=pruned)
        return expired, pruned


def deliver_frame(row: DeliveryRow) -> dict[str, Any]:
    body = (row.body.decode("utf-8") if row.body_encoding == "utf8"
            else base64.b64encode(row.body).decode("ascii"))
    frame: dict[str, Any] = {
        "type": "deliver", "epoch": row.epoch, "seq": row.seq,
        "broker_message_id": row.broker_message_id, "sender_pubkey": row.sender_pubkey,
        "client_message_id": row.client_message_id, "to": {"kind": row.kind, "ref": row.ref},
        "body": body, "body_encoding": row.body_encoding, "priority": row.priority,
        "meta": row.meta, "reply_to": row.reply_to, "created_at": row.created_at,
    }
    if row.history_id is not None:
        frame["history_id"] = row.history_id
    if row.reassigned:
        frame["reassigned"] = True
    return frame

