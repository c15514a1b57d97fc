"""The W3C traceparent parser (version 00) and the one the daemon makes."""

from __future__ import annotations

import pytest

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.send import parse_send_request
from tidemesh.core.trace import checked_traceparent, new_traceparent, trace_id, traceparent_problem

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_version_00_traceparent_is_accepted() -> None:
    assert traceparent_problem(GOOD) is None
    assert traceparent_problem(GOOD[:-2] + "00") is None
    assert checked_traceparent(GOOD) == GOOD
    assert trace_id(GOOD) == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("bad", [
    "", "garbage", GOOD + "-extra", GOOD[:-1],
    "01" + GOOD[2:],                                   # another version
    "ff" + GOOD[2:],                                   # the forbidden version
    GOOD.upper(),                                      # hex is lowercase
    GOOD.replace("-", "_"),
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
    " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
])
def test_anything_else_is_refused_naming_the_field(bad: str) -> None:
    assert traceparent_problem(bad) is not None
    with pytest.raises(InvalidRequest) as exc:
        checked_traceparent(bad)
    assert exc.value.to_body()["error"]["field"] == "traceparent"


def test_a_non_string_is_refused() -> None:
    assert traceparent_problem(None) is not None
    assert traceparent_problem(55) is not None


def test_a_made_traceparent_is_valid_sampled_and_fresh() -> None:
    made = {new_traceparent() for _ in range(100)}
    assert len(made) == 100
    for t in made:
        assert traceparent_problem(t) is None
        assert t.endswith("-01")


def test_a_send_takes_the_header_else_the_field_else_makes_one() -> None:
    other = GOOD.replace("4bf9", "aaaa")
    data = {"to": "topic:ops", "body": "hi", "traceparent": GOOD}
    assert parse_send_request(data).traceparent == GOOD
    assert parse_send_request(data, None, other).traceparent == other
    made = parse_send_request({"to": "topic:ops", "body": "hi"}).traceparent
    assert made is not None and traceparent_problem(made) is None
    assert parse_send_request(data).to_payload()["traceparent"] == GOOD
    with pytest.raises(InvalidRequest):
        parse_send_request({"to": "topic:ops", "body": "hi", "traceparent": "nope"})
