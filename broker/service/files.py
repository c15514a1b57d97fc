"""Shared files (docs/broker.md, "Files"): the upload of a file's chunks, in order, and the
fetch of a complete file's chunks by any member of its mesh.

Flow control is the connection's: these frames are handled one at a time, before the next
frame is read (``routes``), so an uploading daemon is held back by TCP while the store
writes, and a fetching one gets at most as many ``file_data`` frames queued as it has
fetches in flight (the daemon keeps a small window). Who may fetch: any member of the mesh
that knows the file id (128 random-looking bits that only its announcement carries); a DM's
file is sealed for its recipient, so other members fetch only ciphertext.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tidemesh.broker.service.connections import Conn, now_ms
from tidemesh.broker.store.base import Store
from tidemesh.broker.store.files import FileLimits, NewFile, check_fetch
from tidemesh.core.errors import InvalidRequest, NotFound

Frame = dict[str, Any]


def _state(frame: Frame, state: dict[str, Any]) -> Frame:
    return {"type": "file_state", "id": frame["id"], "file_id": frame["file_id"], **state}


class Files:
    def __init__(self, store: Store, limits: FileLimits) -> None:
        self.store = store
        self.limits = limits

    async def open(self, conn: Conn, frame: Frame) -> Frame:
        new = NewFile(conn.mesh_id, frame["file_id"], conn.pubkey, frame["size"],
                      frame["chunk_size"], frame["chunks"], frame["sealed"],
                      frame["persistent"])
        if new.chunks != -(-new.size // new.chunk_size):
            raise InvalidRequest("chunks must be size / chunk_size rounded up", field="chunks")
        row = await self.store.file_open(new, self.limits, now_ms())
        return _state(frame, row.state())

    async def chunk(self, conn: Conn, frame: Frame) -> Frame:
        try:
            data = base64.b64decode(frame["data"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"data is not base64: {exc}", field="data") from exc
        row = await self.store.file_put(conn.mesh_id, frame["file_id"], conn.pubkey,
                                        frame["seq"], data)
        return _state(frame, row.state())

    async def close(self, conn: Conn, frame: Frame) -> Frame:
        row = await self.store.file_complete(conn.mesh_id, frame["file_id"], conn.pubkey,
                                             now_ms())
        return _state(frame, row.state())

    async def fetch(self, conn: Conn, frame: Frame) -> Frame:
        file_id, seq = frame["file_id"], frame["seq"]
        check_fetch(await self.store.file_row(conn.mesh_id, file_id), seq)
        data = await self.store.file_chunk(conn.mesh_id, file_id, seq)
        if data is None:   # removed by retention between the two reads
            raise NotFound("the file was removed meanwhile", reason="file_unknown")
        return {"type": "file_data", "id": frame["id"], "file_id": file_id, "seq": seq,
                "data": base64.b64encode(data).decode("ascii")}
