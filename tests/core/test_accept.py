"""The 11-row accept table (spec §4.5.1), decided without any I/O."""

from __future__ import annotations

import pytest

from tidemesh.core.accept import TABLE, Action, OutboxStatus, Prior, decide

FP = b"\x01" * 32
OTHER = b"\x02" * 32

ROWS = [
    (None, FP, Action.INSERT, 202, "queued", None),
    (OutboxStatus.PENDING, FP, Action.ACCEPTED, 202, "queued", None),
    (OutboxStatus.PENDING, OTHER, Action.CONFLICT, 409, None,
     "outbox_pending_fingerprint_mismatch"),
    (OutboxStatus.INFLIGHT, FP, Action.ACCEPTED, 202, "inflight", None),
    (OutboxStatus.INFLIGHT, OTHER, Action.CONFLICT, 409, None,
     "outbox_inflight_fingerprint_mismatch"),
    (OutboxStatus.DONE, FP, Action.DUPLICATE, 200, "done", None),
    (OutboxStatus.DONE, OTHER, Action.CONFLICT, 409, None, "outbox_done_fingerprint_mismatch"),
    (OutboxStatus.DEAD, FP, Action.CONFLICT, 409, None, "outbox_dead_fingerprint_match"),
    (OutboxStatus.DEAD, OTHER, Action.CONFLICT, 409, None, "outbox_dead_fingerprint_mismatch"),
    (OutboxStatus.ABORTED, FP, Action.CONFLICT, 409, None, "outbox_aborted_fingerprint_match"),
    (OutboxStatus.ABORTED, OTHER, Action.CONFLICT, 409, None,
     "outbox_aborted_fingerprint_mismatch"),
]


def test_table_has_exactly_eleven_rows() -> None:
    assert len(TABLE) == 11


@pytest.mark.parametrize(("status", "fp", "action", "http", "body_status", "conflict"), ROWS)
def test_decide_follows_the_spec_row(
    status: OutboxStatus | None, fp: bytes, action: Action, http: int,
    body_status: str | None, conflict: str | None,
) -> None:
    prior = None if status is None else Prior(status, FP)
    outcome = decide(prior, fp)
    # ``http`` is the spec's status for the row; tests/daemon/test_responses.py checks the
    # API answers it.
    assert (outcome.action, outcome.status, outcome.conflict) == (action, body_status, conflict)


def test_done_mismatch_carries_broker_id_and_dead_match_carries_reason() -> None:
    assert decide(Prior(OutboxStatus.DONE, FP), OTHER).with_broker_id
    assert decide(Prior(OutboxStatus.DEAD, FP), FP).with_reason
    assert not decide(Prior(OutboxStatus.DEAD, FP), OTHER).with_reason
