"""Whether the daemon may write a file where it is asked to (pure, over lstat results).

A download (``file get --out``), a backup (``daemon backup --out``) or any file the daemon
writes whole may land in a folder another local user can write to. There a name may already
hold a link, a device, a folder, or a file of theirs made to be resumed into. The daemon then
writes only through files it made itself (``O_CREAT | O_EXCL | O_NOFOLLOW``), resumes only
from a partial file of its own user with mode 0600 and one link, and renames onto a target
only if the target is absent or a regular file of its own user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tidemesh.core.errors import UnsafeTarget

__all__ = ["UnsafeTarget", "name_problem", "partial_problem", "target_problem"]

# Linux's NAME_MAX and PATH_MAX (macOS's are the same or shorter for names).
NAME_MAX = 255
PATH_MAX = 4095
# The longest suffix added beside a target: ``OUT.part.json``.
SIDE_SUFFIX = ".part.json"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def name_problem(path: Path) -> str | None:
    """Why ``path`` cannot name a file the daemon writes (with its ``.part.json`` beside it);
    None when it can."""
    name = os.fsencode(path.name)
    if not name or path.name in (".", ".."):
        return f"{path} names a folder, not a file"
    if len(name) + len(SIDE_SUFFIX) > NAME_MAX:
        return (f"{path}: the file name is {len(name)} bytes; at most "
                f"{NAME_MAX - len(SIDE_SUFFIX)} leave room for its {SIDE_SUFFIX} beside it")
    if len(os.fsencode(path)) + len(SIDE_SUFFIX) > PATH_MAX:
        return f"{path} is longer than the {PATH_MAX - len(SIDE_SUFFIX)} bytes a path may have"
    return None


def target_problem(path: Path, st: os.stat_result | None, me: int) -> str | None:
    """Why the daemon may not replace ``path`` (``st`` its lstat, None when absent)."""
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} exists and is {_kind(st.st_mode)}; only a regular file is replaced"
    if st.st_uid != me:
        return (f"{path} belongs to uid {st.st_uid}, not to this user (uid {me}); it is "
                "not replaced")
    return None


def partial_problem(path: Path, st: os.stat_result, me: int) -> str | None:
    """Why a partial file (``OUT.part``, ``OUT.part.json``) found at ``path`` is not resumed
    from: only one the daemon's user made, mode 0600 and not linked elsewhere, is."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is {_kind(st.st_mode)}"
    if st.st_uid != me:
        return f"{path} belongs to uid {st.st_uid}, not to this user (uid {me})"
    if stat.S_IMODE(st.st_mode) != 0o600:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0600"
    if st.st_nlink != 1:
        return f"{path} has {st.st_nlink} links"
    return None
