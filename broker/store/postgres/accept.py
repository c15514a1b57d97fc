"""The accept (PostgreSQL): the shared sequence (``broker/store/accept.py``) over this port,
run by the engine's writers for every frame they drained at once.

A frame's sends are one item of a writer's queue. Each port method is one statement for the
whole batch (arrays and ``unnest()``), so a batch takes a bounded number of round trips
whatever its size and however many frames it holds: BEGIN; claim; read back ``FOR SHARE``
(only when the claim did not insert every key); B2 in one query; (unclaim the refused);
the DM and queue recipients' cursor locks; topic positions; orders; messages with their
history rows; the DM and queue recipients' hand-out (``topiclog.py``) and delivery rows;
COMMIT. A topic message writes no row per subscriber. Claims are made in key order, cursor
rows locked in (mesh, recipient) order and then topic rows in (mesh, name) order, so
several brokers on one database cannot deadlock; a key sent twice in a batch is decided
against its earlier send by the sequence itself. If a statement fails, the engine redoes the
batch with a savepoint per frame; a frame that fails again is redone with a savepoint per
send, so only the send that fails on its own gets a 5xx.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
import structlog

from tidemesh.broker.accept import AcceptInput, AcceptResult, DedupeRow, Delivery, failed
from tidemesh.broker.store import accept
from tidemesh.broker.store.accept import Key
from tidemesh.broker.store.postgres.base import PostgresBase
from tidemesh.broker.store.postgres.topiclog import LOCK_CURSORS_SQL, hand_out_on
from tidemesh.broker.topiclog import Own
from tidemesh.core.errors import TidemeshError
from tidemesh.storage.engine import BatchOp
from tidemesh.storage.pgarray import int_array, text_array
from tidemesh.storage.postgres import storage_error

log = structlog.get_logger(__name__)
# The server or the connection failed, not a send: no savepoint can help; the engine answers.
CONNECTION_ERRORS = (asyncpg.exceptions.OperatorInterventionError,
                     asyncpg.exceptions.PostgresConnectionError)


@dataclass(slots=True, eq=False)
class Frame:
    """One caller's sends, one arg of the engine's accept op. ``tried``: they ran once in a
    batch, so a second run is the engine's redo after a failed statement."""

    items: Sequence[AcceptInput]
    tried: bool = False


def _sender(frame: Frame) -> tuple[str, str]:
    return frame.items[0].mesh_id, frame.items[0].sender_pubkey


class Accept(PostgresBase):
    accept_rows: accept.AcceptRows
    _accept_op: BatchOp[Frame, list[AcceptResult]]

    def _init_accept(self) -> None:
        # The op and the after-commit callback both run in the writer's task.
        self.accept_rows = accept.AcceptRows(asyncio.current_task)
        # Each sender belongs to one writer, which keeps its frames in arrival order: a
        # recipient's seq follows the order the broker received one sender's sends in.
        self._accept_op = BatchOp("accept", self._accept_frames, owner=_sender)

    async def accept(self, item: AcceptInput) -> AcceptResult:
        return (await self.accept_batch([item]))[0]

    async def known(self, keys: Sequence[Key]) -> dict[Key, DedupeRow]:
        if not keys:
            return {}
        rows = await self.pool.fetch(KNOWN_SQL, *(text_array([k[i] for k in keys])
                                                  for i in range(3)))
        return _dedupe_rows(rows)

    async def topic_subscribers(self, topics: Sequence[tuple[str, str]]
                                ) -> dict[tuple[str, str], list[str]]:
        keys = sorted(set(topics))
        out: dict[tuple[str, str], list[str]] = {k: [] for k in keys}
        if keys:
            for mesh_id, topic, pubkey in await self.pool.fetch(
                    SUBSCRIBERS_SQL, text_array([k[0] for k in keys]),
                    text_array([k[1] for k in keys])):
                out[(mesh_id, topic)].append(pubkey)
        return out

    async def accept_batch(self, items: Sequence[AcceptInput]) -> list[AcceptResult]:
        if not items:
            return []
        try:
            return await self.db.submit(self._accept_op, Frame(items))
        except TidemeshError as exc:
            return [failed(a, exc) for a in items]

    async def _accept_frames(self, conn: Any, frames: Sequence[Frame]
                             ) -> list[list[AcceptResult]]:
        if len(frames) == 1 and frames[0].tried:
            out = [await _accept_alone(conn, frames[0].items)]
        else:
            for f in frames:
                f.tried = True
            sends = [f.items for f in frames]
            out = accept.regroup(sends, await accept.run_async(PgAcceptPort(conn),
                                                               accept.flatten(sends)))
        self.accept_rows.ran(sum(len(f.items) for f in frames))
        return out


async def _accept_alone(conn: Any, items: Sequence[AcceptInput]) -> list[AcceptResult]:
    """Run ``items`` in a savepoint; if a statement fails, each send in its own, in order."""
    try:
        async with conn.transaction():
            return await accept.run_async(PgAcceptPort(conn), items)
    except asyncpg.PostgresError as exc:
        if isinstance(exc, CONNECTION_ERRORS):
            raise
        if len(items) == 1:
            log.error("broker_accept_failed", client_message_id=items[0].client_message_id,
                      error=str(exc))
            return [failed(items[0], storage_error(exc, "broker", "rejected this write"))]
        log.warning("broker_accept_frame_split", error=str(exc), sends=len(items))
    return [(await _accept_alone(conn, [a]))[0] for a in items]


class PgAcceptPort:
    """``accept.AcceptPort`` on one writer connection, inside its transaction."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def claim(self, items: Sequence[AcceptInput]) -> int:
        status = await self.conn.execute(
            CLAIM_SQL, *(_texts(items, attr) for attr in (
                "mesh_id", "sender_pubkey", "client_message_id", "broker_message_id",
                "history_id")),
            _col(items, "fingerprint"), _texts(items, "kind"), _texts(items, "ref"),
            _ints(items, "now_ms"), _ints(items, "expires_at"))
        return int(status.rsplit(" ", 1)[1])   # "INSERT 0 <rows>"

    async def read_back(self, items: Sequence[AcceptInput]) -> dict[accept.Key, DedupeRow]:
        return _dedupe_rows(await self.conn.fetch(READBACK_SQL, _texts(items, "mesh_id"),
                                                  _texts(items, "sender_pubkey"),
                                                  _texts(items, "client_message_id")))

    async def destinations(self, items: Sequence[AcceptInput]
                           ) -> dict[accept.Destination, list[str]]:
        args: list[str] = []
        for kind in ("topic", "dm", "queue"):
            keys = sorted({(a.mesh_id, a.ref) for a in items if a.kind == kind})
            args += [text_array([k[0] for k in keys]), text_array([k[1] for k in keys])]
        out: dict[accept.Destination, list[str]] = {}
        for kind, mesh_id, ref, pubkey in await self.conn.fetch(B2_SQL, *args):
            members = out.setdefault((kind, mesh_id, ref), [])
            if pubkey is not None:  # a topic is only said to exist
                members.append(pubkey)
        return out

    async def unclaim(self, broker_message_ids: Sequence[str]) -> None:
        await self.conn.execute(UNCLAIM_SQL, text_array(broker_message_ids))

    async def insert(self, accepted: Sequence[tuple[AcceptInput, list[str]]]
                     ) -> dict[str, list[Delivery]]:
        """Locks in one order for every writer (cursors, then topics): the DM and queue
        recipients' cursors; each topic's next log positions; an order for every message
        of the batch (after the topics' locks: it grows with each topic's positions); the
        messages; then each DM and queue recipient is handed its topics' entries with its
        new deliveries among them in order (``topiclog.py``), and their rows are written
        with the seqs that gave. A topic message's subscribers get no row here."""
        items = [a for a, _ in accepted]
        now = max(a.now_ms for a in items)
        rows = [(a, p) for a, recipients in accepted if a.kind != "topic" for p in recipients]
        keys = sorted({(a.mesh_id, p) for a, p in rows})
        if keys:
            await self.conn.execute(LOCK_CURSORS_SQL, text_array([k[0] for k in keys]),
                                    text_array([k[1] for k in keys]), now)
        topic = [a for a in items if a.kind == "topic"]
        positions = await self._positions(topic)
        # Without a DM or queue delivery to order among them, the topic messages draw their
        # orders in the insert itself (in batch order): one round trip fewer.
        order_of: dict[str, int] = {}
        if rows:
            orders = sorted(int(r[0]) for r in await self.conn.fetch(ORDERS_SQL, len(items)))
            order_of = {a.broker_message_id: o for a, o in zip(items, orders, strict=True)}
        await self.conn.execute(MESSAGES_SQL, *_message_args(
            items, positions, [order_of[a.broker_message_id] for a in topic] if rows else []))
        by_message: dict[str, list[Delivery]] = {}
        if rows:
            own: dict[tuple[str, str], list[Own]] = {}
            for a, p in rows:
                own.setdefault((a.mesh_id, p), []).append(
                    Own(order_of[a.broker_message_id], a.broker_message_id))
            seqs = (await hand_out_on(self.conn, keys, now, lock_all=True, own=own,
                                      cursors="held")).seqs
            given = [(a, Delivery(p, *seqs[((a.mesh_id, p), a.broker_message_id)]))
                     for a, p in rows]
            for a, d in given:
                by_message.setdefault(a.broker_message_id, []).append(d)
            await self.conn.execute(
                DELIVERIES_INSERT_SQL, text_array([a.mesh_id for a, _ in given]),
                text_array([d.recipient_pubkey for _, d in given]),
                int_array([d.epoch for _, d in given]), int_array([d.seq for _, d in given]),
                text_array([a.broker_message_id for a, _ in given]),
                int_array([a.now_ms for a, _ in given]))
        for a, recipients in accepted:
            if a.kind == "topic":   # seqs are given when each recipient reads the log
                by_message[a.broker_message_id] = [Delivery(p, 0, 0) for p in recipients]
        for ds in by_message.values():
            if len(ds) > 1:
                ds.sort(key=lambda d: d.recipient_pubkey)
        return by_message

    async def _positions(self, topic: Sequence[AcceptInput]) -> list[int]:
        """The next log positions of each topic, in batch order (topic rows locked in
        (mesh, name) order until COMMIT: positions commit in order)."""
        if not topic:
            return []
        counts = collections.Counter((a.mesh_id, a.ref) for a in topic)
        keys = sorted(counts)
        last = {(r[0], r[1]): int(r[2]) for r in await self.conn.fetch(
            TOPIC_POS_SQL, text_array([k[0] for k in keys]), text_array([k[1] for k in keys]),
            int_array([counts[k] for k in keys]))}
        nxt = {k: last[k] - counts[k] for k in keys}
        out = []
        for a in topic:
            nxt[(a.mesh_id, a.ref)] += 1
            out.append(nxt[(a.mesh_id, a.ref)])
        return out


CLAIM_SQL = """
INSERT INTO mesh.client_message_dedupe (mesh_id, sender_pubkey, client_message_id,
    broker_message_id, history_id, request_fingerprint, destination_kind, destination_ref,
    first_seen_at, expires_at)
SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::text[], $4::text::text[],
                     $5::text::text[], $6::bytea[], $7::text::text[], $8::text::text[],
                     $9::text::bigint[], $10::text::bigint[])
ON CONFLICT (mesh_id, sender_pubkey, client_message_id) DO NOTHING
"""

# B0 reads without a lock, outside the accept: a row it misses is found by the accept's own
# read-back, which takes the lock.
KNOWN_SQL = """
SELECT d.mesh_id, d.sender_pubkey, d.client_message_id, d.broker_message_id, d.history_id,
       d.request_fingerprint, d.history_available, d.first_seen_at
FROM mesh.client_message_dedupe d
JOIN unnest($1::text::text[], $2::text::text[], $3::text::text[]) AS k(m, s, c)
  ON d.mesh_id = k.m AND d.sender_pubkey = k.s AND d.client_message_id = k.c
"""

READBACK_SQL = KNOWN_SQL + "FOR SHARE OF d\n"

UNCLAIM_SQL = """
DELETE FROM mesh.client_message_dedupe WHERE broker_message_id = ANY($1::text::text[])
"""

# One round trip for every destination check of the batch, tagged by kind.
# A topic's subscribers are not listed here: at 1,000 of them that read was 9-11 ms of the
# accept's 17-21 (docs/broker.md, Many members); they are read after the commit.
B2_SQL = """
SELECT 'topic', k.m, k.n, NULL::text
FROM unnest($1::text::text[], $2::text::text[]) AS k(m, n)
JOIN mesh.topic t ON t.mesh_id = k.m AND t.name = k.n
UNION ALL
SELECT 'dm', k.m, k.p, CASE WHEN mb.revoked_at IS NULL THEN k.p ELSE n.pubkey END
FROM unnest($3::text::text[], $4::text::text[]) AS k(m, p)
JOIN mesh.member mb ON mb.mesh_id = k.m AND mb.pubkey = k.p
LEFT JOIN mesh.member n ON n.mesh_id = mb.mesh_id AND n.pubkey = mb.rotated_to
  AND n.revoked_at IS NULL
UNION ALL
SELECT 'queue', c.mesh_id, c.queue, c.member_pubkey
FROM unnest($5::text::text[], $6::text::text[]) AS k(m, q)
JOIN mesh.queue_consumer c ON c.mesh_id = k.m AND c.queue = k.q
JOIN mesh.member mb ON mb.mesh_id = c.mesh_id AND mb.pubkey = c.member_pubkey
  AND mb.revoked_at IS NULL
"""

SUBSCRIBERS_SQL = """
SELECT s.mesh_id, s.topic, s.member_pubkey
FROM unnest($1::text::text[], $2::text::text[]) AS k(m, n)
JOIN mesh.topic_subscription s ON s.mesh_id = k.m AND s.topic = k.n
JOIN mesh.member mb ON mb.mesh_id = s.mesh_id AND mb.pubkey = s.member_pubkey
  AND mb.revoked_at IS NULL
"""

TOPIC_POS_SQL = """
WITH l AS (
  SELECT t.mesh_id, t.name, u.n FROM unnest($1::text::text[], $2::text::text[],
                                             $3::text::bigint[]) AS u(m, t, n)
  JOIN mesh.topic t ON t.mesh_id = u.m AND t.name = u.t
  ORDER BY t.mesh_id, t.name FOR NO KEY UPDATE OF t
)
UPDATE mesh.topic t SET last_pos = t.last_pos + l.n FROM l
WHERE t.mesh_id = l.mesh_id AND t.name = l.name
RETURNING t.mesh_id, t.name, t.last_pos
"""

# Messages and their history rows in one statement. A topic message without an order in
# $34 (empty: the batch has no DM or queue delivery) draws one here, row by row in batch
# order, after the topics' locks as ORDERS_SQL would (COALESCE draws none when it has one).
MESSAGES_SQL = """
WITH tm AS (
  INSERT INTO mesh.topic_message (id, mesh_id, sender_pubkey, client_message_id, topic, body,
      body_encoding, priority, meta, reply_to, created_at, traceparent, log_pos, log_order)
  SELECT u.id, u.m, u.s, u.c, u.n, u.b, u.be, u.pr, u.me, u.r, u.at, u.tp, u.pos,
         COALESCE(u.ord, nextval('mesh.topic_log_order'))
  FROM unnest($1::text::text[], $2::text::text[], $3::text::text[], $4::text::text[],
              $5::text::text[], $6::bytea[], $7::text::text[], $8::text::text[],
              $9::text::text[], $10::text::text[], $11::text::bigint[],
              $31::text::text[], $33::text::bigint[], $34::text::bigint[])
       AS u(id, m, s, c, n, b, be, pr, me, r, at, tp, pos, ord)
), mq AS (
  INSERT INTO mesh.message_queue (id, mesh_id, sender_pubkey, client_message_id,
      destination_kind, destination_ref, body, body_encoding, priority, meta, reply_to,
      created_at, traceparent)
  SELECT * FROM unnest($12::text::text[], $13::text::text[], $14::text::text[],
                       $15::text::text[], $16::text::text[], $17::text::text[], $18::bytea[],
                       $19::text::text[], $20::text::text[], $21::text::text[],
                       $22::text::text[], $23::text::bigint[], $32::text::text[])
)
INSERT INTO mesh.message_history (history_id, broker_message_id, mesh_id, sender_pubkey,
    destination_kind, destination_ref, created_at)
SELECT * FROM unnest($24::text::text[], $25::text::text[], $26::text::text[],
                     $27::text::text[], $28::text::text[], $29::text::text[],
                     $30::text::bigint[])
"""

ORDERS_SQL = "SELECT nextval('mesh.topic_log_order') FROM generate_series(1, $1::int)"

# DM and queue deliveries with the seqs the hand-out gave them.
DELIVERIES_INSERT_SQL = """
INSERT INTO mesh.delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,
    created_at)
SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::bigint[],
                     $4::text::bigint[], $5::text::text[], $6::text::bigint[])
"""


def _dedupe_rows(rows: Sequence[Any]) -> dict[accept.Key, DedupeRow]:
    return {(r[0], r[1], r[2]): DedupeRow(r[3], r[4], bytes(r[5]), r[6], r[7]) for r in rows}


def _col(items: Sequence[AcceptInput], attr: str) -> list[Any]:
    return [getattr(a, attr) for a in items]


def _texts(items: Sequence[AcceptInput], attr: str) -> str:
    return text_array([getattr(a, attr) for a in items])


def _ints(items: Sequence[AcceptInput], attr: str) -> str:
    return int_array([getattr(a, attr) for a in items])


def _message_args(items: Sequence[AcceptInput], positions: Sequence[int],
                  orders: Sequence[int]) -> list[Any]:
    metas = {a.broker_message_id: orjson.dumps(a.meta).decode() if a.meta else None
             for a in items}
    t = [a for a in items if a.kind == "topic"]
    q = [a for a in items if a.kind != "topic"]
    return [
        _texts(t, "broker_message_id"), _texts(t, "mesh_id"), _texts(t, "sender_pubkey"),
        _texts(t, "client_message_id"), _texts(t, "ref"), _col(t, "body"),
        _texts(t, "body_encoding"), _texts(t, "priority"),
        text_array([metas[a.broker_message_id] for a in t]), _texts(t, "reply_to"),
        _ints(t, "now_ms"),
        _texts(q, "broker_message_id"), _texts(q, "mesh_id"), _texts(q, "sender_pubkey"),
        _texts(q, "client_message_id"), _texts(q, "kind"), _texts(q, "ref"), _col(q, "body"),
        _texts(q, "body_encoding"), _texts(q, "priority"),
        text_array([metas[a.broker_message_id] for a in q]), _texts(q, "reply_to"),
        _ints(q, "now_ms"),
        _texts(items, "history_id"), _texts(items, "broker_message_id"),
        _texts(items, "mesh_id"), _texts(items, "sender_pubkey"), _texts(items, "kind"),
        _texts(items, "ref"), _ints(items, "now_ms"),
        _texts(t, "traceparent"), _texts(q, "traceparent"), int_array(positions),
        int_array(orders),
    ]
