"""Where the broker's store URL comes from, so that no password is in the process list.

Every local user reads every process's command line (``ps``, ``/proc/PID/cmdline``), so a
``--store postgresql://user:PASSWORD@…`` is theirs to read for as long as the broker runs.
The URL can come instead from ``TIDEMESH_BROKER_STORE`` (a process's environment is only its
own user's to read), ``broker.toml``, or ``--store-file PATH`` (``TIDEMESH_BROKER_STORE_FILE``):
a file of this user's, mode 0600, holding the URL. A password given on the command line
still works, with a warning. Decisions are pure; ``read_store_file`` reads the one file.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tidemesh.core.errors import UsageError
from tidemesh.core.ownership import token_problem

# Larger than any URL a person writes; a file bigger than this is not a store URL.
MAX_FILE_BYTES = 8192
CMDLINE_WARNING = ("the store URL on the command line holds a password, which every local "
                   "user can read in the process list; pass it in TIDEMESH_BROKER_STORE, "
                   "broker.toml or --store-file PATH (mode 0600) instead")


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password: ``user:PASSWORD@`` or ``?password=``."""
    try:
        parts = urlsplit(url)
        return parts.password is not None or "password" in parse_qs(parts.query)
    except ValueError:   # not a URL at all: the store refuses it later, with its own error
        return False


def read_store_file(path: Path, me: int | None = None) -> str:
    """The store URL in ``path``, which must be a regular file of this user's that no one
    else may read or write (it holds a password); a usage error (exit 2) saying why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"--store-file {path}: {exc.strerror}", field="store_file") from None
    with os.fdopen(fd, "rb") as f:
        problem = token_problem(path, os.fstat(f.fileno()), os.getuid() if me is None else me)
        if problem is not None:
            raise UsageError(f"--store-file {path}: {problem}; it holds the store's password: "
                             f"chmod 600 it", field="store_file")
        data = f.read(MAX_FILE_BYTES + 1)
    url = data.decode("utf-8", errors="replace").strip()
    if not url or len(data) > MAX_FILE_BYTES or "\n" in url:
        raise UsageError(f"--store-file {path} must hold one store URL on one line",
                         field="store_file")
    return url


def chosen_store(store: str | None, store_file: Path | None) -> tuple[str | None, bool]:
    """The store URL the command line names (None: the settings decide), and whether a
    password is on the command line (to warn of)."""
    if store is not None and store_file is not None:
        raise UsageError("give --store or --store-file, not both", field="store")
    if store_file is not None:
        return read_store_file(store_file), False
    return store, store is not None and has_password(store)
