"""Every SQL statement on inbox.db's ``files`` table: the files this member shared and those
announced to it (core/files.py), and the ``file_shared`` event of a received one, written in
the transaction that stores its announcement."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import Any

from tidemesh.core.files import FileMeta, parse_meta
from tidemesh.daemon.store.inbox import (
    Delivery,
    NewEvent,
    StoreResult,
    Void,
    add_event,
    store_frame,
)
from tidemesh.storage.engine import BatchOp

_COLUMNS = ("id, direction, name, size, sha256, chunk_size, file_key, persistent, sender_pubkey,"
            " dest_kind, dest_ref, message, inbox_seq, created_at")


@dataclasses.dataclass(frozen=True, slots=True)
class FileRecord:
    meta: FileMeta
    direction: str
    sender_pubkey: str
    dest_kind: str
    dest_ref: str
    message: str | None
    created_at: int

    def view(self) -> dict[str, Any]:
        return {**self.meta.view(), "direction": self.direction, "from": self.sender_pubkey,
                "to": {"kind": self.dest_kind, "ref": self.dest_ref},
                "message": self.message, "created_at": self.created_at}


def _record(r: Sequence[Any]) -> FileRecord:
    return FileRecord(FileMeta(r[0], r[2], int(r[3]), r[4], int(r[5]), r[6], bool(r[7])),
                      r[1], r[8], r[9], r[10], r[11], int(r[13]))


def insert(conn: sqlite3.Connection, rec: FileRecord, inbox_seq: int | None = None) -> bool:
    """Record a file once per direction; False when it was recorded already."""
    m = rec.meta
    cur = conn.execute(
        f"INSERT OR IGNORE INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"  # noqa: S608
        " ?)", (m.id, rec.direction, m.name, m.size, m.sha256, m.chunk_size, m.key,
                int(m.persistent), rec.sender_pubkey, rec.dest_kind, rec.dest_ref, rec.message,
                inbox_seq, rec.created_at))
    return cur.rowcount > 0


def find(conn: sqlite3.Connection, file_id: str) -> FileRecord | None:
    """The file by id; announced to this member first, else shared by it."""
    r = conn.execute(f"SELECT {_COLUMNS} FROM files WHERE id = ?"  # noqa: S608
                     " ORDER BY direction = 'received' DESC LIMIT 1", (file_id,)).fetchone()
    return None if r is None else _record(r)


def page(conn: sqlite3.Connection, limit: int) -> list[dict[str, Any]]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM files"  # noqa: S608
                        " ORDER BY created_at DESC, id LIMIT ?", (limit,)).fetchall()
    return [_record(r).view() for r in rows]


def prune(conn: sqlite3.Connection, before_ms: int, dry_run: bool = False) -> int:
    """Forget the files recorded before ``before_ms`` (the inbox's retention): a received
    one's announcement is gone by then, and the broker's copy lasts files.retention_days
    unless persistent. A partial download beside its ``out`` is the user's to keep."""
    if dry_run:
        return int(conn.execute("SELECT COUNT(*) FROM files WHERE created_at < ?",
                                (before_ms,)).fetchone()[0])
    return conn.execute("DELETE FROM files WHERE created_at < ?", (before_ms,)).rowcount


def record_received(conn: sqlite3.Connection, items: Sequence[Delivery | Void],
                    results: list[StoreResult | None], hooks: tuple[str, ...] = ()
                    ) -> list[StoreResult | None]:
    """For each newly stored delivery that announces a file: its row, and a ``file_shared``
    event after its ``message`` event (carried in the result's ``extra``), with the
    ``hooks`` it fires recorded."""
    out = list(results)
    for n, (d, res) in enumerate(zip(items, results, strict=True)):
        if isinstance(d, Void) or res is None or res.inbox_seq is None:
            continue
        fm = parse_meta(d.meta)
        if fm is None:
            continue
        message = d.body.decode("utf-8", "replace") if d.body_encoding == "utf8" else None
        rec = FileRecord(fm, "received", d.sender_pubkey, d.dest_kind, d.dest_ref, message,
                         d.received_at)
        # A message handled before a rebuild (no event) had its file offered then.
        if not insert(conn, rec, res.inbox_seq) or res.event is None:
            continue
        ev = add_event(conn, NewEvent(
            "file_shared", {**rec.view(), "inbox_seq": res.inbox_seq, "message_id": d.id},
            d.received_at, f"file_shared:{fm.id}:{d.sender_pubkey}", hooks))
        if ev is not None:
            out[n] = dataclasses.replace(res, extra=(ev,))
    return out


Frame = tuple[Sequence[Delivery | Void], tuple[str, ...]]


def _store_frames(conn: sqlite3.Connection, frames: Sequence[Frame]
                  ) -> list[list[StoreResult | None]]:
    return [record_received(conn, f, store_frame(conn, f), hooks) for f, hooks in frames]


# The inbox's frames with the files the frames announce, in the same transaction; each
# frame comes with the hooks a ``file_shared`` event fires.
STORE_FRAMES = BatchOp("inbox_store_frames", _store_frames)
