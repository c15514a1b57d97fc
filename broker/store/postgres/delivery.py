"""The receive path (PostgreSQL): cursors, delivery pages, acks, and lapsed queue leases."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg
import structlog

from tidemesh.broker.accept import pick_queue_consumer
from tidemesh.broker.store.base import Cursor, DeliveryRow, Reassigned, latest_acks, stored_meta
from tidemesh.broker.store.postgres.base import PostgresBase
from tidemesh.broker.store.postgres.topiclog import (
    LAGS_SQL,
    CursorMode,
    CursorsMissing,
    Handed,
    entries_sql,
    hand_out_on,
)
from tidemesh.broker.topiclog import Span
from tidemesh.storage.groupcommit import GroupCommit
from tidemesh.storage.pgarray import int_array, text_array

log = structlog.get_logger(__name__)
T = TypeVar("T")
DEADLOCK_TRIES = 3
Ack = tuple[str, str, int, int, int]   # mesh, member, epoch, seq, now_ms
Page = tuple[str, str, int, int, int]  # mesh, member, epoch, after_seq, limit
Due = tuple[Page, int, bool]           # a page; now_ms and logged for the hand-out before it
Key = tuple[str, str]


class Delivery(PostgresBase):
    _acks: GroupCommit[Ack, int]
    _hand_outs: GroupCommit[tuple[Key, int], bool]
    _dues: GroupCommit[Due, tuple[bool, list[DeliveryRow]]]
    _pages: GroupCommit[Page, list[DeliveryRow]]

    def _init_delivery(self) -> None:
        # Pumps and acks of many members share transactions (issue #30: a lone message to
        # N members costs a few statements, not N transactions). Not on the accept's
        # writers: those lock cursors then topics, and a transaction mixing both kinds of
        # work could lock cursors out of order. The pumps' statements (hand-outs, pages)
        # run on the generic pool: PostgreSQL planned the page query again at every run.
        self._acks = GroupCommit(self._ack_batch)
        self._hand_outs = GroupCommit(self._hand_out_batch)
        self._dues = GroupCommit(self._due_batch)
        self._pages = GroupCommit(self._page_batch)

    async def hand_out(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        return await self._hand_outs.submit(((mesh_id, pubkey), now_ms))

    async def _hand_out_batch(self, args: Sequence[tuple[Key, int]]) -> list[bool]:
        more = (await self._hand_out_then(sorted({k for k, _ in args}), set(),
                                          max(t for _, t in args), []))[0]
        return [k in more for k, _ in args]

    async def hand_out_page(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                            limit: int, now_ms: int, logged: bool = False
                            ) -> tuple[bool, list[DeliveryRow]]:
        return await self._dues.submit(((mesh_id, pubkey, epoch, after_seq, limit), now_ms,
                                        logged))

    async def _due_batch(self, dues: Sequence[Due]) -> list[tuple[bool, list[DeliveryRow]]]:
        """The hand-outs of many pumps and their first pages, the pages read in the
        hand-out's transaction (they see its spans): a wake-up costs one transaction and no
        second turn of the pool before the frames go out, after COMMIT."""
        pages = [p for p, _, _ in dues]
        logged = {(p[0], p[1]) for p, _, hint in dues if hint}
        more, rows = await self._hand_out_then(sorted({(p[0], p[1]) for p in pages} - logged),
                                               logged, max(t for _, t, _ in dues), pages)
        return [((p[0], p[1]) in more, r) for p, r in zip(pages, rows, strict=True)]

    async def _hand_out_then(self, keys: list[Key], logged: set[Key], now_ms: int,
                             pages: Sequence[Page]) -> tuple[set[Key], list[list[DeliveryRow]]]:
        """Hand ``keys`` and ``logged`` what their topics logged, then read ``pages``; one
        transaction when any of them lags, none when none does. Whether ``keys`` lag is
        asked first; ``logged`` are known to (woken for a topic message)."""
        pool = self.generic_pool
        lagging = sorted(logged | ({(r[0], r[1]) for r in await pool.fetch(
            LAGS_SQL, text_array([k[0] for k in keys]), text_array([k[1] for k in keys]))}
            if keys else set()))
        if not lagging:
            return set(), await _pages_on(pool, pages)

        async def run(cursors: CursorMode) -> tuple[set[Key], list[list[DeliveryRow]]]:
            # The plans are worked out once, in the write's ask for content (at 1,000
            # members, 1,000 pages' seqs expanded), and serve the pages' read after it.
            plans: dict[int, list[Slot]] | None = None

            def content_for(handed: Mapping[Key, Handed]) -> list[tuple[str, str, int]]:
                nonlocal plans
                plans = _handed_plans(pages, handed)
                return _entry_keys(pages, plans)

            async with pool.acquire() as conn, conn.transaction():
                given = await hand_out_on(conn, lagging, now_ms, lock_all=True,
                                          content_for=content_for, cursors=cursors)
                if plans is None:   # the hand-out gave nothing, so it asked for nothing
                    plans = _handed_plans(pages, given.handed)
                return given.more, await _pages_on(conn, pages, plans, given.content)

        try:   # the cursors locked by their read; a member's first hand-out makes its own
            return await _again_after_deadlock(lambda: run("existing"))
        except CursorsMissing:
            return await _again_after_deadlock(lambda: run("make"))

    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor:
        r = await self.pool.fetchrow(
            "SELECT epoch, last_seq, acked_seq, compacted_seq FROM mesh.recipient_cursor"
            " WHERE mesh_id = $1 AND recipient_pubkey = $2", mesh_id, pubkey)
        return Cursor(*r) if r else Cursor(1, 0, 0, 0)

    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]:
        return await self._pages.submit((mesh_id, pubkey, epoch, after_seq, limit))

    async def _page_batch(self, asks: Sequence[Page]) -> list[list[DeliveryRow]]:
        return await _pages_on(self.generic_pool, asks)

    async def reassign_lapsed(self, lease_before: int, now_ms: int,
                              limit: int = 500) -> list[Reassigned]:
        """Give each lapsed queue delivery to another live consumer. One delivery per
        transaction, so this never holds two recipient cursors at once and cannot deadlock
        with accept batches (which lock cursors in sorted order)."""
        moved = []
        for mesh_id, old, epoch, seq, bmid, queue in await self.pool.fetch(
                LAPSED_SQL, lease_before, limit):
            async with self.pool.acquire() as conn, conn.transaction():
                still = await conn.fetchval(
                    "SELECT 1 FROM mesh.delivery_queue WHERE mesh_id = $1"
                    " AND recipient_pubkey = $2 AND epoch = $3 AND seq = $4"
                    " AND acked_at IS NULL AND reassigned_at IS NULL FOR UPDATE SKIP LOCKED",
                    mesh_id, old, epoch, seq)
                others = [r[0] for r in await conn.fetch(
                    "SELECT c.member_pubkey FROM mesh.queue_consumer c JOIN mesh.member m"
                    " ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey"
                    " AND m.revoked_at IS NULL WHERE c.mesh_id = $1 AND c.queue = $2"
                    " AND c.member_pubkey != $3", mesh_id, queue, old)]
                if not still or not others:
                    continue  # acked meanwhile, or the only consumer keeps it
                new = pick_queue_consumer(others, bmid)
                await conn.execute(
                    "UPDATE mesh.delivery_queue SET reassigned_at = $1 WHERE mesh_id = $2"
                    " AND recipient_pubkey = $3 AND epoch = $4 AND seq = $5",
                    now_ms, mesh_id, old, epoch, seq)
                new_epoch, new_seq = await conn.fetchrow(
                    "INSERT INTO mesh.recipient_cursor (mesh_id, recipient_pubkey, last_seq,"
                    " updated_at) VALUES ($1, $2, 1, $3) ON CONFLICT (mesh_id, recipient_pubkey)"
                    " DO UPDATE SET last_seq = mesh.recipient_cursor.last_seq + 1,"
                    " updated_at = excluded.updated_at RETURNING epoch, last_seq",
                    mesh_id, new, now_ms)
                await conn.execute(
                    "INSERT INTO mesh.delivery_queue (mesh_id, recipient_pubkey, epoch, seq,"
                    " broker_message_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
                    mesh_id, new, new_epoch, new_seq, bmid, now_ms)
                moved.append(Reassigned(mesh_id, bmid, old, new))
        return moved

    async def ack(self, mesh_id: str, pubkey: str, epoch: int, seq: int, now_ms: int) -> int:
        return await self._acks.submit((mesh_id, pubkey, epoch, seq, now_ms))

    async def _ack_batch(self, acks: Sequence[Ack]) -> list[int]:
        latest = latest_acks(acks)
        moved = {(r[0], r[1], int(r[2])): int(r[3]) for r in await _again_after_deadlock(
            lambda: self.pool.fetch(
                ACK_SQL, text_array([k[0] for k in latest]),
                text_array([k[1] for k in latest]), int_array([k[2] for k in latest]),
                int_array(list(latest.values())), max(a[4] for a in acks)))}
        # What the cursor moved by goes to the ack that moved it (the latest of its key).
        out = []
        for m, p, e, s, _ in acks:
            out.append(moved.pop((m, p, e), 0) if latest.get((m, p, e)) == s else 0)
        return out


def _handed_plans(asks: Sequence[Page], handed: Mapping[Key, Handed] | None
                  ) -> dict[int, list[Slot]]:
    """The pages (by place in ``asks``) whose seqs a hand-out's spans tell: those of pumps
    that had sent their member everything before a hand-out that gave it only topic
    entries (``Handed.whole``)."""
    plans: dict[int, list[Slot]] = {}
    for i, a in enumerate(asks):
        h = (handed or {}).get((a[0], a[1]))
        if h is not None and h.whole and h.epoch == a[2] and h.last_seq == a[3]:
            plans[i] = _expand(h.spans, [], a[3], a[4])
    return plans


def _entry_keys(asks: Sequence[Page], plans: Mapping[int, list[Slot]]
                ) -> list[tuple[str, str, int]]:
    """The logged entries the pages of ``plans`` (``_handed_plans``) will hold, each once."""
    keys: dict[tuple[str, str, int], None] = {}
    for i, plan in plans.items():
        for slot in plan:
            keys[(asks[i][0], slot[1], slot[2])] = None
    return list(keys)


async def _pages_on(db: Any, asks: Sequence[Page],
                    handed_plans: Mapping[int, list[Slot]] | None = None,
                    content: Mapping[tuple[str, str, int], Any] | None = None
                    ) -> list[list[DeliveryRow]]:
    """The pages of many pumps on ``db`` (a pool or a connection), each message's content
    read once however many of the pages hold it (a topic message's burst to N members had
    been read and decoded N times). First which seqs each page holds: a pump that had sent
    all its member was given before a hand-out that gave it only topic entries
    (``Handed.whole``: a lone topic message to N connected members, the usual wake-up)
    knows them from that hand-out's spans; the others read their window (rows and spans,
    no content). Then the content of all the pages at once, but for what the hand-out's write
    read already (``content``). A lone page is one query. ``handed_plans``: the hand-out's
    (``_handed_plans``)."""
    plans = dict(handed_plans or {})
    windows = [(i, a) for i, a in enumerate(asks) if i not in plans]
    if len(asks) == 1 and windows:
        return [[DeliveryRow.of_record(r) for r in await db.fetch(DELIVERIES_SQL, *asks[0])]]
    if windows:
        spans: dict[int, list[Span]] = {i: [] for i, _ in windows}
        rows: dict[int, list[Slot]] = {i: [] for i, _ in windows}
        for r in await db.fetch(
                WINDOWS_SQL, text_array([a[0] for _, a in windows]),
                text_array([a[1] for _, a in windows]), int_array([a[2] for _, a in windows]),
                int_array([a[3] for _, a in windows]), int_array([a[4] for _, a in windows])):
            i = windows[r[0] - 1][0]
            if r[1] is None:   # a row of delivery_queue
                rows[i].append((int(r[2]), "", 0, r[5], int(r[6]), bool(r[7])))
            else:
                spans[i].append(Span(r[1], int(r[4]), int(r[2]), int(r[3]), 0))
        for i, a in windows:
            plans[i] = _expand(spans[i], rows[i], a[3], a[4])
    out = await _filled(db, asks, plans, content or {})
    missing = [i for i, page in enumerate(out) if page is None]
    for i in missing:   # content pruned meanwhile: DELIVERIES_SQL pages past it
        out[i] = [DeliveryRow.of_record(r) for r in await db.fetch(DELIVERIES_SQL, *asks[i])]
    return [page or [] for page in out]


# One seq of a page and where its content is: (seq, topic, position) for a topic entry,
# (seq, "", 0, broker_message_id, created_at, reassigned) for a row of delivery_queue.
Slot = tuple[Any, ...]


def _expand(spans: Sequence[Span], rows: Sequence[Slot], after: int, limit: int
            ) -> list[Slot]:
    """The first ``limit`` seqs after ``after``: each span's positions
    (seq = seq_first + pos - pos_first) and the rows, in seq order."""
    slots = list(rows)
    upto = after + limit
    for span in sorted(spans, key=lambda s: s.seq_first):
        for seq in range(max(span.seq_first, after + 1), min(span.seq_last, upto) + 1):
            slots.append((seq, span.topic, span.pos_first + seq - span.seq_first))
    if rows:
        slots.sort(key=lambda s: s[0])
    return slots[:limit]


async def _filled(db: Any, asks: Sequence[Page], plans: dict[int, list[Slot]],
                  known: Mapping[tuple[str, str, int], Any]) -> list[list[DeliveryRow] | None]:
    """Each plan's rows with their content, each message read once (none of those in
    ``known``); None for a page one of whose messages is gone (pruned since its seqs were
    read)."""
    entries: dict[tuple[str, str, int], None] = {}
    messages: dict[tuple[str, str], None] = {}
    for i, plan in plans.items():
        mesh = asks[i][0]
        for slot in plan:
            if not slot[1]:
                messages[(mesh, slot[3])] = None
            elif (mesh, slot[1], slot[2]) not in known:
                entries[(mesh, slot[1], slot[2])] = None
    content: dict[Any, Any] = dict(known)
    if entries:
        keys = list(entries)
        content.update({(r[0], r[1], int(r[2])): r for r in await db.fetch(
            ENTRIES_SQL, text_array([k[0] for k in keys]), text_array([k[1] for k in keys]),
            int_array([k[2] for k in keys]))})
    if messages:
        ids = list(messages)
        content.update({(r[0], r[1]): r for r in await db.fetch(
            MESSAGES_SQL, text_array([k[0] for k in ids]), text_array([k[1] for k in ids]))})
    metas: dict[Any, dict[str, Any] | None] = {}
    out: list[list[DeliveryRow] | None] = [None] * len(asks)
    for i, plan in plans.items():
        mesh, epoch = asks[i][0], asks[i][2]
        page: list[DeliveryRow] = []
        for slot in plan:
            key = (mesh, slot[1], slot[2]) if slot[1] else (mesh, slot[3])
            r = content.get(key)
            if r is None:
                break
            if key not in metas:   # decoded once per message; a row's meta is only read
                metas[key] = stored_meta(r[10]) if r[10] is not None else None
            if slot[1]:
                page.append(DeliveryRow(epoch, slot[0], r[3], r[4], r[5], r[6], "topic",
                                        slot[1], bytes(r[7]), r[8], r[9], metas[key], r[11],
                                        r[12], False, r[13], r[14]))
            else:
                page.append(DeliveryRow(epoch, slot[0], r[1], r[2], r[3], r[4], r[5], r[6],
                                        bytes(r[7]), r[8], r[9], metas[key], r[11], slot[4],
                                        slot[5], r[12], r[13]))
        else:
            out[i] = page
    return out


async def _again_after_deadlock(run: Callable[[], Awaitable[T]]) -> T:
    """Run a batch again if PostgreSQL broke a deadlock by aborting it. Cursors are locked in
    one order everywhere, but a lease move locks a delivery row before a cursor while an
    ack batch stamps rows after its cursors: rare, and harmless to redo."""
    attempt = 1
    while True:
        try:
            return await run()
        except asyncpg.exceptions.DeadlockDetectedError as exc:
            if attempt == DEADLOCK_TRIES:
                raise
            log.warning("broker_cursor_batch_redone", error=str(exc), attempt=attempt)
            attempt += 1


# A cumulative ack moves the recipient's cursor (no index covers acked_seq: a HOT update)
# and stamps the DM and queue rows it covers (queue leases and pruning read acked_at); topic
# spans are never touched. Cursors are locked in (mesh, member) order, as everywhere.
ACK_SQL = """
WITH u AS (
  SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::bigint[],
                       $4::text::bigint[]) AS u(m, p, e, s)
), old AS (
  SELECT c.mesh_id, c.recipient_pubkey, c.epoch, c.acked_seq, LEAST(u.s, c.last_seq) AS upto
  FROM mesh.recipient_cursor c JOIN u ON c.mesh_id = u.m AND c.recipient_pubkey = u.p
    AND c.epoch = u.e
  ORDER BY c.mesh_id, c.recipient_pubkey FOR UPDATE OF c
), rows AS (
  UPDATE mesh.delivery_queue d SET acked_at = $5
  FROM old WHERE d.mesh_id = old.mesh_id AND d.recipient_pubkey = old.recipient_pubkey
    AND d.epoch = old.epoch AND d.seq > old.acked_seq AND d.seq <= old.upto
    AND d.acked_at IS NULL
)
UPDATE mesh.recipient_cursor c SET acked_seq = old.upto, updated_at = $5
FROM old WHERE c.mesh_id = old.mesh_id AND c.recipient_pubkey = old.recipient_pubkey
  AND old.upto > old.acked_seq
RETURNING c.mesh_id, c.recipient_pubkey, c.epoch, old.upto - old.acked_seq
"""

# A recipient's rows (DMs, queue messages, and topic messages from before the topic log)
# and its topic spans, expanded to their positions (seq = seq_first + pos - pos_first), in
# one seq order. Only the spans and positions the page can reach are read.
DELIVERIES_SQL = """
WITH d AS (
  (SELECT d.epoch, d.seq, d.broker_message_id AS bm, d.created_at, d.reassigned_at
   FROM mesh.delivery_queue d
   WHERE d.mesh_id = $1 AND d.recipient_pubkey = $2 AND d.epoch = $3 AND d.seq > $4
   ORDER BY d.seq LIMIT $5)
  UNION ALL
  (SELECT r.epoch, r.seq_first + (e.log_pos - r.pos_first), e.id, e.created_at, NULL::bigint
   FROM (SELECT * FROM mesh.topic_delivery r
         WHERE r.mesh_id = $1 AND r.recipient_pubkey = $2 AND r.epoch = $3 AND r.seq_last > $4
         ORDER BY r.seq_last LIMIT $5) r
   JOIN mesh.topic_message e ON e.mesh_id = r.mesh_id AND e.topic = r.topic
     AND e.log_pos >= r.pos_first + GREATEST(0, $4 + 1 - r.seq_first)
     AND e.log_pos <= r.pos_first + (LEAST(r.seq_last, $4 + $5) - r.seq_first))
)
SELECT d.epoch, d.seq, d.bm, h.history_id,
       COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), d.created_at, d.reassigned_at IS NOT NULL,
       m.display_name, COALESCE(t.traceparent, q.traceparent)
FROM d
LEFT JOIN mesh.topic_message t ON t.id = d.bm
LEFT JOIN mesh.message_queue q ON q.id = d.bm
LEFT JOIN mesh.message_history h ON h.broker_message_id = d.bm
LEFT JOIN mesh.member m ON m.mesh_id = $1
  AND m.pubkey = COALESCE(t.sender_pubkey, q.sender_pubkey)
WHERE t.id IS NOT NULL OR q.id IS NOT NULL
ORDER BY d.seq LIMIT $5
"""

# The entries (mesh, topic, position) of spans just handed out, each once, with what a
# delivery of it carries (DELIVERIES_SQL's columns for a topic entry).
ENTRIES_SQL = entries_sql(1)

# Which seqs each of many (mesh, member, epoch, after, limit) pages holds, without their
# content: its rows of delivery_queue (topic NULL: seq, broker_message_id, created_at,
# reassigned) and its topic spans (seq_first, seq_last, pos_first), as DELIVERIES_SQL bounds
# them, each tagged with the place of its ask.
WINDOWS_SQL = """
WITH k AS MATERIALIZED (
  SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::bigint[],
                       $4::text::bigint[], $5::text::bigint[])
                WITH ORDINALITY AS k(m, p, e, a, l, i)
)
SELECT k.i, NULL::text, d.seq, NULL::bigint, NULL::bigint, d.broker_message_id, d.created_at,
       d.reassigned_at IS NOT NULL
FROM k CROSS JOIN LATERAL (
  SELECT * FROM mesh.delivery_queue d
  WHERE d.mesh_id = k.m AND d.recipient_pubkey = k.p AND d.epoch = k.e AND d.seq > k.a
  ORDER BY d.seq LIMIT k.l) d
UNION ALL
SELECT k.i, r.topic, r.seq_first, r.seq_last, r.pos_first, NULL, NULL, NULL
FROM k CROSS JOIN LATERAL (
  SELECT * FROM mesh.topic_delivery r
  WHERE r.mesh_id = k.m AND r.recipient_pubkey = k.p AND r.epoch = k.e AND r.seq_last > k.a
  ORDER BY r.seq_last LIMIT k.l) r
"""

# The content of rows of delivery_queue, each message once: DMs, queue messages, and topic
# messages from before the topic log (DELIVERIES_SQL's columns for them).
MESSAGES_SQL = """
SELECT b.m, b.id, h.history_id, COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), m.display_name, COALESCE(t.traceparent, q.traceparent)
FROM unnest($1::text::text[], $2::text::text[]) AS b(m, id)
LEFT JOIN mesh.topic_message t ON t.id = b.id
LEFT JOIN mesh.message_queue q ON q.id = b.id
LEFT JOIN mesh.message_history h ON h.broker_message_id = b.id
LEFT JOIN mesh.member m ON m.mesh_id = b.m
  AND m.pubkey = COALESCE(t.sender_pubkey, q.sender_pubkey)
WHERE t.id IS NOT NULL OR q.id IS NOT NULL
"""

# Only deliveries another live consumer could take: the ones the only consumer keeps would
# otherwise fill the page, oldest first, and keep every later lapsed lease from moving.
LAPSED_SQL = """
SELECT d.mesh_id, d.recipient_pubkey, d.epoch, d.seq, d.broker_message_id, q.destination_ref
FROM mesh.delivery_queue d JOIN mesh.message_queue q ON q.id = d.broker_message_id
WHERE q.destination_kind = 'queue' AND d.acked_at IS NULL AND d.reassigned_at IS NULL
  AND d.created_at < $1
  AND EXISTS (SELECT 1 FROM mesh.queue_consumer c JOIN mesh.member m
              ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL
              WHERE c.mesh_id = d.mesh_id AND c.queue = q.destination_ref
                AND c.member_pubkey != d.recipient_pubkey)
ORDER BY d.created_at LIMIT $2
"""
