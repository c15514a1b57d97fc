"""Writing files where another local user may have planted names (``core.targets`` decides).

Every file the daemon writes whole goes through a file it made itself, by ``O_CREAT |
O_EXCL | O_NOFOLLOW`` (a link or a file already there fails the open instead of being
followed or reused), written through its descriptor, then renamed onto the target after the
target is checked again. A partial download is resumed only from a file of this user, mode
0600, one link; anything else at its name is removed first (or the get refused when it
cannot be).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

import structlog

from tidemesh.core.targets import UnsafeTarget, name_problem, partial_problem, target_problem

log = structlog.get_logger(__name__)
_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
# O_NONBLOCK: a named pipe planted at the name must not hang the open.
_EXISTING = os.O_NOFOLLOW | os.O_NONBLOCK


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeTarget(f"cannot check {path}: {exc.strerror or exc}", path=str(path),
                           field="out") from None


def check_target(path: Path, field: str = "out") -> None:
    """Refuse (400 ``unsafe_target`` naming ``path``) a target the daemon must not write."""
    problem = name_problem(path) or target_problem(path, _lstat(path), os.geteuid())
    if problem is not None:
        raise UnsafeTarget(f"refusing {field} {path}: {problem}", path=str(path), field=field)


def replace_onto(made: Path, target: Path, field: str = "out") -> None:
    """Rename ``made`` (a file this process created) onto ``target``, checked once more."""
    check_target(target, field)
    os.replace(made, target)


def _refused(path: Path, exc: OSError) -> UnsafeTarget:
    return UnsafeTarget(f"cannot write {path}: {exc.strerror or exc}", path=str(path),
                        field="out")


def _clear(path: Path, problem: str) -> None:
    """Remove what is at ``path`` (not ours to use) so a file of ours can be made there."""
    log.warning("partial_file_replaced", path=str(path), reason=problem)
    _remove(path, problem)


def _remove(path: Path, problem: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UnsafeTarget(f"refusing {path}: {problem}, and it cannot be removed "
                           f"({exc.strerror or exc})", path=str(path), field="out") from None


def create_private(path: Path, flags: int = os.O_RDWR) -> int:
    """A new 0600 file at ``path`` made by this call, its descriptor."""
    try:
        return os.open(path, flags | _CREATE, 0o600)
    except OSError as exc:
        raise _refused(path, exc) from None


def open_ours(path: Path, flags: int = os.O_RDWR) -> int | None:
    """The descriptor of the partial file at ``path`` when it may be resumed from; else
    what is there is removed and None returned (nothing there: None too)."""
    st = _lstat(path)
    if st is None:
        return None
    problem = partial_problem(path, st, os.geteuid())
    if problem is None:
        try:
            fd = os.open(path, flags | _EXISTING)
        except OSError as exc:
            problem = exc.strerror or str(exc)
        else:
            now = os.fstat(fd)
            problem = partial_problem(path, now, os.geteuid())
            if problem is None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.set_blocking(fd, True)
                return fd
            os.close(fd)
            problem = problem or "it was replaced while being opened"
    _clear(path, problem)
    return None


def still_ours(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (nobody swapped it)."""
    st, now = _lstat(path), os.fstat(fd)
    return (st is not None and stat.S_ISREG(st.st_mode)
            and (st.st_ino, st.st_dev) == (now.st_ino, now.st_dev))


def write_new(path: Path, data: bytes) -> None:
    """Replace whatever is at ``path`` by a new 0600 file of ``data`` (a small state file)."""
    st = _lstat(path)
    if st is not None and (problem := partial_problem(path, st, os.geteuid())) is not None:
        _clear(path, problem)
    elif st is not None:
        _remove(path, "an older one is replaced")
    fd = create_private(path, os.O_WRONLY)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_atomically(path: Path, data: bytes, field: str = "path", mode: int = 0o600) -> None:
    """Write a file (0600 unless ``mode`` says) whole or not at all: a temporary file of a
    random name made by ``mkstemp`` (``O_EXCL``, never followed), fsynced, renamed onto a
    checked target."""
    check_target(path, field)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".tidemesh-", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)   # on the descriptor: no name to swap
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace_onto(tmp, path, field)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
