"""Shared files' side of the store port (docs/broker.md, "Files"): a file row and its chunk
rows, in tables of their own (``file_object``, ``file_chunk``), and the rules an upload
follows, decided without I/O so that both adapters apply the same ones.

Chunks arrive in order: the file row counts those stored (``stored_chunks``), which is where
an interrupted upload resumes. A chunk already stored is taken again as a no-op (a retry after
a lost answer); one past the next is refused. A file is fetchable once complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidemesh.core.errors import Conflict, InvalidRequest, NotFound
from tidemesh.core.files import SEALED_OVERHEAD, FileTooLarge


@dataclass(frozen=True, slots=True)
class FileLimits:
    max_bytes: int           # files.max_bytes: the largest file
    member_quota_bytes: int  # files.member_quota_bytes: all of one member's files at once
    retention_ms: int        # files.retention_days: how long a file not persistent is kept


@dataclass(frozen=True, slots=True)
class NewFile:
    mesh_id: str
    id: str
    owner_pubkey: str
    size: int
    chunk_size: int
    chunks: int
    sealed: bool
    persistent: bool


@dataclass(frozen=True, slots=True)
class FileRow:
    owner_pubkey: str
    size: int
    chunk_size: int
    chunks: int
    sealed: bool
    persistent: bool
    stored_chunks: int
    complete: bool

    @classmethod
    def of_record(cls, r: Sequence[Any]) -> FileRow:
        """A row of either store's ``ROW_SQL`` columns, in order."""
        return cls(str(r[0]), int(r[1]), int(r[2]), int(r[3]), bool(r[4]), bool(r[5]),
                   int(r[6]), r[7] is not None)

    def state(self) -> dict[str, Any]:
        return {"have": self.stored_chunks, "complete": self.complete}


ROW_COLUMNS = ("owner_pubkey, size, chunk_size, chunks, sealed, persistent, stored_chunks,"
               " complete_at")


def check_open(new: NewFile, existing: FileRow | None, used_bytes: int,
               limits: FileLimits) -> bool:
    """Whether ``new`` is a new row to insert (True) or the same upload again (False);
    raises what the broker answers otherwise."""
    if new.size > limits.max_bytes:
        raise FileTooLarge(f"the file has {new.size} bytes, over this broker's limit of "
                           f"{limits.max_bytes} (files.max_bytes)", limit=limits.max_bytes,
                           setting="files.max_bytes")
    if existing is not None:
        same = (existing.owner_pubkey, existing.size, existing.chunk_size, existing.sealed) == (
            new.owner_pubkey, new.size, new.chunk_size, new.sealed)
        if not same:
            raise Conflict("another upload holds this file id", reason="file_id_taken")
        return False
    if used_bytes + new.size > limits.member_quota_bytes:
        raise FileTooLarge(f"this member stores {used_bytes} bytes of files; {new.size} more "
                           f"would pass its quota of {limits.member_quota_bytes} "
                           "(files.member_quota_bytes)", limit=limits.member_quota_bytes,
                           setting="files.member_quota_bytes", used=used_bytes)
    return True


def owned(row: FileRow | None, owner: str) -> FileRow:
    """The row of an upload by ``owner``; another member's upload is as unknown as none."""
    if row is None or row.owner_pubkey != owner:
        raise NotFound("no upload of this file by this member; open it first",
                       reason="file_unknown")
    return row


def check_complete(row: FileRow | None, owner: str) -> None:
    row = owned(row, owner)
    if row.stored_chunks != row.chunks:
        raise Conflict(f"the upload has {row.stored_chunks} of {row.chunks} chunks",
                       reason="file_incomplete", have=row.stored_chunks)


def check_put(row: FileRow | None, owner: str, seq: int, size: int) -> bool:
    """Whether chunk ``seq`` of ``size`` bytes is to be stored (True) or is stored already
    (False); raises for anything an upload in order never sends."""
    row = owned(row, owner)
    if seq < row.stored_chunks:
        return False
    if seq != row.stored_chunks:
        raise Conflict(f"chunk {seq} is ahead of the upload, which has {row.stored_chunks}",
                       reason="chunk_out_of_order", have=row.stored_chunks)
    expected = min(row.chunk_size, row.size - seq * row.chunk_size) + (
        SEALED_OVERHEAD if row.sealed else 0)
    if seq >= row.chunks or size != expected:
        raise InvalidRequest(f"chunk {seq} has {size} bytes; the file's chunk {seq} has "
                             f"{expected}", field="data")
    return True


def check_fetch(row: FileRow | None, seq: int) -> None:
    if row is None or not row.complete:
        raise NotFound("no such file at the broker (never shared, not yet complete, or "
                       "removed by retention)", reason="file_unknown")
    if not 0 <= seq < row.chunks:
        raise InvalidRequest(f"the file has chunks 0-{row.chunks - 1}", field="seq")


class FileStore(Protocol):
    """The file methods both store adapters have."""

    async def file_open(self, new: NewFile, limits: FileLimits, now_ms: int) -> FileRow: ...

    async def file_put(self, mesh_id: str, file_id: str, owner: str, seq: int,
                       data: bytes) -> FileRow: ...

    async def file_complete(self, mesh_id: str, file_id: str, owner: str,
                            now_ms: int) -> FileRow: ...

    async def file_row(self, mesh_id: str, file_id: str) -> FileRow | None: ...

    async def file_chunk(self, mesh_id: str, file_id: str, seq: int) -> bytes | None: ...

    async def delete_expired_files(self, now_ms: int) -> int: ...
