"""Shared files (docs/ipc.md, "Files"), without I/O: a file's id and announcement, its chunks'
sealing, and where an interrupted download picks up.

A shared file travels as numbered chunks of ``chunk_size`` plaintext bytes (the last one
shorter) stored by the broker, and is announced by an ordinary message whose ``meta`` holds
``{"tidemesh_file": {...}}``: id, name, size, SHA-256 of the plaintext, chunk size, chunk
count, and for a DM the file's key. A DM's meta travels inside its sealed envelope
(core/sealing.py), so the key reaches the recipient alone and the broker only ever holds
ciphertext.

Everything is deterministic per (sender, content, destination): the same share retried, or
resumed after the sender's daemon died, gets the same file id, the same announcement id
(hence the broker's dedupe makes it one message) and, for a DM, the same key and chunk
ciphertexts, so chunks the broker already holds stay valid.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from nacl.exceptions import CryptoError
from nacl.secret import SecretBox

from tidemesh.core.errors import TidemeshError

META_KEY = "tidemesh_file"
SEALED_OVERHEAD = SecretBox.MACBYTES
# A chunk of 256 KiB is ~342 KiB of base64 in a frame: well under both ends' frame limits,
# and few enough frames for 100 MiB (400) that the per-frame costs stay small.
DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_CHUNK_BYTES = 1 << 20
MAX_NAME = 255


class FileIntegrityError(TidemeshError):
    """The bytes fetched are not the file announced (hash, size or a chunk's seal differs);
    nothing was written."""

    code = "file_integrity_failed"
    http_status = 502


@dataclass(frozen=True, slots=True)
class FileMeta:
    """What an announcement says of a file."""

    id: str
    name: str
    size: int
    sha256: str
    chunk_size: int
    key: str | None = None          # hex, a DM's file key (sealed in transit)
    persistent: bool = False

    @property
    def chunks(self) -> int:
        return chunk_count(self.size, self.chunk_size)

    @property
    def sealed(self) -> bool:
        return self.key is not None

    def to_meta(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "name": self.name, "size": self.size,
                                "sha256": self.sha256, "chunk_size": self.chunk_size,
                                "chunks": self.chunks, "persistent": self.persistent}
        if self.key is not None:
            body["key"] = self.key
        return {META_KEY: body}

    def view(self) -> dict[str, Any]:
        """For list and events: everything but the key."""
        return {"id": self.id, "name": self.name, "size": self.size, "sha256": self.sha256,
                "chunk_size": self.chunk_size, "chunks": self.chunks,
                "persistent": self.persistent, "sealed": self.sealed}


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def chunk_span(seq: int, size: int, chunk_size: int) -> int:
    """The plaintext length of chunk ``seq``."""
    return min(chunk_size, size - seq * chunk_size)


def file_id(sender_secret: bytes, sha256_hex: str, to_kind: str, to_ref: str) -> str:
    """32 hex digits for (sender, content, destination): a retried share is the same file.
    Keyed by the sender's secret: an unkeyed hash would let whoever sees the id (the broker)
    confirm a guess at a DM file's content."""
    h = hashlib.blake2b(digest_size=16, person=b"tm-file-id-v1", key=hashlib.blake2b(
        sender_secret, digest_size=32, person=b"tm-file-id-key").digest())
    for part in (sha256_hex, to_kind, to_ref):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(4, "big") + data)
    return h.hexdigest()


def client_message_id(fid: str) -> str:
    """The announcement's id: the broker's dedupe makes a retried share one message."""
    return f"file-{fid}"


def file_key(sender_secret: bytes, fid: str) -> bytes:
    """A DM file's key, derived from the sender's secret key and the file id: a share
    resumed by a restarted daemon seals its remaining chunks under the key of the first."""
    return hashlib.blake2b(fid.encode("ascii"), key=hashlib.blake2b(
        sender_secret, digest_size=32, person=b"tm-file-key-key").digest(),
        digest_size=SecretBox.KEY_SIZE, person=b"tm-file-key-v1").digest()


def _nonce(seq: int) -> bytes:
    # The key is this file's alone, so the chunk number is a nonce that never repeats with
    # other plaintext; it also binds each chunk to its place (a swapped chunk does not open).
    return seq.to_bytes(SecretBox.NONCE_SIZE, "big")


def seal_chunk(key: bytes, seq: int, plain: bytes) -> bytes:
    return bytes(SecretBox(key).encrypt(plain, _nonce(seq)).ciphertext)


def open_chunk(key: bytes, seq: int, sealed: bytes) -> bytes:
    try:
        return bytes(SecretBox(key).decrypt(sealed, _nonce(seq)))
    except CryptoError as exc:
        raise FileIntegrityError(f"chunk {seq} does not open under the file's key: it was "
                                 "changed in the store or in transit", seq=seq) from exc


def parse_meta(meta: Any) -> FileMeta | None:
    """The file an incoming message announces, or None when it announces none or its
    announcement is malformed (a message from any member is untrusted input)."""
    if not isinstance(meta, dict) or not isinstance(body := meta.get(META_KEY), dict):
        return None
    try:
        fm = FileMeta(str(body["id"]), str(body["name"]), int(body["size"]),
                      str(body["sha256"]), int(body["chunk_size"]),
                      str(body["key"]) if body.get("key") is not None else None,
                      bool(body.get("persistent", False)))
    except (KeyError, TypeError, ValueError):
        return None
    ok = (len(fm.id) == 32 and _hex(fm.id) and len(fm.sha256) == 64 and _hex(fm.sha256)
          and fm.size >= 0 and 0 < fm.chunk_size <= MAX_CHUNK_BYTES
          and (fm.key is None or (len(fm.key) == 64 and _hex(fm.key))))
    return fm if ok else None


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def safe_name(name: str) -> str:
    """A file name an announcement may carry: the last path part, no control characters,
    bounded; what `file get` writes when no out path is given."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if c.isprintable()).strip()[:MAX_NAME]
    return base if base not in ("", ".", "..") else "file"


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a download picks up: chunks already written, and the bytes to keep of the
    partial file (anything past the last whole chunk is cut)."""

    next_seq: int
    keep_bytes: int


def resume_point(fm: FileMeta, state: dict[str, Any] | None, partial_bytes: int) -> Resume:
    """From the partial file's length and its state (the file id and chunk size it was
    written for): a state of another file, or none, starts over."""
    if (state is None or state.get("id") != fm.id or state.get("sha256") != fm.sha256
            or state.get("chunk_size") != fm.chunk_size):
        return Resume(0, 0)
    whole = min(partial_bytes, fm.size) // fm.chunk_size
    if partial_bytes >= fm.size:
        whole = fm.chunks
    whole = min(whole, fm.chunks)
    return Resume(whole, min(whole * fm.chunk_size, fm.size))


class FileTooLarge(TidemeshError):
    """A file over the broker's size limit, or over what its sender may still store."""

    code = "file_too_large"
    http_status = 413
