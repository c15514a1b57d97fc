"""Shared files in the broker's store, both adapters: an upload in order, resumed where the
store stands; the size limit and the member's quota; only the uploader adds chunks; a file is
fetchable once complete; retention keeps persistent files."""

from __future__ import annotations

import pytest

from tests.broker.conftest import new_pubkey, now_ms
from tidemesh.broker.store.base import Store
from tidemesh.broker.store.files import FileLimits, NewFile, check_fetch
from tidemesh.core.errors import Conflict, InvalidRequest, NotFound
from tidemesh.core.files import FileTooLarge

LIMITS = FileLimits(max_bytes=100, member_quota_bytes=150, retention_ms=1000)


async def _new(store: Store, size: int = 10, chunk: int = 4, persistent: bool = False,
               owner: str | None = None, fid: str = "a" * 32) -> NewFile:
    mesh = await store.create_mesh("m-" + new_pubkey()[:8], now_ms())
    return NewFile(mesh.id, fid, owner or new_pubkey(), size, chunk, -(-size // chunk), False,
                   persistent)


async def test_an_upload_goes_in_order_and_resumes_where_the_store_stands(store: Store
                                                                          ) -> None:
    f = await _new(store)
    assert (await store.file_open(f, LIMITS, now_ms())).state() == {"have": 0,
                                                                      "complete": False}
    await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 0, b"abcd")
    with pytest.raises(Conflict):   # one ahead of the upload
        await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 2, b"ij")
    with pytest.raises(InvalidRequest):   # not chunk 1's size
        await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 1, b"efg")
    row = await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 1, b"efgh")
    assert row.stored_chunks == 2
    # The same chunk again (a lost answer's retry) changes nothing.
    assert (await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 1, b"efgh")).stored_chunks == 2
    # A resumed upload is told where the store stands.
    assert (await store.file_open(f, LIMITS, now_ms())).stored_chunks == 2
    with pytest.raises(Conflict):
        await store.file_complete(f.mesh_id, f.id, f.owner_pubkey, now_ms())
    with pytest.raises(NotFound):
        check_fetch(await store.file_row(f.mesh_id, f.id), 0)
    await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 2, b"ij")
    assert (await store.file_complete(f.mesh_id, f.id, f.owner_pubkey, now_ms())).complete
    check_fetch(await store.file_row(f.mesh_id, f.id), 2)
    assert await store.file_chunk(f.mesh_id, f.id, 2) == b"ij"


async def test_only_the_uploader_adds_and_an_id_is_one_upload(store: Store) -> None:
    f = await _new(store)
    await store.file_open(f, LIMITS, now_ms())
    with pytest.raises(NotFound):
        await store.file_put(f.mesh_id, f.id, new_pubkey(), 0, b"abcd")
    with pytest.raises(Conflict):
        await store.file_open(NewFile(f.mesh_id, f.id, new_pubkey(), 10, 4, 3, False, False),
                              LIMITS, now_ms())


async def test_the_size_limit_and_the_quota_are_413_naming_their_setting(store: Store) -> None:
    f = await _new(store, size=101)
    with pytest.raises(FileTooLarge) as err:
        await store.file_open(f, LIMITS, now_ms())
    assert err.value.details["setting"] == "files.max_bytes"
    first = await _new(store, size=100)
    await store.file_open(first, LIMITS, now_ms())
    second = NewFile(first.mesh_id, "b" * 32, first.owner_pubkey, 60, 4, 15, False, False)
    with pytest.raises(FileTooLarge) as err:
        await store.file_open(second, LIMITS, now_ms())
    assert err.value.details["setting"] == "files.member_quota_bytes"


async def test_retention_removes_files_that_are_not_persistent(store: Store) -> None:
    t = now_ms()
    gone = await _new(store, size=4)
    kept = NewFile(gone.mesh_id, "c" * 32, gone.owner_pubkey, 4, 4, 1, False, True)
    for f in (gone, kept):
        await store.file_open(f, LIMITS, t)
        await store.file_put(f.mesh_id, f.id, f.owner_pubkey, 0, b"abcd")
    assert await store.delete_expired_files(t + LIMITS.retention_ms + 1) == 1
    assert await store.file_row(gone.mesh_id, gone.id) is None
    assert await store.file_chunk(gone.mesh_id, gone.id, 0) is None
    assert await store.file_chunk(kept.mesh_id, kept.id, 0) == b"abcd"
