"""Many rows in one statement (storage/multirow.py), on a real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tidemesh.storage.multirow import MAX_ROWS, insert_rows


def test_rows_past_one_statement_all_land_in_order_and_conflicts_count_nothing(
    tmp_path: Path
) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER, tag TEXT)")
    rows = [(f"k{i}", i) for i in range(2 * MAX_ROWS + 7)]
    head, tail = "INSERT INTO t (k, n, tag) VALUES ", " ON CONFLICT (k) DO NOTHING"
    assert insert_rows(conn, head, rows, tail, group="(?, ?, 'new')") == len(rows)
    again = [("k3", -1), ("fresh", -2)]
    assert insert_rows(conn, head, again, tail, group="(?, ?, 'new')") == 1
    stored = conn.execute("SELECT k, n, tag FROM t ORDER BY rowid").fetchall()
    assert stored == [(k, n, "new") for k, n in [*rows, ("fresh", -2)]]
    assert insert_rows(conn, head, [], tail) == 0
