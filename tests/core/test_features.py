"""Feature validation of spec §15.1/§15.5: what closes the link with 4010, and why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tidemesh.core import features
from tidemesh.core.features import (
    DEDUPE,
    CloseReason,
    advertise,
    close_reason_text,
    dedupe_retention_days,
    validate,
)


def _with(**params: Any) -> dict[str, Any]:
    base = advertise("retention_scoped", 14, 4096)
    base[DEDUPE]["params"].update(params)
    return base


def test_the_broker_advertisement_passes() -> None:
    assert validate(advertise("retention_scoped", 3, 4096)) is None
    assert validate(advertise("permanent", 0, 4096)) is None


@pytest.mark.parametrize(("supported", "kind"), [
    ({}, "feature_unavailable"),
    ({DEDUPE: {}}, "feature_param_invalid"),
    (_with(version=2), "feature_param_invalid"),
    (_with(request_fingerprint=False), "feature_param_invalid"),
    (_with(mode="forever"), "feature_param_invalid"),
    (_with(dedupe_retention_days="14"), "feature_param_invalid"),
    (_with(dedupe_retention_days=2), "feature_param_below_floor"),
])
def test_each_problem_has_its_kind(supported: dict[str, Any], kind: str) -> None:
    reason = validate(supported)
    assert reason is not None and (reason.kind, reason.feature) == (kind, DEDUPE)


def test_close_reason_fits_the_close_frame() -> None:
    text = close_reason_text(CloseReason("feature_param_below_floor", DEDUPE, "x" * 500))
    assert len(text.encode()) <= 123
    assert json.loads(text)["kind"] == "feature_param_below_floor"


def test_retention_days_for_the_daemon_check() -> None:
    assert dedupe_retention_days(advertise("retention_scoped", 9, 4096)) == 9
    assert dedupe_retention_days(advertise("permanent", 0, 4096)) is None


def test_negotiated_sorts_what_was_asked_into_taken_missing_and_unusable() -> None:
    supported = features.advertise("retention_scoped", 7, 4096)
    supported[features.DELIVER_BATCH] = {"params": {"version": 2}}
    asked = (*features.REQUIRED, features.DELIVER_BATCH, "no_such_feature")
    settled = features.negotiated(supported, asked)
    assert set(settled["taken"]) == set(features.REQUIRED)
    assert settled["param_invalid"] == [features.DELIVER_BATCH]
    assert settled["missing"] == ["no_such_feature"]
