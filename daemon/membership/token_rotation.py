"""``daemon rotate-token``: a new local bearer token, the old one honoured for a grace period
so that programs holding it finish what they were doing and re-read the file.

The check itself lives with the middleware (``IpcState.accepts``); this writes the file and
moves the state. The token file is replaced atomically (temp file, rename, 0600): a reader
sees the old token or the new one, never a half-written file.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from tidemesh.daemon.api.keys import IpcState
from tidemesh.daemon.process.private import write_atomically


def write_token(path: Path, token: str) -> None:
    write_atomically(path, (token + "\n").encode("ascii"))


def new_token() -> str:
    return secrets.token_urlsafe(32)


def rotate(state: IpcState, path: Path, now: float) -> float:
    """Write a new token to ``path`` and make it the one the daemon checks; the previous one
    stays valid until the returned monotonic time (``now`` + the grace)."""
    token = new_token()
    write_token(path, token)
    until = now + state.token_grace_s
    state.previous_token, state.previous_until = state.token, until
    state.token = token
    state.rotations.inc()
    return until
