"""The accept (SQLite): the shared sequence (``broker/store/accept.py``) over this port.

A frame's sends are one item of the writer's queue (a frame of more than the engine's
``HEAVY_CHUNK`` sends, parts of that size queued together); the writer runs every frame it
drained as one batch of the sequence, in one savepoint of its group commit. Frames of a few
sends go before a big frame of another sender, and one that arrives while a big one runs
waits for its current part only (the engine's ``Plan``), so a lone send does not wait for a
flood's rows. Should a statement fail, the savepoint is rolled back and each send is redone
in its own savepoint, in order, so one bad send fails alone and later sends of a key are
still decided against earlier ones."""

from __future__ import annotations

import collections
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson
import structlog

from tidemesh.broker.accept import AcceptInput, AcceptResult, DedupeRow, Delivery, failed
from tidemesh.broker.store import accept
from tidemesh.broker.store.accept import Key
from tidemesh.broker.store.sqlite.base import SqliteBase, write_error
from tidemesh.broker.store.sqlite.topiclog import hand_out_on
from tidemesh.broker.topiclog import Own
from tidemesh.core.errors import InsufficientStorage, TidemeshError, Unavailable
from tidemesh.storage.engine import BatchOp
from tidemesh.storage.multirow import insert_rows
from tidemesh.storage.sqlite import HEAVY_CHUNK, storage_error

log = structlog.get_logger(__name__)
Frames = Sequence[Sequence[AcceptInput]]


class Accept(SqliteBase):
    accept_rows: accept.AcceptRows
    _accept_op: BatchOp[Sequence[AcceptInput], list[AcceptResult]]

    def _init_accept(self) -> None:
        self.accept_rows = accept.AcceptRows(lambda: None)  # one writer
        # Weighed: a lone send commits before a flood's frame drained with it (light_first).
        self._accept_op = BatchOp("accept", self._accept_frames, weight=len,
                                  owner=lambda f: (f[0].mesh_id, f[0].sender_pubkey))

    async def accept(self, item: AcceptInput) -> AcceptResult:
        return (await self.accept_batch([item]))[0]

    async def known(self, keys: Sequence[Key]) -> dict[Key, DedupeRow]:
        def fn(conn: sqlite3.Connection) -> dict[Key, DedupeRow]:
            rows = {}
            for key in dict.fromkeys(keys):   # one reader call; SQLite has no round trips
                r = conn.execute(READBACK_SQL, key).fetchone()
                if r is not None:
                    rows[key] = DedupeRow(r[0], r[1], bytes(r[2]), bool(r[3]), r[4])
            return rows

        return await self._read(fn) if keys else {}

    async def topic_subscribers(self, topics: Sequence[tuple[str, str]]
                                ) -> dict[tuple[str, str], list[str]]:
        def fn(conn: sqlite3.Connection) -> dict[tuple[str, str], list[str]]:
            return {k: [r[0] for r in conn.execute(SUBSCRIBERS_SQL, k)]
                    for k in sorted(set(topics))}

        return await self._read(fn) if topics else {}

    async def accept_batch(self, items: Sequence[AcceptInput]) -> list[AcceptResult]:
        """A frame bigger than the engine's ``HEAVY_CHUNK`` goes in as parts of that size,
        queued together: one transaction unless a lone send of another member arrives
        meanwhile, which then waits for one part, not the whole frame."""
        if len(items) <= HEAVY_CHUNK:
            try:
                return await self._submit(self._accept_op, items) if items else []
            except TidemeshError as exc:
                return [failed(a, exc) for a in items]
        parts = [items[i:i + HEAVY_CHUNK] for i in range(0, len(items), HEAVY_CHUNK)]
        try:
            answers = await self.db.submit_all(self._accept_op, parts)
        except TidemeshError as exc:
            return [failed(a, exc) for a in items]
        results: list[AcceptResult] = []
        for part, got in zip(parts, answers, strict=True):
            results += ([failed(a, write_error(got)) for a in part]
                        if isinstance(got, BaseException) else got)
        return results

    def _accept_frames(self, conn: sqlite3.Connection, frames: Frames
                       ) -> list[list[AcceptResult]]:
        items = accept.flatten(frames)
        conn.execute("SAVEPOINT accept")
        try:
            results = accept.run(SqliteAcceptPort(conn), items)
        except Exception as exc:
            conn.execute("ROLLBACK TO accept")
            conn.execute("RELEASE accept")
            _raise_if_disk_full(exc)
            log.warning("broker_accept_batch_split", error=str(exc), sends=len(items))
            results = [_accept_alone(conn, a) for a in items]
        else:
            conn.execute("RELEASE accept")
        self.accept_rows.ran(len(items))
        return accept.regroup(frames, results)


def _accept_alone(conn: sqlite3.Connection, a: AcceptInput) -> AcceptResult:
    conn.execute("SAVEPOINT send")
    try:
        result = accept.run(SqliteAcceptPort(conn), [a])[0]
    except Exception as exc:
        conn.execute("ROLLBACK TO send")
        conn.execute("RELEASE send")
        _raise_if_disk_full(exc)
        log.error("broker_accept_failed", client_message_id=a.client_message_id,
                  error=str(exc))
        err = (storage_error(exc, "broker") if isinstance(exc, sqlite3.Error)
               else Unavailable(f"the broker could not accept this send: {exc}"))
        return failed(a, err)
    conn.execute("RELEASE send")
    return result


def _raise_if_disk_full(exc: Exception) -> None:
    """A full disk fails the whole group commit (the engine answers every caller 507)."""
    if isinstance(exc, sqlite3.Error) and isinstance(storage_error(exc, "broker"),
                                                     InsufficientStorage):
        raise exc


class SqliteAcceptPort:
    """``accept.AcceptPort`` on the writer's connection. SQLite runs in this process, so a
    statement per row costs no round trip."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def claim(self, items: Sequence[AcceptInput]) -> int:
        return insert_rows(self.conn, CLAIM_HEAD, [
            (*a.key, a.broker_message_id, a.history_id, a.fingerprint, a.kind, a.ref, a.now_ms,
             a.expires_at) for a in items], CLAIM_TAIL)

    def read_back(self, items: Sequence[AcceptInput]) -> dict[accept.Key, DedupeRow]:
        rows = {}
        for a in items:
            r = self.conn.execute(READBACK_SQL, a.key).fetchone()
            rows[a.key] = DedupeRow(r[0], r[1], bytes(r[2]), bool(r[3]), r[4])
        return rows

    def destinations(self, items: Sequence[AcceptInput]
                     ) -> dict[accept.Destination, list[str]]:
        found: dict[accept.Destination, list[str]] = {}
        for kind, mesh_id, ref in {(a.kind, a.mesh_id, a.ref) for a in items}:
            members = self._members(kind, mesh_id, ref)
            if members is not None:
                found[(kind, mesh_id, ref)] = members
        return found

    def _members(self, kind: str, mesh_id: str, ref: str) -> list[str] | None:
        if kind == "topic":
            # It exists; its subscribers are read after the commit (``topic_subscribers``).
            return [] if self.conn.execute(TOPIC_SQL, (mesh_id, ref)).fetchone() else None
        if kind == "dm":
            known = self.conn.execute(MEMBER_SQL, (mesh_id, ref)).fetchone()
            return None if known is None else [ref] if known[0] else [known[1]] if known[1] else []
        return [r[0] for r in self.conn.execute(CONSUMERS_SQL, (mesh_id, ref))]

    def unclaim(self, broker_message_ids: Sequence[str]) -> None:
        self.conn.executemany("DELETE FROM client_message_dedupe WHERE broker_message_id = ?",
                              [(i,) for i in broker_message_ids])

    def insert(self, accepted: Sequence[tuple[AcceptInput, list[str]]]
               ) -> dict[str, list[Delivery]]:
        """The batch's messages, history and DM/queue deliveries, a statement per table (and
        one cursor bump per recipient, by its number of new deliveries): seqs are handed out
        in batch order, gapless, from what the bump returned. A topic message takes its
        topic's next log position; its subscribers get no row here (``topiclog.py``)."""
        if not accepted:
            return {}
        topic, queue, history = [], [], []
        for a, _ in accepted:
            meta = orjson.dumps(a.meta).decode() if a.meta else None
            if a.kind == "topic":
                topic.append((a.broker_message_id, a.mesh_id, a.sender_pubkey,
                              a.client_message_id, a.ref, a.body, a.body_encoding, a.priority,
                              meta, a.reply_to, a.now_ms, a.traceparent))
            else:
                queue.append((a.broker_message_id, a.mesh_id, a.sender_pubkey,
                              a.client_message_id, a.kind, a.ref, a.body, a.body_encoding,
                              a.priority, meta, a.reply_to, a.now_ms, a.traceparent))
            history.append((a.history_id, a.broker_message_id, a.mesh_id, a.sender_pubkey,
                            a.kind, a.ref, a.now_ms))
        now = max(a.now_ms for a, _ in accepted)
        (first,) = self.conn.execute(
            "SELECT COALESCE(MAX(log_order), 0) + 1 FROM topic_message").fetchone()
        order_of = {a.broker_message_id: first + i for i, (a, _) in enumerate(accepted)}
        insert_rows(self.conn, TOPIC_MESSAGE_HEAD, [
            (*r, order_of[str(r[0])]) for r in self._positioned(topic)])
        insert_rows(self.conn, QUEUE_MESSAGE_HEAD, queue)
        insert_rows(self.conn, HISTORY_HEAD, history)
        # Each DM and queue recipient is handed its topics' entries with its new deliveries
        # among them in order: a sender's messages keep their order whatever their kinds.
        own: dict[tuple[str, str], list[Own]] = {}
        for a, recipients in accepted:
            if a.kind != "topic":
                for p in recipients:
                    own.setdefault((a.mesh_id, p), []).append(
                        Own(order_of[a.broker_message_id], a.broker_message_id))
        seqs = hand_out_on(self.conn, list(own), now, own).seqs
        out: dict[str, list[Delivery]] = {}
        rows = []
        for a, recipients in accepted:
            out[a.broker_message_id] = deliveries = []
            if a.kind == "topic":   # seqs are given when each recipient reads the log
                deliveries += [Delivery(p, 0, 0) for p in recipients]
                continue
            for p in recipients:
                epoch, seq = seqs[((a.mesh_id, p), a.broker_message_id)]
                deliveries.append(Delivery(p, epoch, seq))
                rows.append((a.mesh_id, p, epoch, seq, a.broker_message_id, a.now_ms))
        insert_rows(self.conn, DELIVERY_HEAD, rows)
        return out

    def _positioned(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Topic message rows with their topic's next log positions, in batch order."""
        counts = collections.Counter((r[1], r[4]) for r in rows)
        nxt = {}
        for (mesh_id, topic), n in sorted(counts.items()):
            (last,) = self.conn.execute(
                "UPDATE topic SET last_pos = last_pos + ? WHERE mesh_id = ? AND name = ?"
                " RETURNING last_pos", (n, mesh_id, topic)).fetchone()
            nxt[(mesh_id, topic)] = int(last) - n
        out = []
        for r in rows:
            nxt[(r[1], r[4])] += 1
            out.append((*r, nxt[(r[1], r[4])]))
        return out


# The batch's rows go in one multi-row statement per table (storage/multirow.py): with
# executemany each row was a step, and each step a GIL hand-back from the event loop.
CLAIM_HEAD = """
INSERT INTO client_message_dedupe (mesh_id, sender_pubkey, client_message_id, broker_message_id,
    history_id, request_fingerprint, destination_kind, destination_ref, first_seen_at, expires_at)
VALUES """
CLAIM_TAIL = " ON CONFLICT (mesh_id, sender_pubkey, client_message_id) DO NOTHING"

READBACK_SQL = """
SELECT broker_message_id, history_id, request_fingerprint, history_available, first_seen_at
FROM client_message_dedupe WHERE mesh_id = ? AND sender_pubkey = ? AND client_message_id = ?
"""

TOPIC_SQL = "SELECT 1 FROM topic WHERE mesh_id = ? AND name = ?"
# Whether a DM's member is live, else the live key it was rotated out for (if any).
MEMBER_SQL = """
SELECT m.revoked_at IS NULL, n.pubkey FROM member m
LEFT JOIN member n ON n.mesh_id = m.mesh_id AND n.pubkey = m.rotated_to AND n.revoked_at IS NULL
WHERE m.mesh_id = ? AND m.pubkey = ?
"""
SUBSCRIBERS_SQL = """
SELECT s.member_pubkey FROM topic_subscription s JOIN member m
  ON m.mesh_id = s.mesh_id AND m.pubkey = s.member_pubkey AND m.revoked_at IS NULL
WHERE s.mesh_id = ? AND s.topic = ?
"""
CONSUMERS_SQL = """
SELECT c.member_pubkey FROM queue_consumer c JOIN member m
  ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL
WHERE c.mesh_id = ? AND c.queue = ?
"""
TOPIC_MESSAGE_HEAD = (
    "INSERT INTO topic_message (id, mesh_id, sender_pubkey, client_message_id, topic,"
    " body, body_encoding, priority, meta, reply_to, created_at, traceparent, log_pos,"
    " log_order) VALUES ")
QUEUE_MESSAGE_HEAD = (
    "INSERT INTO message_queue (id, mesh_id, sender_pubkey, client_message_id,"
    " destination_kind, destination_ref, body, body_encoding, priority, meta, reply_to,"
    " created_at, traceparent) VALUES ")
HISTORY_HEAD = (
    "INSERT INTO message_history (history_id, broker_message_id, mesh_id, sender_pubkey,"
    " destination_kind, destination_ref, created_at) VALUES ")
DELIVERY_HEAD = (
    "INSERT INTO delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,"
    " created_at) VALUES ")
