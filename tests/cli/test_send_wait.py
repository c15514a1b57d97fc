"""What ``send --wait`` tells the user for each final state of an outbox row (pure)."""

from __future__ import annotations

from typing import Any

from tidemesh.cli.send_wait import outcome_of
from tidemesh.core.exitcodes import Exit


def _row(status: str, **extra: Any) -> dict[str, Any]:
    return {"id": "R1", "client_message_id": "c1", "status": status, "attempts": 2,
            "broker_message_id": None, "last_error": None, **extra}


def test_each_state_has_its_own_exit_code_and_says_why() -> None:
    done = outcome_of(_row("done", broker_message_id="B1"), 5)
    assert (done.exit, done.line) == (Exit.OK, "done: client_message_id c1, "
                                                "broker_message_id B1")
    dead = outcome_of(_row("dead", last_error="not_found: no topic nosuch"), 5)
    assert dead.exit == Exit.UNDELIVERED and dead.line.endswith("no topic nosuch")
    late = outcome_of(_row("pending"), 1.5)
    assert late.exit == Exit.STILL_QUEUED and "still queued after 1.5s" in late.line
    assert "outbox inspect R1" in late.line
