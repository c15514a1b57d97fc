"""Handing topic logs to their subscribers (SQLite), in the writer's transaction:
``broker/topiclog.py`` decides, this reads and writes.

Why no subscriber skips an entry: SQLite has one writer, so the accept that takes a topic's
next position (``topic.last_pos``) commits before any later one takes the position after
it; a reader that sees ``last_pos`` = p sees every entry up to p.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidemesh.broker.topiclog import HAND_OUT_MAX, UNCAPPED, Entry, Lag, Own, hand_out

Key = tuple[str, str]

LAGS_SQL = """
SELECT s.topic, s.log_pos, t.last_pos FROM topic_subscription s
JOIN topic t ON t.mesh_id = s.mesh_id AND t.name = s.topic
WHERE s.mesh_id = ? AND s.member_pubkey = ? AND t.last_pos > s.log_pos
"""
ENTRIES_SQL = """
SELECT log_pos, sender_pubkey, created_at, log_order FROM topic_message
WHERE mesh_id = ? AND topic = ? AND log_pos > ? AND log_pos <= ? ORDER BY log_pos
"""
CURSOR_SQL = """
INSERT INTO recipient_cursor (mesh_id, recipient_pubkey, updated_at) VALUES (?, ?, ?)
ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE SET updated_at = excluded.updated_at
RETURNING epoch, last_seq, compacted_seq
"""


def lagging(conn: sqlite3.Connection, key: Key, cap: int = HAND_OUT_MAX) -> list[Lag]:
    return [Lag(t, int(a), int(b), cap) for t, a, b in conn.execute(LAGS_SQL, key)]


@dataclass(slots=True)
class Given:
    """What a hand-out did: the members whose topics logged more than it handed out
    (``HAND_OUT_MAX``), and the (epoch, seq) each of the accept's own deliveries took."""

    more: set[Key] = field(default_factory=set)
    seqs: dict[tuple[Key, str], tuple[int, int]] = field(default_factory=dict)


def hand_out_on(conn: sqlite3.Connection, keys: Sequence[Key], now_ms: int,
                own: Mapping[Key, Sequence[Own]] | None = None) -> Given:
    """Give each of ``keys`` what its topics logged since it was last given any.
    Subscribers at the same position share one read of the topic's new entries. ``own``:
    the DM and queue deliveries the accept is giving some of them (all their topics'
    entries are handed out then, uncapped, so each takes its seq in order among them)."""
    read: dict[tuple[str, str, int, int], list[Entry]] = {}
    given = Given()
    for mesh_id, pubkey in sorted(set(keys)):
        mine = (own or {}).get((mesh_id, pubkey), ())
        lags = lagging(conn, (mesh_id, pubkey), HAND_OUT_MAX if own is None else UNCAPPED)
        if not lags and not mine:
            continue
        epoch, last_seq, compacted = conn.execute(CURSOR_SQL, (mesh_id, pubkey, now_ms)
                                                  ).fetchone()
        entries = {}
        for g in lags:
            window = (mesh_id, g.topic, g.log_pos, g.upto)
            if window not in read:
                read[window] = [Entry(int(p), s, int(c), int(o))
                                for p, s, c, o in conn.execute(ENTRIES_SQL, window)]
            entries[g.topic] = read[window]
        out = hand_out(pubkey, int(last_seq), int(compacted), lags, entries, mine)
        conn.executemany(
            "INSERT INTO topic_delivery (mesh_id, recipient_pubkey, epoch, seq_last, seq_first,"
            " topic, pos_first, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(mesh_id, pubkey, epoch, s.seq_last, s.seq_first, s.topic, s.pos_first,
              s.created_at) for s in out.spans])
        conn.executemany(
            "UPDATE topic_subscription SET log_pos = ? WHERE mesh_id = ? AND topic = ?"
            " AND member_pubkey = ?", [(pos, mesh_id, t, pubkey) for t, pos in out.log_pos])
        conn.execute("UPDATE recipient_cursor SET last_seq = ?, compacted_seq = ?,"
                     " updated_at = ? WHERE mesh_id = ? AND recipient_pubkey = ?",
                     (out.last_seq, out.compacted_seq, now_ms, mesh_id, pubkey))
        given.seqs.update({((mesh_id, pubkey), bm): (int(epoch), seq) for bm, seq in out.own})
        if out.more:
            given.more.add((mesh_id, pubkey))
    return given
