"""Whether a folder or file that another local user could have made is safe to use.

Nothing another user could have made is trusted (DESIGN §11): a runtime folder, and every
folder from the runtime base down to it, must belong to this user and be closed to writes by
group and others; the token must belong to this user with mode 0600; the daemon's socket must
belong to this user. The decisions are pure (``*_problem`` over lstat results);
``chain_problem`` and ``folder_problem_at`` read the file system for them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tidemesh.core.errors import Forbidden


class NotPrivate(Forbidden):
    """A folder, token or socket that another user made or could have changed."""

    code = "not_private"


def _owner_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    if st.st_uid != me:
        return f"{path} belongs to uid {st.st_uid}, not to this user (uid {me})"
    return None


def folder_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    """Why ``path`` may not hold the daemon's files; None when it may."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (a link or a file is not followed)"
    if problem := _owner_problem(path, st, me):
        return problem
    if st.st_mode & 0o022:
        return (f"{path} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); what is in it cannot be trusted")
    return None


def token_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    """Why the token file at ``path`` is not to be trusted; None when it is."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if problem := _owner_problem(path, st, me):
        return problem
    if st.st_mode & 0o077:
        return f"{path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def socket_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    """Why the daemon socket at ``path`` is not to be talked to; None when it is. (Something
    of ours there that is not a socket is no danger: connecting to it just fails.)"""
    return _owner_problem(path, st, me)


def base_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    """``folder_problem`` for the first folder of a chain, which may also be a sticky folder
    of root's or ours (like /tmp, or a fresh tmpfs): others cannot remove or rename what we
    make in it, and nothing of theirs in it is used."""
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid in (0, me)
    return None if sticky else folder_problem(path, st, me)


def chain(base: Path, leaf: Path) -> list[Path]:
    """The folders from ``base`` down to ``leaf``, both included (just ``leaf`` when it is
    not under ``base``)."""
    if not leaf.is_relative_to(base):
        return [leaf]
    folders = [base]
    for part in leaf.relative_to(base).parts:
        folders.append(folders[-1] / part)
    return folders


def chain_problem(base: Path, leaf: Path, me: int | None = None) -> str | None:
    """The first folder from ``base`` down to ``leaf`` that is not private to this user, as
    a sentence; None when all are (a missing one is a problem too)."""
    for folder in chain(base, leaf):
        if problem := folder_problem_at(folder, me, base=folder == base):
            return problem
    return None


def folder_problem_at(folder: Path, me: int | None = None, base: bool = False) -> str | None:
    """``folder_problem`` of the folder on disk. Only the chain's base may be a link, and
    only one of ours (macOS's /tmp is one, to /private/tmp)."""
    uid = os.geteuid() if me is None else me
    try:
        st = os.lstat(folder)
        if base and stat.S_ISLNK(st.st_mode) and st.st_uid == uid:
            st = os.stat(folder)
    except OSError as exc:
        return f"cannot check {folder}: {exc.strerror or exc}"
    return (base_problem if base else folder_problem)(folder, st, uid)
