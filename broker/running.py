"""The running broker's record: where it serves and which store it uses.

``broker up`` writes ``running.json`` into the broker's home folder once it listens, and
removes it when it stops cleanly. Operator commands read it so that, when nothing else names
a store, they act on the store the running broker uses rather than on a fresh embedded one.
The record keeps the store URL as given (it may hold a password), so the file is 0600.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from tidemesh.broker.config import broker_home, embedded_store

FILE_NAME = "running.json"


@dataclass(frozen=True, slots=True)
class RunningBroker:
    pid: int
    store: str
    listen: str


def record_path(environ: Mapping[str, str]) -> Path:
    return broker_home(environ) / FILE_NAME


def write(path: Path, broker: RunningBroker) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{broker.pid}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(broker), f)
    os.replace(tmp, path)


def remove(path: Path, pid: int) -> None:
    """Remove the record if it is still ours (another broker on this home may have taken it)."""
    found = read(path)
    if found is not None and found.pid == pid:
        path.unlink(missing_ok=True)


def read(path: Path) -> RunningBroker | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunningBroker(int(data["pid"]), str(data["store"]), str(data["listen"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find(environ: Mapping[str, str]) -> RunningBroker | None:
    """The record of a broker that is running now; a record left by a dead one is ignored."""
    found = read(record_path(environ))
    return found if found is not None and _alive(found.pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True


def operator_store(configured: str | None, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The store an operator command acts on, and a line for stderr when it was not named.

    Named (``--store``, ``TIDEMESH_BROKER_STORE``, broker.toml) > the running broker's >
    the embedded default. The running broker's URL is not echoed: it may hold a password.
    """
    if configured:
        return configured, None
    running = find(environ)
    if running is not None:
        return running.store, (f"using the store of the broker running as pid {running.pid} "
                               f"on {running.listen}")
    embedded = embedded_store(environ)
    return f"sqlite:///{embedded}", (
        f"no broker is running and no store is named (--store, TIDEMESH_BROKER_STORE, "
        f"broker.toml): using the embedded store {embedded}")
