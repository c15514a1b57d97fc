"""Every SQL statement of the retention sweeps, on outbox.db and inbox.db.

Each ``*_step`` function does one small batch and is run by the writer inside its own
transaction (group-committed with whatever else is queued), so a sweep of a million rows is a
long series of short transactions that never holds the writer for long. A step walks forward
from a keyset cursor, so rows that must stay are read once per sweep, not once per batch.
``dry_run`` counts what a step would delete and deletes nothing.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from tidemesh.core.retention import (
    ChainRow,
    InboxPolicy,
    OutboxPolicy,
    chain_expired,
    losses,
)
from tidemesh.daemon.store import outbox

EVENTS_PRUNED_THROUGH = "events_pruned_through"


@dataclass(slots=True)
class Cursor:
    """Where an outbox sweep is: the status being walked and the last (time, id) seen."""

    status: str = "done"
    after_time: int = -1
    after_id: str = ""
    seen: set[str] = field(default_factory=set)   # chain rows already decided this sweep


_STATUS_ORDER = ("done", "aborted", "dead")


def _chain_rows(conn: sqlite3.Connection, ids: list[str]) -> list[ChainRow]:
    marks = ",".join("?" * len(ids))
    return [ChainRow(r[0], r[1], r[2], r[3]) for r in conn.execute(
        f"SELECT id, status, enqueued_at, dead_at FROM outbox WHERE id IN ({marks})",  # noqa: S608
        ids)]


def _candidates(conn: sqlite3.Connection, cur: Cursor, policy: OutboxPolicy, now_ms: int,
                limit: int) -> list[sqlite3.Row]:
    if cur.status == "dead":
        # Few rows: the status prefix of outbox_pending finds them all.
        return conn.execute(
            "SELECT id, enqueued_at AS t, supersedes, superseded_by FROM outbox"
            " WHERE status = 'dead' AND COALESCE(dead_at, enqueued_at) < ?"
            " AND id > ? ORDER BY id LIMIT ?",
            (policy.dead_cutoff(now_ms), cur.after_id, limit)).fetchall()
    return conn.execute(
        "SELECT id, enqueued_at AS t, supersedes, superseded_by FROM outbox"
        " WHERE status = ? AND status IN ('done', 'aborted') AND enqueued_at < ?"
        " AND (enqueued_at > ? OR (enqueued_at = ? AND id > ?))"
        " ORDER BY enqueued_at, id LIMIT ?",
        (cur.status, policy.settled_cutoff(now_ms), cur.after_time, cur.after_time,
         cur.after_id, limit)).fetchall()


def outbox_step(conn: sqlite3.Connection, cur: Cursor, policy: OutboxPolicy, now_ms: int,
                limit: int, dry_run: bool = False) -> tuple[int, bool]:
    """Delete up to about ``limit`` expired rows; returns (rows deleted, sweep finished)."""
    while True:
        rows = _candidates(conn, cur, policy, now_ms, limit)
        if rows:
            break
        nxt = _STATUS_ORDER.index(cur.status) + 1
        if nxt == len(_STATUS_ORDER):
            return 0, True
        cur.status, cur.after_time, cur.after_id = _STATUS_ORDER[nxt], -1, ""
    last = rows[-1]
    cur.after_time = last["t"] if cur.status != "dead" else -1
    cur.after_id = last["id"]
    doomed: list[str] = []
    for r in rows:
        if r["id"] in cur.seen:
            continue
        if r["supersedes"] is None and r["superseded_by"] is None:
            doomed.append(r["id"])
            continue
        ids = outbox.chain(conn, r["id"])
        cur.seen.update(ids)
        if chain_expired(_chain_rows(conn, ids), policy, now_ms):
            doomed.extend(ids)
    if doomed and not dry_run:
        # One statement per batch: links inside a chain are checked at its end, so a chain
        # deleted together never trips its own foreign keys.
        marks = ",".join("?" * len(doomed))
        conn.execute(f"DELETE FROM outbox WHERE id IN ({marks})", doomed)  # noqa: S608
    return len(doomed), False


def _meta(conn: sqlite3.Connection, key: str) -> int | None:
    row = conn.execute("SELECT value FROM inbox_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else int(row[0])


def _set_meta(conn: sqlite3.Connection, key: str, value: int, now_ms: int) -> None:
    conn.execute("INSERT INTO inbox_meta (key, value, updated_at) VALUES (?, ?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                 " updated_at = excluded.updated_at", (key, value, now_ms))


def events_pruned_through(conn: sqlite3.Connection) -> int:
    """The highest event id retention has removed (0: none)."""
    return _meta(conn, EVENTS_PRUNED_THROUGH) or 0


def events_step(conn: sqlite3.Connection, after_id: int, policy: InboxPolicy, now_ms: int,
                limit: int, dry_run: bool = False) -> tuple[int, int, bool]:
    """Cut the event log's oldest events: always a prefix, so that a stream resuming from any
    id that is still kept misses nothing. Returns (events deleted, last id, sweep finished)."""
    rows = conn.execute("SELECT id, created_at FROM events WHERE id > ? ORDER BY id LIMIT ?",
                        (after_id, limit)).fetchall()
    cutoff = policy.events_cutoff(now_ms)
    through = None
    for r in rows:
        if r[1] >= cutoff:
            break
        through = int(r[0])
    if through is None:
        return 0, after_id, True
    n = sum(1 for r in rows if r[0] <= through)
    if not dry_run:
        conn.execute("DELETE FROM events WHERE id <= ?", (through,))
        conn.execute("DELETE FROM hook_runs WHERE event_id <= ?", (through,))
        _set_meta(conn, EVENTS_PRUNED_THROUGH, max(through, events_pruned_through(conn)),
                  now_ms)
    return n, through, n < limit


def _min_cursor(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT MIN(cursor) FROM consumers").fetchone()
    return None if row[0] is None else int(row[0])


@dataclass(slots=True)
class InboxCursor:
    """The last (received_at, seq) an inbox sweep has looked at."""

    after_time: int = -1
    after_seq: int = 0


def inbox_step(conn: sqlite3.Connection, cur: InboxCursor, policy: InboxPolicy, now_ms: int,
               limit: int, dry_run: bool = False) -> tuple[int, bool]:
    """Delete up to ``limit`` expired entries, charging each consumer that had not acked
    them. Walks inbox_received from the oldest. Returns (deleted, sweep finished)."""
    min_cursor = _min_cursor(conn)
    args: list[int] = [policy.cutoff(now_ms), cur.after_time, cur.after_time, cur.after_seq]
    held = ""
    if min_cursor is not None:
        held = " AND (seq <= ? OR received_at < ?)"
        args += [min_cursor, policy.hold_cutoff(now_ms)]
    sql = ("SELECT seq, received_at FROM inbox WHERE received_at < ?"  # noqa: S608 - fixed
           " AND (received_at > ? OR (received_at = ? AND seq > ?))"
           f"{held} ORDER BY received_at, seq LIMIT ?")
    rows = conn.execute(sql, (*args, limit)).fetchall()
    if not rows:
        return 0, True
    cur.after_time, cur.after_seq = int(rows[-1][1]), int(rows[-1][0])
    seqs = [int(r[0]) for r in rows]
    if not dry_run:
        marks = ",".join("?" * len(seqs))
        # Events normally went first (their retention is never longer); one that is still
        # here keeps its copy of the entry and loses only the link.
        conn.execute(f"UPDATE events SET inbox_seq = NULL WHERE inbox_seq IN ({marks})",  # noqa: S608
                     seqs)
        conn.execute(f"DELETE FROM inbox WHERE seq IN ({marks})", seqs)  # noqa: S608
        cursors = {r[0]: int(r[1]) for r in conn.execute("SELECT name, cursor FROM consumers")}
        for name, loss in losses(seqs, cursors).items():
            conn.execute(
                "UPDATE consumers SET lost_count = lost_count + ?,"
                " lost_through = MAX(COALESCE(lost_through, 0), ?) WHERE name = ?",
                (loss.count, loss.through_seq, name))
    return len(seqs), len(seqs) < limit


def _free_pages(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA freelist_count").fetchone()[0])


def vacuum_step(conn: sqlite3.Connection, pages: int) -> int:
    """Return up to ``pages`` free pages to the file system; returns how many are left."""
    # The sqlite3 module steps a pragma statement once, and each step of incremental_vacuum
    # frees one page whatever its argument, so a page is one statement here.
    for _ in range(min(pages, _free_pages(conn))):
        conn.execute("PRAGMA incremental_vacuum(1)")
    return _free_pages(conn)
