"""A receiving program for fault runs: a durable named consumer that persists, then acks.

Run as its own process (``python -m tests.faults.consumer SOCKET OUTCOMES NAME CRASHFLAG``) so
the harness can kill it, and so it can crash for real: when the file CRASHFLAG appears, the
program deletes it and exits after persisting a batch and before acking it. It is idempotent
the way DESIGN §6 asks a program to be: its outcome and the last inbox seq it handled commit in
one transaction, and entries at or below that seq are skipped when the daemon hands them out
again. Every handout is counted, so the checker can tell a redelivery from a double process.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from tidemesh.client import Client
from tidemesh.core.errors import TidemeshError

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), last_seq INTEGER);
CREATE TABLE IF NOT EXISTS processed (
    seq INTEGER NOT NULL, sender TEXT NOT NULL, client_message_id TEXT NOT NULL, body TEXT);
CREATE TABLE IF NOT EXISTS handouts (seq INTEGER NOT NULL);
INSERT OR IGNORE INTO state VALUES (1, 0);
"""


def open_outcomes(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(SCHEMA)
    return conn


def persist(conn: sqlite3.Connection, items: list[dict[str, Any]]) -> int:
    """Record a batch's outcome and the new last seq in one transaction; returns the last seq."""
    conn.execute("BEGIN IMMEDIATE")
    (last,) = conn.execute("SELECT last_seq FROM state").fetchone()
    for item in items:
        conn.execute("INSERT INTO handouts VALUES (?)", (item["seq"],))
        if item["seq"] <= last:
            continue
        conn.execute("INSERT INTO processed VALUES (?, ?, ?, ?)",
                     (item["seq"], item["from"], item["client_message_id"], item["body"]))
        last = item["seq"]
    conn.execute("UPDATE state SET last_seq = ?", (last,))
    conn.execute("COMMIT")
    return int(last)


def run(socket_path: Path, outcomes: Path, name: str, crash_flag: Path) -> None:
    client = Client(socket_path, timeout=5.0)
    conn = open_outcomes(outcomes)
    while True:
        try:
            page = client.inbox(consumer=name, limit=200)
        except TidemeshError:
            time.sleep(0.1)  # the daemon is down or restarting; the cursor waits for us
            continue
        items = page["items"]
        if not items:
            time.sleep(0.05)
            continue
        last = persist(conn, items)
        if crash_flag.exists():
            crash_flag.unlink()
            os._exit(3)  # processed, not acked: the daemon must hand these out again
        try:
            client.ack(name, last)
        except TidemeshError:
            time.sleep(0.1)


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
