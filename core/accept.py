"""The daemon's accept table (spec §4.5.1): prior outbox state × fingerprint → outcome.

Pure: the store reads the prior row inside ``BEGIN IMMEDIATE``, calls ``decide``, and writes
only when the outcome says ``insert``. The HTTP answer is the API's to choose
(``daemon/api/responses.py``); the comments on ``Action`` say what the spec gives.
"""

from __future__ import annotations

from enum import StrEnum

from tidemesh.core.record import record


class OutboxStatus(StrEnum):
    PENDING = "pending"
    INFLIGHT = "inflight"
    DONE = "done"
    DEAD = "dead"
    ABORTED = "aborted"


class Action(StrEnum):
    INSERT = "insert"          # new row, 202 queued
    ACCEPTED = "accepted"      # existing row, 202 (queued or inflight), no mutation
    DUPLICATE = "duplicate"    # done + match: 200 duplicate, no broker call
    CONFLICT = "conflict"      # 409, final for this id


@record
class Outcome:
    action: Action
    status: str | None = None      # the 202 body's status
    conflict: str | None = None    # the 409 body's conflict code
    with_broker_id: bool = False   # 409 carries broker_message_id
    with_reason: bool = False      # 409 carries reason = last_error


@record
class Prior:
    """The existing outbox row for the id, as far as the decision needs it."""

    status: OutboxStatus
    fingerprint: bytes


def _conflict(code: str, *, broker_id: bool = False, reason: bool = False) -> Outcome:
    return Outcome(Action.CONFLICT, conflict=code, with_broker_id=broker_id, with_reason=reason)


S = OutboxStatus
TABLE: dict[tuple[OutboxStatus | None, bool], Outcome] = {
    (None, False): Outcome(Action.INSERT, status="queued"),
    (S.PENDING, True): Outcome(Action.ACCEPTED, status="queued"),
    (S.PENDING, False): _conflict("outbox_pending_fingerprint_mismatch"),
    (S.INFLIGHT, True): Outcome(Action.ACCEPTED, status="inflight"),
    (S.INFLIGHT, False): _conflict("outbox_inflight_fingerprint_mismatch"),
    (S.DONE, True): Outcome(Action.DUPLICATE, status="done"),
    (S.DONE, False): _conflict("outbox_done_fingerprint_mismatch", broker_id=True),
    (S.DEAD, True): _conflict("outbox_dead_fingerprint_match", reason=True),
    (S.DEAD, False): _conflict("outbox_dead_fingerprint_mismatch"),
    (S.ABORTED, True): _conflict("outbox_aborted_fingerprint_match"),
    (S.ABORTED, False): _conflict("outbox_aborted_fingerprint_mismatch"),
}


def decide(prior: Prior | None, fingerprint: bytes) -> Outcome:
    """Look the request up in the table; ``prior`` is None when no row holds the id."""
    if prior is None:
        return TABLE[(None, False)]
    return TABLE[(prior.status, prior.fingerprint == fingerprint)]
