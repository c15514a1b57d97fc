"""The event stream's parsing and resume decisions, without a socket."""

from __future__ import annotations

import random

from tidemesh.client.stream import Cursor, Event, Notice, Parser, Quiet, Reconnect
from tidemesh.core.backoff import Backoff


def _feed(text: str) -> list[Event | Notice]:
    parser = Parser()
    items = [parser.feed(line) for line in text.splitlines(keepends=True)]
    return [i for i in items if i is not None]


def test_parser_reads_events_and_id_less_notices_and_skips_comments() -> None:
    stream = ("retry: 2000\n: connected\n\n"
              'event: history_truncated\ndata: {"requested_after": 1, "oldest_available": 5,'
              ' "missed": 3}\n\n'
              ": keepalive\n\n"
              'id: 5\nevent: message\ndata: {"body": "hi"}\n\n'
              'id: 6\r\nevent: broker_status\r\ndata: {"state": "up"}\r\n\r\n')
    assert _feed(stream) == [
        Notice("history_truncated", {"requested_after": 1, "oldest_available": 5, "missed": 3}),
        Event(5, "message", {"body": "hi"}),
        Event(6, "broker_status", {"state": "up"}),
    ]


def test_cursor_resumes_after_the_last_event_it_passed_on() -> None:
    cursor = Cursor(3)
    assert cursor.headers()["Last-Event-ID"] == "3"
    assert cursor.admit(Event(4, "message", {})) is True
    assert cursor.headers()["Last-Event-ID"] == "4"
    assert "Last-Event-ID" not in Cursor().headers(), "no start id: only new events"


def test_cursor_never_passes_an_event_twice() -> None:
    cursor = Cursor(0)
    assert [cursor.admit(Event(i, "message", {})) for i in (1, 2, 2, 1, 3)] == [
        True, True, False, False, True]


def test_a_notice_passes_without_moving_past_any_event() -> None:
    cursor = Cursor(10)
    assert cursor.admit(Notice("history_truncated", {
        "requested_after": 10, "oldest_available": 15, "missed": 4})) is True
    assert cursor.headers()["Last-Event-ID"] == "14", "asking again would repeat the notice"
    assert cursor.admit(Event(15, "message", {})) is True


def test_after_cursor_ahead_the_rebuilt_log_is_followed_from_its_start() -> None:
    cursor = Cursor(40)
    assert cursor.admit(Notice("cursor_ahead", {
        "requested_after": 40, "last_event_id": 2, "replay_from": 1})) is True
    assert [cursor.admit(Event(i, "message", {})) for i in (1, 2, 3)] == [True, True, True]


def test_quiet_ends_after_the_limit_counted_from_the_last_item() -> None:
    now = [0.0]
    quiet = Quiet(2.0, clock=lambda: now[0])
    now[0] = 1.5
    assert not quiet.over() and quiet.wait(5.0) == 0.5
    quiet.touch()
    now[0] = 3.0
    assert quiet.remaining() == 0.5
    now[0] = 3.5
    assert quiet.over()
    assert Quiet(None).remaining() is None and not Quiet(None).over()


def test_reconnect_gives_up_only_before_the_first_connection() -> None:
    again = Reconnect(Backoff(initial_s=0.1, maximum_s=0.4, jitter=0.0), random.Random(1))
    assert again.delay() is None, "never connected: the daemon is not running"
    again.succeeded()
    assert [again.delay() for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]
    again.succeeded()
    assert again.delay() == 0.1, "a connection starts the delays over"
