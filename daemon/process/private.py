"""The daemon's folders and its local token, private to its user.

Another local user may have made the runtime folder first (``/tmp/tidemesh-UID`` when
XDG_RUNTIME_DIR is unset) or left files in one that is open to writes. The daemon then
refuses to start, naming the folder, rather than moving to a private ``mkdtemp``: clients
find the socket and token by computing the same path, so a folder elsewhere would leave
them nothing to talk to, and a refusal costs the attacker's victim a start, never its
messages. A token file is used only when it is ours with mode 0600; otherwise a new one
replaces it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import NoReturn

import structlog

from tidemesh.core.ownership import NotPrivate, chain, folder_problem_at, token_problem
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon import safe_files

log = structlog.get_logger(__name__)


def ensure_dirs(paths: DaemonPaths) -> None:
    """Create the daemon's folders, private to the user (0700); raise ``NotPrivate`` when
    the runtime folder, or one between it and its base, is another user's or open to
    writes by others."""
    base = paths.runtime_chain_base
    for folder in chain(base, paths.runtime_dir):   # each checked before one is made in it
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700, parents=folder == base)
        if (problem := folder_problem_at(folder, base=folder == base)) is not None:
            _refuse(problem, paths)
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (owner := d.stat().st_uid) != os.geteuid():
            raise NotPrivate(f"refusing {d}: it belongs to uid {owner}, not to this user",
                             folder=str(d))
        os.chmod(d, 0o700)


def _refuse(problem: str, paths: DaemonPaths) -> NoReturn:
    raise NotPrivate(f"refusing the runtime folder: {problem}. Remove it (or make it "
                     "yours and closed to others) after checking what is in it, or set "
                     "XDG_RUNTIME_DIR or TIDEMESH_HOME to a folder of your own",
                     folder=str(paths.runtime_dir))


def ensure_token(path: Path) -> str:
    """The local token: the file's when it is ours, 0600 and not empty, else a new one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return _new_token(path)
    except OSError as exc:   # a link (ELOOP) or unreadable: not ours to trust
        log.warning("local_token_replaced", path=str(path), reason=exc.strerror or str(exc))
        return _new_token(path)
    with os.fdopen(fd, "rb") as f:
        problem = token_problem(path, os.fstat(fd), os.geteuid())
        token = "" if problem else f.read(4096).decode("ascii", "replace").strip()
    if problem:
        log.warning("local_token_replaced", path=str(path), reason=problem)
    return token or _new_token(path)


def _new_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    return token


def write_atomically(path: Path, data: bytes) -> None:
    """Write a 0600 file whole or not at all (``safe_files.write_atomically``): the one way
    the daemon writes its keys, token, configuration and backups."""
    safe_files.write_atomically(path, data)
