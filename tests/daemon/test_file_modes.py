"""The daemon's files are private to its user whatever the umask (docs/daemon.md, Files)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.daemon.harness import RunningDaemon


def test_databases_and_their_wal_files_are_private(daemon: RunningDaemon) -> None:
    daemon.client.send({"to": "topic:ops", "body": "x"}, "private-1")
    files = [Path(str(db) + suffix) for db in (daemon.paths.outbox_db, daemon.paths.inbox_db)
             for suffix in ("", "-wal", "-shm")]
    present = [f for f in files if f.exists()]
    assert daemon.paths.outbox_db in present and Path(f"{daemon.paths.outbox_db}-wal") in present
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in present} == {
        f.name: oct(0o600) for f in present}
    assert stat.S_IMODE(os.stat(daemon.paths.data_dir).st_mode) == 0o700
