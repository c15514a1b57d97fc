"""Every SQL statement on the hook ledger (inbox.db ``hook_runs``): one row per (event,
hook), inserted with the event, claimed before the process starts, settled after it ends.

A row is ``pending`` (due at ``due_at``), ``running`` (claimed; a crash leaves it so and
start-up makes it pending again), ``done`` (never runs again) or ``failed`` (gave up).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from tidemesh.daemon.records import Event


@dataclass(frozen=True, slots=True)
class Run:
    """A claimed run and the event it is for (None when retention removed the event)."""

    event_id: int
    hook: str
    event_key: str
    failures: int
    event: Event | None


def add_runs(conn: sqlite3.Connection, event_id: int, event_key: str, hooks: Iterable[str],
             now: int) -> None:
    """Record the pending runs of a new event, in the transaction that inserts the event."""
    conn.executemany(
        "INSERT INTO hook_runs (event_id, hook, event_key, state, due_at, created_at)"
        " VALUES (?, ?, ?, 'pending', ?, ?)",
        [(event_id, h, event_key, now, now) for h in hooks])


def recover(conn: sqlite3.Connection) -> int:
    """At start-up: runs a crash interrupted are due again (same event, same key)."""
    return conn.execute("UPDATE hook_runs SET state = 'pending', started_at = NULL"
                        " WHERE state = 'running'").rowcount


def claim_due(conn: sqlite3.Connection, now: int, limit: int) -> list[Run]:
    """Mark up to ``limit`` due runs started (committed before any process starts)."""
    rows = conn.execute(
        "SELECT r.event_id, r.hook, r.event_key, r.failures, e.type, e.data, e.created_at"
        " FROM hook_runs r LEFT JOIN events e ON e.id = r.event_id"
        " WHERE r.state = 'pending' AND r.due_at <= ? ORDER BY r.due_at, r.event_id LIMIT ?",
        (now, limit)).fetchall()
    conn.executemany("UPDATE hook_runs SET state = 'running', started_at = ?"
                     " WHERE event_id = ? AND hook = ?", [(now, r[0], r[1]) for r in rows])
    return [Run(r[0], r[1], r[2], r[3],
                None if r[4] is None else Event(r[0], r[4], orjson.loads(r[5]), r[6]))
            for r in rows]


def next_due(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT MIN(due_at) FROM hook_runs WHERE state = 'pending'").fetchone()
    return None if row[0] is None else int(row[0])


def finish(conn: sqlite3.Connection, run: Run, state: str, now: int, exit_code: int | None,
           error: str | None = None, due_at: int | None = None) -> None:
    """Settle a claimed run: ``done``, ``failed``, or ``pending`` again at ``due_at``."""
    failures = run.failures + (0 if state == "done" else 1)
    conn.execute(
        "UPDATE hook_runs SET state = ?, failures = ?, finished_at = ?, exit_code = ?,"
        " last_error = ?, due_at = COALESCE(?, due_at) WHERE event_id = ? AND hook = ?",
        (state, failures, now, exit_code, error, due_at, run.event_id, run.hook))


def counts(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Runs per hook and state, for operators."""
    out: dict[str, dict[str, int]] = {}
    for hook, state, n in conn.execute(
            "SELECT hook, state, COUNT(*) FROM hook_runs GROUP BY hook, state"):
        out.setdefault(hook, {})[state] = n
    return out
