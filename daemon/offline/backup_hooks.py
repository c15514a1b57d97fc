"""The ``hooks/`` folder in a backup: its files are configuration (a restore without them
would lose the pre-send veto without a word), carried with their permission bits.

Only regular files directly in the folder are carried. A link, a sub-folder or anything else
there refuses the backup, naming it: restoring a link would write or run where it points,
and leaving it out would drop, unsaid, what the operator put there. A restore checks every
name (one path part: it stays in the folder) and mode before anything is written, and
never replaces a file already in the folder.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path
from typing import Any

from tidemesh.core.errors import BackupDamaged, BackupError, RestoreRefused
from tidemesh.daemon import safe_files

# A hook folder is scripts and one TOML file; more than this is not one.
MAX_BYTES = 8 * 1024 * 1024
_MAX_NAME = 255


def collect(folder: Path) -> list[dict[str, Any]] | None:
    """The folder's files as ``{name, mode, data}`` (data base64), or None without a folder."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return None
    carried, total = [], 0
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise BackupError(f"{entry.path} is {what}: a backup carries only the regular "
                              "files of the hooks folder; put the file itself there (or move "
                              "it out) and back up again", path=entry.path)
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        total += len(data)
        if total > MAX_BYTES:
            raise BackupError(f"the hooks folder {folder} holds more than {MAX_BYTES} bytes: "
                              "a backup carries configuration, not data", path=str(folder))
        carried.append({"name": entry.name, "mode": stat.S_IMODE(st.st_mode) & 0o777,
                        "data": base64.b64encode(data).decode("ascii")})
    return carried


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if name in (".", "..") or "/" in name or "\x00" in name or len(name.encode()) > _MAX_NAME:
        return "is not one file name inside the hooks folder"
    return None


def checked(hooks: Any) -> list[tuple[str, int, bytes]]:
    """The bundle's hook files as (name, mode, bytes); BackupDamaged naming the first that
    would escape the folder or is malformed (a crafted bundle)."""
    if hooks is None:
        return []
    if not isinstance(hooks, list):
        raise BackupDamaged("the backup's hooks are malformed (not a list)")
    files: list[tuple[str, int, bytes]] = []
    for h in hooks:
        name = h.get("name") if isinstance(h, dict) else None
        if (problem := _name_problem(name)) is not None:
            raise BackupDamaged(f"the backup's hook file {name!r} {problem}: refused",
                                hook=repr(name))
        mode = h.get("mode")
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
            raise BackupDamaged(f"the backup's hook file {name!r} has mode {mode!r}, not "
                                "permission bits", hook=name)
        try:
            data = base64.b64decode(str(h.get("data")), validate=True)
        except (binascii.Error, ValueError):
            raise BackupDamaged(f"the backup's hook file {name!r} is damaged",
                                hook=name) from None
        if any(name == n for n, _, _ in files):
            raise BackupDamaged(f"the backup names hook file {name!r} twice", hook=name)
        files.append((str(name), mode, data))
    return files


def refusal(folder: Path, files: list[tuple[str, int, bytes]]) -> RestoreRefused | None:
    """Why the files cannot go into ``folder`` (one is there already), else None."""
    for name, _, _ in files:
        if os.path.lexists(folder / name):
            return RestoreRefused(f"{folder / name} exists: restore does not replace the "
                                  "operator's hook files (move it out first)",
                                  path=str(folder / name))
    return None


def write(folder: Path, files: list[tuple[str, int, bytes]]) -> list[str]:
    """Write each file atomically with its mode; the names written."""
    for name, mode, data in files:
        safe_files.write_atomically(folder / name, data, field="hooks", mode=mode)
    return [f"hooks/{name}" for name, _, _ in files]
