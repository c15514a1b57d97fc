"""The files beside a download (``OUT.part``, ``OUT.part.json``) and its target, written
through ``safe_files``: only this user's own 0600 partial files are resumed from, and the
part is renamed onto a target that is absent or a regular file of this user."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.files import FileMeta
from tidemesh.core.targets import UnsafeTarget
from tidemesh.daemon import safe_files

_READ_BYTES = 1 << 20
# A state file beside a partial download is some 150 bytes; more is not ours.
_STATE_BYTES = 4096


def hash_prefix(fd: int, size: int) -> Any:
    h = hashlib.sha256()
    done = 0
    while done < size and (block := os.pread(fd, min(_READ_BYTES, size - done), done)):
        h.update(block)
        done += len(block)
    return h


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish(fd: int, part: Path, out: Path) -> None:
    os.fsync(fd)
    if not safe_files.still_ours(fd, part):
        raise UnsafeTarget(f"{part} was replaced during the get; nothing was written to {out}",
                           path=str(part), field="out")
    safe_files.replace_onto(part, out)
    fsync_dir(out.parent)


def write_state(path: Path, fm: FileMeta) -> None:
    safe_files.write_new(path, orjson.dumps({"id": fm.id, "sha256": fm.sha256,
                                             "chunk_size": fm.chunk_size}))


def read_state(path: Path) -> dict[str, Any] | None:
    """The state beside a partial file, when it is this user's own 0600 file."""
    fd = safe_files.open_ours(path, os.O_RDONLY)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(_STATE_BYTES)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def absolute(text: str, field: str) -> Path:
    """A path from a request: absolute (the daemon has no working directory of the caller's)
    and one the file system can be asked about."""
    if "\x00" in text or not text.isprintable():
        raise InvalidRequest(f"{field} has a character no path can hold", field=field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{field} is not valid UTF-8", field=field) from exc
    path = Path(text)
    if not path.is_absolute():
        raise InvalidRequest(f"{field} must be an absolute path (the daemon does not share "
                             "the caller's working directory)", field=field)
    return path
