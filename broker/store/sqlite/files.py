"""Shared files (SQLite): ``file_object`` rows and their ``file_chunk`` rows, each write one
transaction on the store's one writer."""

from __future__ import annotations

import sqlite3

from tidemesh.broker.store.files import (
    ROW_COLUMNS,
    FileLimits,
    FileRow,
    NewFile,
    check_complete,
    check_open,
    check_put,
)
from tidemesh.broker.store.sqlite.base import SqliteBase

_ROW = f"SELECT {ROW_COLUMNS} FROM file_object WHERE mesh_id = ? AND id = ?"  # noqa: S608


def _row(conn: sqlite3.Connection, mesh_id: str, file_id: str) -> FileRow | None:
    r = conn.execute(_ROW, (mesh_id, file_id)).fetchone()
    return None if r is None else FileRow.of_record(r)


def _open(conn: sqlite3.Connection, new: NewFile, limits: FileLimits, now: int) -> FileRow:
    existing = _row(conn, new.mesh_id, new.id)
    used = conn.execute("SELECT COALESCE(SUM(size), 0) FROM file_object WHERE mesh_id = ?"
                        " AND owner_pubkey = ?", (new.mesh_id, new.owner_pubkey)).fetchone()[0]
    if check_open(new, existing, int(used), limits):
        conn.execute(
            "INSERT INTO file_object (mesh_id, id, owner_pubkey, size, chunk_size, chunks,"
            " sealed, persistent, created_at, complete_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (new.mesh_id, new.id, new.owner_pubkey, new.size, new.chunk_size, new.chunks,
             int(new.sealed), int(new.persistent), now, None,
             None if new.persistent else now + limits.retention_ms))
    elif existing is not None and new.persistent and not existing.persistent:
        # Shared again as persistent: it now outlives its retention.
        conn.execute("UPDATE file_object SET persistent = 1, expires_at = NULL"
                     " WHERE mesh_id = ? AND id = ?", (new.mesh_id, new.id))
    row = _row(conn, new.mesh_id, new.id)
    assert row is not None
    return row


def _put(conn: sqlite3.Connection, mesh_id: str, file_id: str, owner: str, seq: int,
         data: bytes) -> FileRow:
    row = _row(conn, mesh_id, file_id)
    if check_put(row, owner, seq, len(data)):
        conn.execute("INSERT INTO file_chunk (mesh_id, file_id, seq, data) VALUES (?, ?, ?, ?)",
                     (mesh_id, file_id, seq, data))
        conn.execute("UPDATE file_object SET stored_chunks = stored_chunks + 1,"
                     " stored_bytes = stored_bytes + ? WHERE mesh_id = ? AND id = ?",
                     (len(data), mesh_id, file_id))
        row = _row(conn, mesh_id, file_id)
    assert row is not None
    return row


def _complete(conn: sqlite3.Connection, mesh_id: str, file_id: str, owner: str,
              now: int) -> FileRow:
    check_complete(_row(conn, mesh_id, file_id), owner)
    conn.execute("UPDATE file_object SET complete_at = COALESCE(complete_at, ?)"
                 " WHERE mesh_id = ? AND id = ?", (now, mesh_id, file_id))
    done = _row(conn, mesh_id, file_id)
    assert done is not None
    return done


def _delete_expired(conn: sqlite3.Connection, now: int) -> int:
    gone = conn.execute("SELECT mesh_id, id FROM file_object WHERE expires_at IS NOT NULL"
                        " AND expires_at < ?", (now,)).fetchall()
    for mesh_id, file_id in gone:
        conn.execute("DELETE FROM file_chunk WHERE mesh_id = ? AND file_id = ?",
                     (mesh_id, file_id))
        conn.execute("DELETE FROM file_object WHERE mesh_id = ? AND id = ?", (mesh_id, file_id))
    return len(gone)


class Files(SqliteBase):
    async def file_open(self, new: NewFile, limits: FileLimits, now_ms: int) -> FileRow:
        return await self._write(lambda c: _open(c, new, limits, now_ms))

    async def file_put(self, mesh_id: str, file_id: str, owner: str, seq: int,
                       data: bytes) -> FileRow:
        return await self._write(lambda c: _put(c, mesh_id, file_id, owner, seq, data))

    async def file_complete(self, mesh_id: str, file_id: str, owner: str,
                            now_ms: int) -> FileRow:
        return await self._write(lambda c: _complete(c, mesh_id, file_id, owner, now_ms))

    async def file_row(self, mesh_id: str, file_id: str) -> FileRow | None:
        return await self._read(lambda c: _row(c, mesh_id, file_id))

    async def file_chunk(self, mesh_id: str, file_id: str, seq: int) -> bytes | None:
        def fn(conn: sqlite3.Connection) -> bytes | None:
            r = conn.execute("SELECT data FROM file_chunk WHERE mesh_id = ? AND file_id = ?"
                             " AND seq = ?", (mesh_id, file_id, seq)).fetchone()
            return None if r is None else bytes(r[0])

        return await self._read(fn)

    async def delete_expired_files(self, now_ms: int) -> int:
        return await self._write(lambda c: _delete_expired(c, now_ms))
