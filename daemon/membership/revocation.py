"""The durable record that this member was revoked from its mesh (``revoked.json`` in the
data folder).

The broker says so once, as a close (4002 ``member_revoked``); the record keeps saying it
after the daemon has exited, so ``daemon status``, ``daemon up`` and the cold path can
explain instead of retrying. ``daemon join`` with a new invite removes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tidemesh.core.errors import MemberRevoked
from tidemesh.daemon.membership.identity import write_private

# The broker's close reason for a revoked member (broker/service/auth.py).
REASON = "member_revoked"


@dataclass(frozen=True, slots=True)
class Revocation:
    mesh: str
    revoked_at: int    # ms, when this host learned it

    @property
    def message(self) -> str:
        return (f"revoked: this member was removed from mesh {self.mesh}; "
                "ask an operator for a new invite")

    def error(self) -> MemberRevoked:
        return MemberRevoked(self.message, mesh=self.mesh, revoked_at=self.revoked_at)


def record(path: Path, mesh: str) -> Revocation:
    found = Revocation(mesh, int(time.time() * 1000))
    write_private(path, {"version": 1, "mesh": mesh, "revoked_at": found.revoked_at})
    return found


def load(path: Path) -> Revocation | None:
    """The record, or None; an unreadable record still counts (the file says enough)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Revocation(str(data["mesh"]), int(data["revoked_at"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Revocation(path.parent.name, 0)


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)
