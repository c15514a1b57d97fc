"""Shared files (PostgreSQL): ``mesh.file_object`` rows and their ``mesh.file_chunk`` bytea
rows; each write one short transaction on the pool, the file's row locked (``FOR UPDATE``) so
that an upload resumed on another connection cannot interleave with the one it replaces."""

from __future__ import annotations

from typing import Any

from tidemesh.broker.store.files import (
    ROW_COLUMNS,
    FileLimits,
    FileRow,
    NewFile,
    check_complete,
    check_open,
    check_put,
)
from tidemesh.broker.store.postgres.base import PostgresBase

_ROW = f"SELECT {ROW_COLUMNS} FROM mesh.file_object WHERE mesh_id = $1 AND id = $2"  # noqa: S608


_PUT = (
    "WITH c AS (INSERT INTO mesh.file_chunk (mesh_id, file_id, seq, data)"  # noqa: S608
    " VALUES ($1, $2, $3, $4) RETURNING octet_length(data) AS n)"
    " UPDATE mesh.file_object SET stored_chunks = stored_chunks + 1,"
    " stored_bytes = stored_bytes + (SELECT n FROM c) WHERE mesh_id = $1 AND id = $2"
    f" RETURNING {ROW_COLUMNS}")


async def _row(conn: Any, mesh_id: str, file_id: str, lock: bool = False) -> FileRow | None:
    r = await conn.fetchrow(_ROW + (" FOR UPDATE" if lock else ""), mesh_id, file_id)
    return None if r is None else FileRow.of_record(tuple(r))


async def _must(conn: Any, mesh_id: str, file_id: str) -> FileRow:
    row = await _row(conn, mesh_id, file_id)
    assert row is not None
    return row


class Files(PostgresBase):
    async def file_open(self, new: NewFile, limits: FileLimits, now_ms: int) -> FileRow:
        async with self.pool.acquire() as conn, conn.transaction():
            # One member's opens one at a time: the quota is read and spent atomically.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"file:{new.mesh_id}:{new.owner_pubkey}")
            existing = await _row(conn, new.mesh_id, new.id, lock=True)
            used = await conn.fetchval(
                "SELECT COALESCE(SUM(size), 0) FROM mesh.file_object WHERE mesh_id = $1"
                " AND owner_pubkey = $2", new.mesh_id, new.owner_pubkey)
            if check_open(new, existing, int(used), limits):
                await conn.execute(
                    "INSERT INTO mesh.file_object (mesh_id, id, owner_pubkey, size, chunk_size,"
                    " chunks, sealed, persistent, created_at, expires_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    new.mesh_id, new.id, new.owner_pubkey, new.size, new.chunk_size,
                    new.chunks, new.sealed, new.persistent, now_ms,
                    None if new.persistent else now_ms + limits.retention_ms)
            elif existing is not None and new.persistent and not existing.persistent:
                await conn.execute("UPDATE mesh.file_object SET persistent = true,"
                                   " expires_at = NULL WHERE mesh_id = $1 AND id = $2",
                                   new.mesh_id, new.id)
            return await _must(conn, new.mesh_id, new.id)

    async def file_put(self, mesh_id: str, file_id: str, owner: str, seq: int,
                       data: bytes) -> FileRow:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await _row(conn, mesh_id, file_id, lock=True)
            if not check_put(row, owner, seq, len(data)):
                assert row is not None
                return row
            # One round trip for the chunk and its count: a statement per chunk is what an
            # upload's rate is made of.
            r = await conn.fetchrow(_PUT, mesh_id, file_id, seq, data)
            return FileRow.of_record(tuple(r))

    async def file_complete(self, mesh_id: str, file_id: str, owner: str,
                            now_ms: int) -> FileRow:
        async with self.pool.acquire() as conn, conn.transaction():
            check_complete(await _row(conn, mesh_id, file_id, lock=True), owner)
            await conn.execute("UPDATE mesh.file_object SET complete_at ="
                               " COALESCE(complete_at, $1) WHERE mesh_id = $2 AND id = $3",
                               now_ms, mesh_id, file_id)
            return await _must(conn, mesh_id, file_id)

    async def file_row(self, mesh_id: str, file_id: str) -> FileRow | None:
        return await _row(self.pool, mesh_id, file_id)

    async def file_chunk(self, mesh_id: str, file_id: str, seq: int) -> bytes | None:
        data = await self.pool.fetchval("SELECT data FROM mesh.file_chunk WHERE mesh_id = $1"
                                        " AND file_id = $2 AND seq = $3", mesh_id, file_id, seq)
        return None if data is None else bytes(data)

    async def delete_expired_files(self, now_ms: int) -> int:
        # Part of the retention sweep: without the command timeout (``retention.py``).
        async with self.db.unbounded() as conn, conn.transaction():
            gone = await conn.fetch("DELETE FROM mesh.file_object WHERE expires_at IS NOT NULL"
                                    " AND expires_at < $1 RETURNING mesh_id, id", now_ms)
            if gone:
                await conn.execute(
                    "DELETE FROM mesh.file_chunk c USING unnest($1::text[], $2::text[])"
                    " AS g(mesh_id, id) WHERE c.mesh_id = g.mesh_id AND c.file_id = g.id",
                    [r[0] for r in gone], [r[1] for r in gone])
            return len(gone)
