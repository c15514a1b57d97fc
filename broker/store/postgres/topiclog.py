"""Handing topic logs to their subscribers (PostgreSQL), in the caller's transaction:
``broker/topiclog.py`` decides, this reads and writes.

Why no subscriber skips an entry: a topic's positions come from ``topic.last_pos``, bumped
by the accept under the topic row's lock, which it holds until it commits. The accept that
takes position p+1 waits for the one that took p to commit (or roll back, and then takes p
itself), so positions commit in order and a reader that sees ``last_pos`` = p (READ
COMMITTED: a snapshot taken after that commit) sees every entry up to p. This is what the
xid8 rule (read only below ``pg_snapshot_xmin``) gives a sequence-numbered log; here the
order is kept by the writer instead, and positions stay dense, so a span is arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tidemesh.broker.topiclog import HAND_OUT_MAX, UNCAPPED, Entry, Lag, Own, Span, hand_out
from tidemesh.storage.pgarray import int_array, text_array

Key = tuple[str, str]


@dataclass(slots=True, frozen=True)
class Handed:
    """What a member's cursor was before a hand-out and the spans that hand-out gave it.
    When ``whole``, its seqs after ``last_seq`` are exactly the spans' (no gap, no DM between):
    a pump that had sent up to ``last_seq`` reads its page from the spans, not its rows."""

    epoch: int
    last_seq: int
    spans: tuple[Span, ...]
    whole: bool


@dataclass(slots=True)
class Given:
    """What a hand-out did: the members whose topics logged more than it handed out
    (``HAND_OUT_MAX``), the (epoch, seq) each of the accept's own deliveries took, and (a
    pump's hand-out, no ``own``) what each member was given."""

    more: set[Key] = field(default_factory=set)
    seqs: dict[tuple[Key, str], tuple[int, int]] = field(default_factory=dict)
    handed: dict[Key, Handed] = field(default_factory=dict)
    # The entries ``content_for`` asked for, read by the hand-out's write: (mesh, topic,
    # position) → the row as ENTRIES_SQL gives it.
    content: dict[tuple[str, str, int], Any] = field(default_factory=dict)


# Which logged entries a pump's page will hold, from what its hand-out gave (``Given.handed``):
# their content is read by the hand-out's own write (one round trip fewer on a message's path).
ContentFor = Callable[[Mapping[Key, Handed]], Sequence[tuple[str, str, int]]]


class CursorsMissing(Exception):
    """A hand-out told that its members' cursors exist (``cursors="existing"``) found one
    that does not: the caller rolls its transaction back and runs it again with
    ``cursors="make"``. Once per member at most: its first hand-out makes its cursor."""


# How a hand-out gets its members' cursors, locked: ``held`` by the caller already (who made
# them); ``existing``, locked by the read itself (one statement; ``CursorsMissing`` if one
# is not there yet); ``make``: made where missing, then read (two statements).
CursorMode = Literal["held", "existing", "make"]


async def hand_out_on(conn: Any, keys: Sequence[Key], now_ms: int, *,
                      lock_all: bool = False,
                      own: Mapping[Key, Sequence[Own]] | None = None,
                      content_for: ContentFor | None = None,
                      cursors: CursorMode = "make") -> Given:
    """Give each of ``keys`` (mesh, member) what its topics logged since it was last given
    any. One read of each topic's new entries serves all its subscribers here; a member
    with nothing new costs no write, unless ``lock_all`` (all ``keys`` are locked and
    handed out). ``own``: the DM and queue deliveries the accept is giving some of them
    (all their topics' entries are handed out then, uncapped, so each takes its seq in
    order among them). ``content_for``: the entries whose content the write reads too.
    ``cursors``: see ``CursorMode``."""
    given = Given()
    if not keys:
        return given
    wanted = sorted(set(keys))
    if not lock_all:
        wanted = sorted({(r[0], r[1]) for r in await conn.fetch(
            LAGS_SQL, text_array([k[0] for k in wanted]), text_array([k[1] for k in wanted]))})
        if not wanted:
            return given
    ms, ps = text_array([k[0] for k in wanted]), text_array([k[1] for k in wanted])
    if cursors == "make":
        await conn.execute(LOCK_CURSORS_SQL, ms, ps, now_ms)
    found_cursors = await conn.fetch(LOCKED_CURSORS_SQL if cursors == "existing"
                                     else CURSORS_SQL, ms, ps)
    if len(found_cursors) < len(wanted):
        # Locking the missing ones now would take cursor locks out of their one order.
        raise CursorsMissing(f"{len(wanted) - len(found_cursors)} of {len(wanted)} cursors")
    held = {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4])) for r in found_cursors}
    # Read again under the cursors' locks: another broker may have handed some out meanwhile.
    # The lags and the entries they give, in one statement (one round trip).
    cap = HAND_OUT_MAX if own is None else UNCAPPED
    lags: dict[Key, list[Lag]] = {k: [] for k in (own or {})}
    found: dict[tuple[str, str], dict[int, Entry]] = {}
    for m, p, topic, pos, last_pos, sender, created_at, order in await conn.fetch(
            LOGGED_SQL, ms, ps, cap):
        if p is not None:
            lags.setdefault((m, p), []).append(Lag(topic, int(pos), int(last_pos), cap))
        else:
            found.setdefault((m, topic), {})[int(pos)] = Entry(int(pos), sender,
                                                               int(created_at), int(order))
    if not any(lags.values()) and not own:
        return given
    entries = {t: [es[pos] for pos in sorted(es)] for t, es in found.items()}
    spans: list[tuple[Any, ...]] = []
    moved: list[tuple[str, str, str, int]] = []
    bumped: list[tuple[str, str, int, int]] = []
    for (m, p), gs in sorted(lags.items()):
        epoch, last_seq, compacted = held[(m, p)]
        out = hand_out(p, last_seq, compacted, gs,
                       {g.topic: entries.get((m, g.topic), []) for g in gs},
                       (own or {}).get((m, p), ()))
        spans += [(m, p, epoch, s.seq_last, s.seq_first, s.topic, s.pos_first, s.created_at)
                  for s in out.spans]
        moved += [(m, topic, p, pos) for topic, pos in out.log_pos]
        bumped.append((m, p, out.last_seq, out.compacted_seq))
        given.seqs.update({((m, p), bm): (epoch, seq) for bm, seq in out.own})
        if own is None:
            given.handed[(m, p)] = Handed(epoch, last_seq, out.spans,
                                          out.compacted_seq == compacted)
        if out.more:
            given.more.add((m, p))
    entry_keys = list(content_for(given.handed)) if content_for is not None else []
    rows = await conn.fetch(WRITE_SQL, *(_column(spans, i) for i in range(8)),
                            *(_column(moved, i) for i in range(4)),
                            *(_column(bumped, i) for i in range(4)), now_ms,
                            *(_column(entry_keys, i) for i in range(3)))
    given.content = {(r[0], r[1], int(r[2])): r for r in rows}
    return given


def _column(rows: Sequence[tuple[Any, ...]], i: int) -> str:
    values = [r[i] for r in rows]
    return int_array(values) if values and isinstance(values[0], int) else text_array(values)


# Each member's subscriptions by their index, whatever the plan: after five runs asyncpg's
# prepared statement gets PostgreSQL's generic plan, which guesses ten members and joined
# them to every subscription of the topic (0.8 s at 1,000 members). OFFSET 0 keeps the
# lookup per member.
LAGS_SQL = """
SELECT s.mesh_id, s.member_pubkey, s.topic, s.log_pos, t.last_pos
FROM unnest($1::text::text[], $2::text::text[]) AS k(m, p)
CROSS JOIN LATERAL (SELECT * FROM mesh.topic_subscription s
                    WHERE s.mesh_id = k.m AND s.member_pubkey = k.p OFFSET 0) s
JOIN mesh.topic t ON t.mesh_id = s.mesh_id AND t.name = s.topic
WHERE t.last_pos > s.log_pos
"""

# In (mesh, member) order, as every other cursor lock: no deadlock with the accept. A cursor
# that exists is locked, not updated (``WHERE FALSE`` still locks the conflicting row): the
# hand-out's one update of it comes after.
LOCK_CURSORS_SQL = """
INSERT INTO mesh.recipient_cursor (mesh_id, recipient_pubkey, updated_at)
SELECT m, p, $3::bigint FROM unnest($1::text::text[], $2::text::text[]) AS u(m, p)
ORDER BY m, p
ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE SET updated_at = EXCLUDED.updated_at
WHERE FALSE
"""

CURSORS_SQL = """
SELECT c.mesh_id, c.recipient_pubkey, c.epoch, c.last_seq, c.compacted_seq
FROM mesh.recipient_cursor c JOIN unnest($1::text::text[], $2::text::text[]) AS u(m, p)
  ON c.mesh_id = u.m AND c.recipient_pubkey = u.p
"""

# The cursors that exist, locked in (mesh, member) order as the read goes (the lock sits
# above the sort) and read as they are once locked (READ COMMITTED reads a row updated
# meanwhile again): LOCK_CURSORS_SQL then CURSORS_SQL in one round trip, for cursors made
# already.
LOCKED_CURSORS_SQL = CURSORS_SQL + """ORDER BY c.mesh_id, c.recipient_pubkey
FOR UPDATE OF c
"""

# LAGS_SQL (the member set: a lag's row), then the entries of each window (log_pos, upto]
# (member NULL), read once for the subscribers given the same positions so far (the usual
# case). $3: how many positions one hand-out gives at most (``Lag.cap``).
LOGGED_SQL = """
WITH g AS MATERIALIZED (
  SELECT s.mesh_id AS m, s.member_pubkey AS p, s.topic AS n, s.log_pos AS after, t.last_pos,
         LEAST(t.last_pos, s.log_pos + $3::bigint) AS upto
  FROM unnest($1::text::text[], $2::text::text[]) AS k(m, p)
  CROSS JOIN LATERAL (SELECT * FROM mesh.topic_subscription s
                      WHERE s.mesh_id = k.m AND s.member_pubkey = k.p OFFSET 0) s
  JOIN mesh.topic t ON t.mesh_id = s.mesh_id AND t.name = s.topic
  WHERE t.last_pos > s.log_pos
)
SELECT g.m, g.p, g.n, g.after, g.last_pos, NULL::text, NULL::bigint, NULL::bigint FROM g
UNION ALL
SELECT e.mesh_id, NULL::text, e.topic, e.log_pos, NULL::bigint, e.sender_pubkey,
       e.created_at, e.log_order
FROM (SELECT DISTINCT m, n, after, upto FROM g) w
CROSS JOIN LATERAL (SELECT * FROM mesh.topic_message e
                    WHERE e.mesh_id = w.m AND e.topic = w.n AND e.log_pos > w.after
                      AND e.log_pos <= w.upto OFFSET 0) e
"""

def entries_sql(first: int) -> str:
    """The content of logged entries, keyed by the (mesh, topic, position) arrays at
    parameters ``first`` to ``first + 2``: each entry with its history id and its sender's
    name (the columns ``delivery._filled`` reads). Each entry is looked up by its key
    (``LATERAL … OFFSET 0``): a plain join, planned while the log was empty, read the whole
    log at every run (tests/broker/test_store_plans.py)."""
    return f"""
SELECT t.mesh_id, t.topic, t.log_pos, t.id, h.history_id, t.sender_pubkey,
       t.client_message_id, t.body, t.body_encoding, t.priority, t.meta, t.reply_to,
       t.created_at, m.display_name, t.traceparent
FROM unnest(${first}::text::text[], ${first + 1}::text::text[], ${first + 2}::text::bigint[])
     AS k(m, n, pos)
CROSS JOIN LATERAL (SELECT * FROM mesh.topic_message t
                    WHERE t.mesh_id = k.m AND t.topic = k.n AND t.log_pos = k.pos OFFSET 0) t
LEFT JOIN mesh.message_history h ON h.broker_message_id = t.id
LEFT JOIN mesh.member m ON m.mesh_id = t.mesh_id AND m.pubkey = t.sender_pubkey
"""  # noqa: S608 - only parameter numbers go in


# The spans, the subscriptions' positions and the cursors' seqs in one statement (one round
# trip: with 1,000 members' pumps and acks on the event loop, each costs a turn of it); it
# returns the content of the entries $18-$20 (``entries_sql``), already committed by
# their accepts: a pump's first page needs no read of its own.
WRITE_SQL = """
WITH spans AS (
  INSERT INTO mesh.topic_delivery (mesh_id, recipient_pubkey, epoch, seq_last, seq_first,
      topic, pos_first, created_at)
  SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::bigint[],
                       $4::text::bigint[], $5::text::bigint[], $6::text::text[],
                       $7::text::bigint[], $8::text::bigint[])
), moved AS (
  UPDATE mesh.topic_subscription s SET log_pos = u.pos
  FROM unnest($9::text::text[], $10::text::text[], $11::text::text[], $12::text::bigint[])
       AS u(m, n, p, pos)
  WHERE s.mesh_id = u.m AND s.topic = u.n AND s.member_pubkey = u.p
), bumped AS (
  UPDATE mesh.recipient_cursor c SET last_seq = u.l, compacted_seq = u.c, updated_at = $17
  FROM unnest($13::text::text[], $14::text::text[], $15::text::bigint[], $16::text::bigint[])
       AS u(m, p, l, c)
  WHERE c.mesh_id = u.m AND c.recipient_pubkey = u.p
)""" + entries_sql(18)  # noqa: S608 - constants only
