"""``tidemesh send --wait``: follow a queued send to the broker's outcome.

A 202 only says the daemon stored the send. A send that can never be delivered (no such
topic, a revoked member) goes dead moments later; ``--wait`` polls the outbox row through
the SDK until it is ``done``, ``dead`` or ``aborted``, or the timeout passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemesh.client import Client
from tidemesh.core.exitcodes import Exit

FINAL = frozenset({"done", "dead", "aborted"})
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Outcome:
    exit: Exit
    line: str
    row: Mapping[str, Any]


def wait_for_row(client: Client, outbox_id: str, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> Mapping[str, Any]:
    """The outbox row once final, or as it stands when ``timeout_s`` has passed."""
    deadline = clock() + timeout_s
    while True:
        row = client.outbox_inspect(outbox_id)
        if row["status"] in FINAL or clock() >= deadline:
            return row
        sleep(min(POLL_S, max(0.0, deadline - clock())))


def outcome_of(row: Mapping[str, Any], timeout_s: float) -> Outcome:
    """What the user is told, and the exit code, for a row as ``wait_for_row`` left it."""
    cmid = row["client_message_id"]
    if row["status"] == "done":
        return Outcome(Exit.OK, f"done: client_message_id {cmid}, broker_message_id "
                                f"{row['broker_message_id']}", row)
    if row["status"] in ("dead", "aborted"):
        reason = row.get("last_error") or row.get("aborted_by") or "no reason recorded"
        return Outcome(Exit.UNDELIVERED, f"{row['status']}: client_message_id {cmid} will not "
                                         f"be delivered: {reason}", row)
    return Outcome(Exit.STILL_QUEUED, f"still queued after {timeout_s:g}s: client_message_id "
                                      f"{cmid} ({row['status']}, {row['attempts']} attempts); "
                                      f"see `tidemesh daemon outbox inspect {row['id']}`", row)
