"""The errors the SDK and the CLI add to the ``core.errors`` tree: no daemon answers."""

from __future__ import annotations

from typing import Any

from tidemesh.core.errors import TidemeshError

_HINTED = "; start it with "


class DaemonNotRunning(TidemeshError):
    """Nothing answers where the daemon should be: no socket, refused, or no answer in time.

    ``hint`` is the command that starts the daemon, ``reason`` the message without it. Every
    other failure is the daemon's own answer, rebuilt as its ``core.errors`` class.
    """

    code = "daemon_not_running"
    http_status = 503

    def __init__(self, message: str, *, hint: str = "tidemesh daemon up", **details: Any) -> None:
        # Rebuilt from a wire body (core.errors.from_body), the message has its hint already.
        said = message if _HINTED in message else f"{message}{_HINTED}`{hint}`"
        super().__init__(said, **details)
        self.reason, self.hint = message.split(_HINTED)[0], hint


class DaemonNotAnswering(TidemeshError):
    """A daemon holds the mesh's instance lock but does not answer its socket (stopped with
    SIGSTOP, stuck, or still starting). The CLI says so instead of taking the cold path,
    which would take the daemon's broker session over; the SDK, which looks at no lock
    files, says ``DaemonNotRunning`` for the same silence."""

    code = "daemon_not_answering"
    http_status = 503
