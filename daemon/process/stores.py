"""Opening the daemon's two databases with their start-up recovery (DESIGN §4.4).

The outbox is authoritative: damage means refusing to start. The inbox is a cache the
broker can refill: damage means moving it aside and starting empty.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from tidemesh.daemon.store import outbox, search
from tidemesh.daemon.store.db import (
    INBOX_MIGRATIONS,
    OUTBOX_MIGRATIONS,
    Database,
    StoreDamaged,
    check_integrity,
    connect,
)

log = structlog.get_logger(__name__)

INFLIGHT_RETRY_DELAY_MS = 500


def _setup_outbox(path: Path, recover: bool) -> Callable[[sqlite3.Connection], None]:
    def setup(conn: sqlite3.Connection) -> None:
        check_integrity(conn, path)
        OUTBOX_MIGRATIONS.apply_sqlite(conn)
        if not recover:
            return
        conn.execute("BEGIN IMMEDIATE")
        n = outbox.reset_inflight(conn, int(time.time() * 1000), INFLIGHT_RETRY_DELAY_MS)
        conn.execute("COMMIT")
        if n:
            log.info("outbox_inflight_reset", rows=n)

    return setup


async def open_outbox(path: Path, batch_max: int, recover: bool = True) -> Database:
    """Open the outbox; ``recover`` resets rows a crash left inflight (daemon start-up only)."""
    try:
        return await Database.open(path, _setup_outbox(path, recover), batch_max)
    except sqlite3.DatabaseError as exc:
        raise StoreDamaged(f"{path} is not a readable SQLite database: {exc}") from exc


def _inbox_ok(path: Path) -> bool:
    if not path.exists():
        return True
    try:
        conn = connect(path)
    except sqlite3.DatabaseError:
        return False
    try:
        check_integrity(conn, path)
        return True
    except StoreDamaged:
        return False
    finally:
        conn.close()


def move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        if src.exists():
            src.rename(Path(str(target) + suffix))
    return target


async def open_inbox(path: Path, fts_enabled: bool = True) -> Database:
    """Open the inbox (moved aside first if damaged); ``fts_enabled`` ([inbox] fts_enabled)
    fills or empties the search index when it changed since the last start."""
    if not _inbox_ok(path):
        target = move_aside(path)
        log.warning("inbox_corruption_recovered", moved_to=str(target))

    def setup(conn: sqlite3.Connection) -> None:
        INBOX_MIGRATIONS.apply_sqlite(conn)
        started = time.monotonic()
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = search.configure(conn, fts_enabled, int(time.time() * 1000))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if done is not None:
            log.info("inbox_search_index_" + done,
                     took_ms=round((time.monotonic() - started) * 1000))

    return await Database.open(path, setup)
