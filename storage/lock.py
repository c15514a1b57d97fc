"""One process per database: an exclusive ``flock`` held for the life of the process.

A daemon holds one per (user, mesh); a broker on the embedded SQLite store holds one beside
the file, because SQLite has one writer and no way to tell a second broker's sessions about
the first's. The kernel drops the lock when the process dies, however it dies, so there is
no stale-pid race. The file also records the holder's pid for ``daemon down`` and ``status``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class AlreadyRunning(RuntimeError):
    def __init__(self, pid: int | None, holder: str = "a daemon for this mesh") -> None:
        super().__init__(f"{holder} is already running (pid {pid})")
        self.pid = pid


class InstanceLock:
    def __init__(self, path: Path, holder: str = "a daemon for this mesh") -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(holder_pid(self.path), self.holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def holder_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def is_held(path: Path) -> bool:
    """True when some process holds the lock (probe without keeping it)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
