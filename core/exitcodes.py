"""Process exit codes, shared by the daemon and the CLI. ``MEANING`` is the table of
docs/cli.md (rendered by ``cli.reference``, so the two cannot drift)."""

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
    STALLED = 16              # the event loop stalled past watchdog.exit_after_s; restart it


MEANING: dict[Exit, str] = {
    Exit.OK: "success",
    Exit.FAILURE: "failure not listed below",
    Exit.USAGE: "bad flags or configuration (also: socket path too long; `daemon join` of "
                "another mesh under a name bound to one; a runtime folder, token or socket another "
                "user could have made; an ephemeral daemon whose key is not the joined "
                "member's, which could never reach the broker)",
    Exit.NOT_RUNNING: "no daemon answers for this mesh",
    Exit.HOST_MISMATCH: "host fingerprint mismatch: run `tidemesh daemon accept-host`",
    Exit.ALREADY_RUNNING: "a daemon already runs for this mesh",
    Exit.UNHEALTHY: "unhealthy, or the outbox is damaged or newer than this tidemesh",
    Exit.CONFLICT: "a 409: the id is bound to another request or state",
    Exit.REJECTED: "any other 4xx: the request was refused (a pre-send veto too), nothing "
                   "stored",
    Exit.FEATURE_UNAVAILABLE: "the broker lacks a required feature, or its dedupe window "
                              "cannot cover the outbox max age; or the running daemon and "
                              "this CLI do not fit each other's versions (`GET /v1/compat`)",
    Exit.ORPHANS_FOUND: "`tidemesh audit orphans` found orphans (see `audit.md`)",
    Exit.REVOKED: "this member was revoked from the mesh (daemon.md, \"Revoked members\"); "
                  "never restarted by systemd",
    Exit.UNDELIVERED: "`tidemesh send --wait`: the broker refused the send; its outbox row is "
                      "dead (the reason is printed)",
    Exit.STILL_QUEUED: "`tidemesh send --wait`: still queued when `--timeout` passed",
    Exit.NOT_ANSWERING: "`tidemesh send`: a daemon holds this mesh's lock but does not answer "
                        "(stopped with SIGSTOP, stuck, or still starting); nothing was sent",
    Exit.STALLED: "the daemon's or the broker's event loop stalled past "
                  "`watchdog.exit_after_s` (daemon.md, \"Loop watchdog\"); a service manager "
                  "restarts it",
}
