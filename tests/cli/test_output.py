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


def test_printable_shows_terminal_controls_as_text() -> None:
    from tidemesh.cli.terminal import printable
    hostile = "a\x1b]0;pwned\x07\rb\x9b2J\u202ec\ud800"
    assert printable(hostile) == "a\\x1b]0;pwned\\x07\\rb\\x9b2J\\u202ec\\ud800"
    assert printable("one\ntwo\tthree") == "one\\ntwo\\tthree"
    assert printable("one\ntwo\tthree\r", lines=True) == "one\ntwo\tthree\\r"
    assert printable("ünïcode ✓ 名前") == "ünïcode ✓ 名前"


def test_json_text_is_the_same_json_without_raw_controls() -> None:
    import json

    from tidemesh.cli.terminal import json_text
    value = {"body": "x\x1b[31m\x9b\u2028\u202e\ud800 ✓"}
    text = json_text(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert not any(c in text for c in "\x1b\x9b\u2028\u202e\ud800") and "✓" in text
