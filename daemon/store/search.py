"""Every SQL statement of inbox search: the FTS5 index over text bodies (migration 0006),
switched on or off by ``[inbox] fts_enabled`` at each start, filled again on demand.

Inserts and deletes keep the index in step through the migration's triggers, in the same
transaction as the inbox row, whoever writes; this module only turns the index on (filling
it from the inbox), off (emptying it) or rebuilds it (``recover``)."""

from __future__ import annotations

import sqlite3
from typing import Literal

from tidemesh.core import search_query
from tidemesh.core.errors import InvalidRequest
from tidemesh.daemon.records import Page
from tidemesh.daemon.store import inbox

_FLAG = "fts_enabled"
# What the FTS5 query parser raises for a query it cannot read ("fts5: syntax error near",
# "unterminated string", "no such column: x" for a `x:` column filter, "unknown special
# query"): SQLITE_ERROR. A busy or failing database raises other codes and stays a 503.
_SQLITE_ERROR = 1


def enabled(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT value FROM inbox_meta WHERE key = ?", (_FLAG,)).fetchone()
    return row is not None and int(row[0]) == 1


def _set_flag(conn: sqlite3.Connection, on: bool, now_ms: int) -> None:
    conn.execute("INSERT INTO inbox_meta (key, value, updated_at) VALUES (?, ?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                 " updated_at = excluded.updated_at", (_FLAG, int(on), now_ms))


def rebuild(conn: sqlite3.Connection) -> None:
    """Index every text body of the inbox again, from nothing (the caller's transaction)."""
    conn.execute("INSERT INTO inbox_fts (inbox_fts) VALUES ('rebuild')")


def configure(conn: sqlite3.Connection, on: bool, now_ms: int
              ) -> Literal["filled", "emptied"] | None:
    """Make the index follow the setting, in the caller's transaction: turned on, it is filled
    from the inbox; turned off, it is emptied and the triggers stop feeding it (an index left
    behind would go stale, and be wrong when the setting comes back)."""
    if enabled(conn) == on:
        return None
    if on:
        rebuild(conn)
    else:
        conn.execute("INSERT INTO inbox_fts (inbox_fts) VALUES ('delete-all')")
    _set_flag(conn, on, now_ms)
    return "filled" if on else "emptied"


def check(conn: sqlite3.Connection) -> str | None:
    """None when the index agrees with the inbox, else SQLite's words (for ``recover``)."""
    if not enabled(conn):
        return None
    try:
        conn.execute("INSERT INTO inbox_fts (inbox_fts, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None


def query_error(conn: sqlite3.Connection, exc: sqlite3.OperationalError, q: str
                ) -> InvalidRequest | None:
    """The 400 for a search query FTS5 cannot read, or None for any other failure. The words
    are those of q parsed alone: the error of the wrapped expression may point at the
    wrapper's own parenthesis."""
    if getattr(exc, "sqlite_errorcode", None) != _SQLITE_ERROR:
        return None
    words = str(exc)
    try:
        conn.execute("SELECT 1 FROM inbox_fts WHERE inbox_fts MATCH ? LIMIT 1", (q,)).fetchone()
    except sqlite3.OperationalError as own:
        if getattr(own, "sqlite_errorcode", None) == _SQLITE_ERROR:
            words = search_query.user_words(str(own), q)
    return InvalidRequest(f"q is not a valid search query ({words}): {q[:80]!r}", field="q")


def page(conn: sqlite3.Connection, p: Page) -> inbox.Served:
    """``inbox.page`` with a search ``q``: a query FTS5 cannot parse is a 400."""
    try:
        return inbox.page(conn, p)
    except sqlite3.OperationalError as exc:
        bad = query_error(conn, exc, p.q) if p.q is not None else None
        if bad is None:
            raise
        raise bad from exc
