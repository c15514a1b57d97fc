"""The running broker's record: where it serves and which store it uses.

``broker up`` writes ``running.json`` into the broker's home folder once it listens, and
removes it when it stops cleanly; ``last.json`` beside it (the same record) stays. Operator
commands read them so that, when nothing else names a store, they act on the store the
running broker uses, or the one the broker last ran on, rather than on a fresh embedded one:
a stopped broker must not make an operator command create a second store. The record keeps
the store URL as given (it may hold a password), so the files are 0600.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from tidemesh.broker.config import broker_home, embedded_store
from tidemesh.core.errors import NotFound

FILE_NAME = "running.json"
LAST_FILE_NAME = "last.json"


@dataclass(frozen=True, slots=True)
class RunningBroker:
    pid: int
    store: str
    listen: str
    url: str = ""     # the ws:// address it serves (broker.public_url, else the bound one)


def record_path(environ: Mapping[str, str]) -> Path:
    return broker_home(environ) / FILE_NAME


def last_path(record: Path) -> Path:
    return record.with_name(LAST_FILE_NAME)


def write(path: Path, broker: RunningBroker) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{broker.pid}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(broker), f)
    os.replace(tmp, path)


def write_both(path: Path, broker: RunningBroker) -> None:
    """The running record and the one that outlives the broker's stop."""
    write(path, broker)
    write(last_path(path), broker)


def remove(path: Path, pid: int) -> None:
    """Remove the record if it is still ours (another broker on this home may have taken it)."""
    found = read(path)
    if found is not None and found.pid == pid:
        path.unlink(missing_ok=True)


def read(path: Path) -> RunningBroker | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunningBroker(int(data["pid"]), str(data["store"]), str(data["listen"]),
                             str(data.get("url") or f"ws://{data['listen']}"))
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


def last(environ: Mapping[str, str]) -> RunningBroker | None:
    """The record of the broker that last ran from this home, running or not."""
    record = record_path(environ)
    return read(record) or read(last_path(record))


@dataclass(frozen=True, slots=True)
class OperatorStore:
    url: str
    note: str | None            # for stderr when the store was not named
    broker: RunningBroker | None  # the broker whose store it is, when chosen through one


def operator_store(configured: str | None, environ: Mapping[str, str],
                   creates: bool = False) -> OperatorStore:
    """The store an operator command acts on, and a line for stderr when it was not named.

    Named (``--store``, ``TIDEMESH_BROKER_STORE``, broker.toml) > the running broker's >
    the one the broker last ran on from this home > the embedded default, which only a
    command that sets a store up (``creates``) may bring into being. The broker's URL is not
    echoed: it may hold a password.
    """
    if configured:
        return OperatorStore(configured, None, None)
    running = find(environ)
    if running is not None:
        return OperatorStore(running.store, f"using the store of the broker running as pid "
                             f"{running.pid} on {running.url}", running)
    before = last(environ)
    if before is not None:
        return OperatorStore(before.store, f"no broker is running: using the store the broker "
                             f"last ran on from this home (pid {before.pid}, {before.url})",
                             before)
    embedded = embedded_store(environ)
    if not creates and not embedded.exists():
        raise NotFound(f"no broker is running, none has run from this home, and no store is "
                       f"named: name it with --store, TIDEMESH_BROKER_STORE or broker.toml "
                       f"(the embedded store {embedded} does not exist yet)", field="store")
    return OperatorStore(f"sqlite:///{embedded}", (
        f"no broker is running and no store is named (--store, TIDEMESH_BROKER_STORE, "
        f"broker.toml): using the embedded store {embedded}"), None)
