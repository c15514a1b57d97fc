"""The errors the SDK and the CLI add to the ``core.errors`` tree: no daemon answers, or the
one that answers does not fit this client's version."""

from __future__ import annotations

from typing import Any

from tidemesh.core.errors import TidemeshError

_HINTED = "; start it with "
_REVOKED = "; this member was revoked from the mesh, so starting the daemon cannot help; "


class DaemonNotRunning(TidemeshError):
    """Nothing answers where the daemon should be: no socket, refused, or no answer in time.

    ``hint`` is the command that starts the daemon, ``reason`` the message without it,
    ``then`` what to do once it runs (said after the hint). Every other failure is the
    daemon's own answer, rebuilt as its ``core.errors`` class.
    """

    code = "daemon_not_running"
    http_status = 503

    def __init__(self, message: str, *, hint: str = "tidemesh daemon up", revoked: bool = False,
                 then: str | None = None, **details: Any) -> None:
        # A revoked member's daemon exits for good: starting it again cannot help. Rebuilt
        # from a wire body (core.errors.from_body), the message has its advice already.
        if _HINTED in message or _REVOKED in message:
            said = message
        elif revoked:
            said = f"{message}{_REVOKED}ask an operator for a new invite and run `{hint}`"
        else:
            said = f"{message}{_HINTED}`{hint}`" + (f", then {then}" if then else "")
        super().__init__(said, **details)
        self.reason = said.split(_HINTED)[0].split(_REVOKED)[0]
        self.hint, self.revoked = hint, revoked


class DaemonNotAnswering(TidemeshError):
    """A daemon holds the mesh's instance lock but does not answer its socket (stopped with
    SIGSTOP, stuck, or still starting). The CLI says so instead of taking the cold path,
    which would take the daemon's broker session over; the SDK, which looks at no lock
    files, says ``DaemonNotRunning`` for the same silence."""

    code = "daemon_not_answering"
    http_status = 503


class IncompatibleDaemon(TidemeshError):
    """The daemon that answers does not work with this client (``GET /v1/compat``, spec
    §15.4): another IPC API major, or this client's version outside the daemon's range.
    ``kind`` is ``ipc_api`` or ``version``."""

    code = "incompatible_daemon"
    http_status = 409
