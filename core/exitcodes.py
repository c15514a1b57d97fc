"""Process exit codes, shared by the daemon and the CLI (the table in docs/daemon.md, which
docs/cli.md points to)."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILURE = 1              # anything not listed below
    USAGE = 2                # bad flags or configuration
    NOT_RUNNING = 3          # no daemon answers for this mesh
    HOST_MISMATCH = 4        # host fingerprint differs; run `tidemesh daemon accept-host`
    ALREADY_RUNNING = 5      # a daemon holds this mesh's lock, or a broker the SQLite store's
    UNHEALTHY = 6            # running but unhealthy, or a damaged/too-new store
    CONFLICT = 7             # a 409: the id is bound to another request or state
    REJECTED = 8             # any other 4xx: the request was refused, nothing stored
    FEATURE_UNAVAILABLE = 10  # broker lacks a required feature (WebSocket close 4010)
    ORPHANS_FOUND = 11        # the orphan audit ran and found inconsistent rows (docs/audit.md)
    REVOKED = 12              # this member was removed from the mesh; restarting cannot help
    UNDELIVERED = 13          # `send --wait`: the broker refused it; the outbox row is dead
    STILL_QUEUED = 14         # `send --wait`: no outcome before the timeout; still in the outbox
    NOT_ANSWERING = 15        # a daemon holds this mesh's lock but does not answer (stopped, stuck)
