"""What a rebuilt inbox knows it handled before (inbox.db ``inbox_meta``): a member whose inbox
is new (``daemon recover`` moved a damaged one aside, ``daemon restore`` wrote a fresh home,
the file was lost) gets its retained history from the broker again, acknowledged messages
included. Those acknowledged ones were handled by the inbox before: they are stored again
for reading, but fire no event and no hook, and named consumers start past them.

- ``handled_epoch`` / ``handled_seq``: the broker's acknowledged position (``resume_ack``'s
  ``acked_seq``) when this inbox first resumed, with nothing stored yet;
- ``handled_inbox_seq``: the last inbox seq stored at or before that position, where a
  named consumer (or agent session) new to this inbox starts.
"""

from __future__ import annotations

import sqlite3

_EPOCH, _SEQ, _INBOX = "handled_epoch", "handled_seq", "handled_inbox_seq"


def _set(conn: sqlite3.Connection, key: str, value: int, now: int) -> None:
    conn.execute("INSERT INTO inbox_meta (key, value, updated_at) VALUES (?, ?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                 " updated_at = excluded.updated_at", (key, value, now))


def record(conn: sqlite3.Connection, epoch: int, acked_seq: int, now: int) -> bool:
    """Take the broker's acknowledged position as handled, only while this inbox has stored
    nothing from the broker (a kept inbox knows what it handled); True when taken."""
    if acked_seq <= 0 or conn.execute("SELECT 1 FROM receive_cursor").fetchone():
        return False
    held = mark(conn)
    if held is not None and held >= (epoch, acked_seq):
        return False
    _set(conn, _EPOCH, epoch, now)
    _set(conn, _SEQ, acked_seq, now)
    return True


def mark(conn: sqlite3.Connection) -> tuple[int, int] | None:
    """The broker position up to which deliveries were handled before this inbox, if any."""
    rows = dict(conn.execute("SELECT key, value FROM inbox_meta WHERE key IN (?, ?)",
                             (_EPOCH, _SEQ)).fetchall())
    if _EPOCH not in rows or _SEQ not in rows:
        return None
    return int(rows[_EPOCH]), int(rows[_SEQ])


def stored_through(conn: sqlite3.Connection, inbox_seq: int, now: int) -> None:
    """A handled delivery was stored again at ``inbox_seq``."""
    if inbox_seq > start(conn):
        _set(conn, _INBOX, inbox_seq, now)


def start(conn: sqlite3.Connection) -> int:
    """Where a named consumer new to this inbox starts: past what was handled before it."""
    row = conn.execute("SELECT value FROM inbox_meta WHERE key = ?", (_INBOX,)).fetchone()
    return 0 if row is None else int(row[0])
