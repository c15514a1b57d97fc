"""The pure accept logic: B1, the branch after the read-back, and the answer frames."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from tests.broker.conftest import LIMITS, send_frame
from tidemesh.broker.accept import (
    Branch,
    DedupeRow,
    Limits,
    answer_existing,
    branch,
    pick_queue_consumer,
    prepare,
    recipients_for,
)
from tidemesh.core.errors import InvalidRequest, PayloadTooLarge
from tidemesh.core.wire import check

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("tidemesh.schemas") / "vectors" / "fingerprint.json").read_text("utf-8")
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_broker_fingerprint_matches_vector(vector: dict[str, Any]) -> None:
    inp = dict(vector["input"])
    if isinstance(inp["to"], str):  # the CLI short form; on the wire it is always an object
        kind, _, ref = inp["to"].partition(":")
        inp["to"] = {"kind": kind, "ref": ref}
    frame = {"type": "send", "id": "x", "client_message_id": "c",
             "body_encoding": "utf8", "priority": "next", **inp}
    check(frame)
    assert prepare(frame, "M", "p" * 64, LIMITS, 1).fingerprint.hex() == vector["fingerprint"]


def _row(bmid: str, fp: bytes) -> DedupeRow:
    return DedupeRow(bmid, "H", fp, True, 5)


def test_branch_is_created_when_the_row_is_ours() -> None:
    a = prepare(send_frame("c"), "M", "p", LIMITS, 1)
    assert branch(a, _row(a.broker_message_id, a.fingerprint)) is Branch.CREATED


def test_branch_is_duplicate_on_match_and_conflict_on_mismatch() -> None:
    a = prepare(send_frame("c"), "M", "p", LIMITS, 1)
    assert answer_existing(a, _row("OTHER", a.fingerprint)).status == 200
    r = answer_existing(a, _row("OTHER", b"x" * 32))
    assert r.status == 409 and r.to_frame("i")["broker_fingerprint_prefix"] == (b"x" * 8).hex()


def test_prepare_refuses_oversize_and_bad_ids() -> None:
    with pytest.raises(PayloadTooLarge):
        prepare(send_frame("c", body="x" * 11), "M", "p", Limits(10, "permanent", 0), 1)
    with pytest.raises(InvalidRequest):
        prepare(send_frame(" c"), "M", "p", LIMITS, 1)


def test_prepare_sets_expiry_by_mode() -> None:
    assert prepare(send_frame("c"), "M", "p", LIMITS, 1).expires_at == 1 + 7 * 86_400_000
    assert prepare(send_frame("c"), "M", "p", Limits(99, "permanent", 0), 1).expires_at is None


def test_a_topic_message_gets_no_delivery_rows_a_dm_its_target() -> None:
    assert recipients_for("topic", "t", [], "X") == []
    assert recipients_for("dm", "b", ["b"], "X") == ["b"]


def test_queue_consumer_pick_is_stable() -> None:
    assert pick_queue_consumer(["b", "a"], "01J0000000000000000000000A") == pick_queue_consumer(
        ["a", "b"], "01J0000000000000000000000A")
