"""core/files.py: ids, keys and chunk seals are deterministic per file; a changed or moved
chunk does not open; an announcement from another member is checked; where a download
resumes."""

from __future__ import annotations

import hashlib

import pytest

from tidemesh.core import files
from tidemesh.core.files import FileIntegrityError, FileMeta

SHA = "ab" * 32
A, B = b"\x11" * 32, b"\x22" * 32   # two senders' secret keys


def test_the_id_is_one_per_sender_content_and_destination() -> None:
    fid = files.file_id(A, SHA, "topic", "ops")
    assert fid == files.file_id(A, SHA, "topic", "ops") and len(fid) == 32
    assert len({fid, files.file_id(B, SHA, "topic", "ops"),
                files.file_id(A, "cd" * 32, "topic", "ops"),
                files.file_id(A, SHA, "topic", "ops2"), files.file_id(A, SHA, "queue", "ops")}) == 5
    # Length-prefixed parts: moving a character between parts is another id.
    assert files.file_id(A, SHA, "topic", "o:ps") != files.file_id(A, SHA, "topic:o", "ps")
    assert files.client_message_id(fid) == f"file-{fid}"
    # Keyed by the sender's secret: without it, a guessed content's id cannot be computed.
    unkeyed = hashlib.blake2b(digest_size=16, person=b"tm-file-id-v1")
    for part in (SHA, "topic", "ops"):
        unkeyed.update(len(part).to_bytes(4, "big") + part.encode())
    assert unkeyed.hexdigest() != fid


def test_the_key_is_the_senders_and_the_files_alone() -> None:
    fid = files.file_id(A, SHA, "dm", "22" * 32)
    k = files.file_key(b"s" * 32, fid)
    assert k == files.file_key(b"s" * 32, fid) and len(k) == 32
    assert k != files.file_key(b"t" * 32, fid)
    assert k != files.file_key(b"s" * 32, files.file_id(A, SHA, "dm", "11" * 32))


def test_a_sealed_chunk_opens_in_its_place_only() -> None:
    key = files.file_key(b"s" * 32, "0" * 32)
    sealed = files.seal_chunk(key, 3, b"plain bytes")
    assert sealed == files.seal_chunk(key, 3, b"plain bytes")   # a resumed upload agrees
    assert len(sealed) == len(b"plain bytes") + files.SEALED_OVERHEAD
    assert b"plain" not in sealed
    assert files.open_chunk(key, 3, sealed) == b"plain bytes"
    with pytest.raises(FileIntegrityError):
        files.open_chunk(key, 4, sealed)                          # moved to another place
    changed = bytearray(sealed)
    changed[0] ^= 1
    with pytest.raises(FileIntegrityError):
        files.open_chunk(key, 3, bytes(changed))


def test_chunks_and_spans() -> None:
    assert files.chunk_count(0, 10) == 0
    assert files.chunk_count(10, 10) == 1 and files.chunk_count(11, 10) == 2
    assert files.chunk_span(1, 11, 10) == 1 and files.chunk_span(0, 11, 10) == 10


def _meta(**over: object) -> dict[str, object]:
    body: dict[str, object] = {"id": "a" * 32, "name": "r.pdf", "size": 5, "sha256": SHA,
                               "chunk_size": 4, "chunks": 2, "persistent": False}
    body.update(over)
    return {files.META_KEY: body}


def test_an_announcement_round_trips_and_a_bad_one_is_none() -> None:
    fm = FileMeta("a" * 32, "r.pdf", 5, SHA, 4, "cd" * 32, True)
    assert files.parse_meta(fm.to_meta()) == fm
    assert "key" not in fm.view() and fm.view()["sealed"] is True
    assert files.parse_meta(_meta()) == FileMeta("a" * 32, "r.pdf", 5, SHA, 4)
    for bad in (None, {}, {"x": 1}, _meta(id="zz"), _meta(size=-1), _meta(chunk_size=0),
                _meta(chunk_size=1 << 21), _meta(sha256="ab"), _meta(key="k"),
                _meta(size="many")):
        assert files.parse_meta(bad) is None, bad


@pytest.mark.parametrize(("name", "safe"), [
    ("report.pdf", "report.pdf"), ("../../etc/passwd", "passwd"), ("a\\b\\c.txt", "c.txt"),
    ("..", "file"), ("", "file"), ("x\ny", "xy")])
def test_a_received_name_is_a_plain_file_name(name: str, safe: str) -> None:
    assert files.safe_name(name) == safe


def test_a_download_resumes_after_the_whole_chunks_of_its_own_file() -> None:
    fm = FileMeta("a" * 32, "r", 10, SHA, 4)
    state = {"id": fm.id, "sha256": SHA, "chunk_size": 4}
    assert files.resume_point(fm, state, 0) == files.Resume(0, 0)
    assert files.resume_point(fm, state, 7) == files.Resume(1, 4)     # half a chunk cut
    assert files.resume_point(fm, state, 10) == files.Resume(3, 10)   # all there
    assert files.resume_point(fm, None, 7) == files.Resume(0, 0)
    assert files.resume_point(fm, {**state, "id": "b" * 32}, 7) == files.Resume(0, 0)
    assert files.resume_point(fm, {**state, "chunk_size": 2}, 7) == files.Resume(0, 0)
