from __future__ import annotations

from tidemesh.cli.output import readable, text_value, when


def test_when_is_a_utc_time_not_epoch_milliseconds() -> None:
    assert when(1_800_000_000_000) == "2027-01-15 08:00:00Z"
    assert when(None) == "-"


def test_readable_turns_only_at_fields_into_times() -> None:
    row = {"id": "r1", "attempts": 3, "enqueued_at": 1_800_000_000_000, "last_error_at": None}
    assert readable(row) == {"id": "r1", "attempts": 3, "enqueued_at": "2027-01-15 08:00:00Z",
                             "last_error_at": None}


def test_text_value_never_prints_a_python_repr() -> None:
    assert text_value({"pending": 0, "done": 2}) == "pending=0, done=2"
    assert text_value(None) == "-" and text_value(True) == "yes"
