"""The one error the SDK adds to the ``core.errors`` tree: no daemon answers."""

from __future__ import annotations

from typing import Any

from tidemesh.core.errors import TidemeshError


class DaemonNotRunning(TidemeshError):
    """Nothing answers where the daemon should be: no socket, refused, or no answer in time.

    ``hint`` is the command that starts the daemon, ``reason`` the message without it. Every
    other failure is the daemon's own answer, rebuilt as its ``core.errors`` class.
    """

    code = "daemon_not_running"
    http_status = 503

    def __init__(self, message: str, *, hint: str = "tidemesh daemon up", revoked: bool = False,
                 **details: Any) -> None:
        # A revoked member's daemon exits for good: starting it again cannot help.
        advice = (f"this member was revoked from the mesh, so starting the daemon cannot "
                  f"help; ask an operator for a new invite and run `{hint}`" if revoked
                  else f"start it with `{hint}`")
        super().__init__(f"{message}; {advice}", **details)
        self.reason, self.hint, self.revoked = message, hint, revoked
